#include "sparsecomm/sparsify/kernels/simd.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"
#include "sparsecomm/sparsify/kernels/simd_impl.h"

namespace sparsecomm {
namespace {

// The best level the CPU (and OS, which __builtin_cpu_supports accounts for)
// runs, ignoring any override.
SimdLevel cpu_simd_level() {
  static const SimdLevel level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      return SimdLevel::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
    return SimdLevel::kScalar;
  }();
  return level;
}

bool try_parse(std::string_view name, SimdLevel& level) {
  if (name == "scalar") {
    level = SimdLevel::kScalar;
  } else if (name == "avx2") {
    level = SimdLevel::kAvx2;
  } else if (name == "avx512") {
    level = SimdLevel::kAvx512;
  } else {
    return false;
  }
  return true;
}

}  // namespace

SimdLevel detected_simd_level() {
  // SPARSECOMM_SIMD=scalar|avx2|avx512 lowers the level (never above the
  // CPU's); an unknown value is reported once and ignored. Read once.
  static const SimdLevel level = [] {
    const SimdLevel cpu = cpu_simd_level();
    const char* env = std::getenv("SPARSECOMM_SIMD");
    if (env == nullptr || *env == '\0') return cpu;
    SimdLevel wanted = cpu;
    if (!try_parse(env, wanted)) {
      logger().warn("[simd] ignoring SPARSECOMM_SIMD='{}' (expected scalar, avx2 or avx512)",
                    env);
      return cpu;
    }
    return wanted < cpu ? wanted : cpu;
  }();
  return level;
}

std::vector<SimdLevel> supported_simd_levels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (l <= cpu_simd_level()) levels.push_back(l);
  }
  return levels;
}

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

SimdLevel parse_simd_level(std::string_view name) {
  SimdLevel level = SimdLevel::kScalar;
  if (!try_parse(name, level)) {
    throw InvalidArgument("[simd] unknown SIMD level '" + std::string(name) +
                          "' (expected scalar, avx2 or avx512)");
  }
  if (level > cpu_simd_level()) {
    throw NotSupported("[simd] this CPU does not support " + std::string(name) +
                       " (best level: " + std::string(simd_level_name(cpu_simd_level())) + ")");
  }
  return level;
}

namespace detail {

void require_simd_level(SimdLevel level, const char* component) {
  if (level > cpu_simd_level()) {
    throw NotSupported(std::string("[") + component + "] this CPU does not support SIMD level " +
                       std::string(simd_level_name(level)));
  }
}

}  // namespace detail
}  // namespace sparsecomm
