#pragma once
// Which vector instruction set a kernel uses, picked at run time from the
// CPU's features so one binary runs everywhere. Tests and benchmarks can
// force a lower level to check every code path.

#include <string_view>
#include <vector>

namespace sparsecomm {

enum class SimdLevel { kScalar, kAvx2, kAvx512 };

// The best level this CPU supports (AVX-512 needs F, BW, VL and DQ).
SimdLevel detected_simd_level();
// Every level this CPU can run, lowest first (always includes kScalar).
std::vector<SimdLevel> supported_simd_levels();
std::string_view simd_level_name(SimdLevel level);
// "scalar", "avx2", "avx512"; InvalidArgument otherwise, or NotSupported when
// this CPU lacks it.
SimdLevel parse_simd_level(std::string_view name);

}  // namespace sparsecomm
