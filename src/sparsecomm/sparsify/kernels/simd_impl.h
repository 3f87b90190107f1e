#pragma once
// Internal: the per-ISA kernel entry points behind threshold_select.h and
// estimate.h. simd_avx2.cc and simd_avx512.cc are compiled with their ISA's
// flags; everything else is baseline x86-64 and reaches them only through the
// dispatchers, after checking that the CPU supports the level.
//
// The per-ISA files use no templates or inline functions shared with other
// translation units (no std:: algorithms): the linker could otherwise keep
// their AVX-512 copy for a baseline caller.

#include <cstddef>

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/sparsify/kernels/simd.h"

namespace sparsecomm::detail {

// Extra elements a select kernel may write past the selected count.
inline constexpr std::size_t kSelectSlack = 16;

// Sums of (x[i] - shift) and (x[i] - shift)^2 over a range, in double.
struct MomentSums {
  double sum = 0.0;
  double sum_sq = 0.0;
};

// Throws NotSupported unless this CPU runs `level`.
void require_simd_level(SimdLevel level, const char* component);

// Each namespace holds one ISA's kernels, the same set (declared once below),
// all with the same contracts:
//   select: writes (base + i, x[i]) for every |x[i]| >= threshold (an ordered
//     compare: NaN never passes), i < n, to indices/values in ascending i and
//     returns the count; both outputs need room for n + kSelectSlack
//     elements. x[0, readable) may be prefetched (readable >= n). `dense`
//     picks the branch-free loop, faster once most vector rounds hold a hit.
//   count_at_least: the same count, no output.
//   compact: keeps, in place and in order, the pairs (indices[j], values[j])
//     with |values[j]| >= threshold (same compare), j < n; returns their
//     count. Writes only inside [0, n).
//   abs_sum: sum of |x| with several accumulators and software prefetch (the
//     read pass: the bandwidth floor).
//   all_finite: true when no element is NaN or infinite.
//   moment_sums: MomentSums of x around `shift`.
// scalar:: lives in threshold_select.cc and estimate.cc.
#define SPARSECOMM_DECLARE_SIMD_KERNELS                                               \
  std::size_t compact(Index* indices, float* values, std::size_t n, float threshold); \
  std::size_t select(const float* x, std::size_t n, std::size_t readable, bool dense, \
                     float threshold, Index base, Index* indices, float* values);     \
  std::size_t count_at_least(const float* x, std::size_t n, float threshold);         \
  float abs_sum(const float* x, std::size_t n);                                       \
  bool all_finite(const float* x, std::size_t n);                                     \
  MomentSums moment_sums(const float* x, std::size_t n, double shift);

namespace scalar {
SPARSECOMM_DECLARE_SIMD_KERNELS
}  // namespace scalar
namespace avx2 {
SPARSECOMM_DECLARE_SIMD_KERNELS
}  // namespace avx2
namespace avx512 {
SPARSECOMM_DECLARE_SIMD_KERNELS
}  // namespace avx512

#undef SPARSECOMM_DECLARE_SIMD_KERNELS

}  // namespace sparsecomm::detail
