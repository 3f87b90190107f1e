// The built-in statistics of the performance model: `bench sparsifiers` on
// the synthetic stream (d = 1M, 60 steps, the first 20 left out), one run
// per density c and world size n:
//
//   for c in 0.01 0.001; do for n in 2 4 8 16 32 64; do
//     build/sparsecomm bench sparsifiers -d 1000000 -c $c -n $n --steps 60
//       --warmup-steps 20 --no-torch --schemes topk,dgc,gaussiank,micro,exdyna,deft
//       --format json > DIR/c$c-n$n.json
//   done; done       (the bench command is one line)
//   scripts/scaling-table.py DIR
//
// Each entry: scheme, density, whether its ranks select independently, the
// k of the runs, then per n {n, K/k, selected ratio, imbalance, read share,
// rounds} (scheme_scaling.h). Measured 2026-11-25 on a 2-core AMD EPYC
// (Zen 4, AVX-512 path); the statistics do not depend on the machine.

#include <vector>

#include "sparsecomm/perf/scheme_scaling.h"

namespace sparsecomm::perf {
namespace {

struct Measured {
  const char* scheme;
  double density;
  bool independent;
  double k;
  std::vector<ScalingPoint> points;
};

// clang-format off
const std::vector<Measured>& measured() {
  static const std::vector<Measured> table = {
    {"deft", 0.001, false, 1000,
     {{2, 0.9995, 0.9995, 0.37, 2, 0},
      {4, 0.9996, 0.9996, 0.6651, 1.16, 0},
      {8, 0.9995, 0.9995, 0.5404, 1.08, 0},
      {16, 1, 1, 0.3872, 0.92, 0},
      {32, 1, 1, 0.1264, 0.84, 0},
      {64, 1, 1, 0.176, 0.64, 0}}},
    {"deft", 0.01, false, 10000,
     {{2, 0.9999, 0.9999, 0.1834, 2, 0},
      {4, 0.9999, 0.9999, 0.6698, 1.12, 0},
      {8, 1, 1, 0.6717, 0.96, 0},
      {16, 1, 1, 0.4695, 0.98, 0},
      {32, 0.9999, 0.9999, 0.2128, 1.02, 0},
      {64, 0.9999, 0.9999, 0.1157, 1, 0}}},
    {"dgc", 0.001, true, 1000,
     {{2, 2.024, 1.021, 0.05234, 2, 0},
      {4, 3.951, 1.013, 0.08385, 4, 0},
      {8, 7.693, 1.019, 0.1477, 8, 0},
      {16, 14.57, 1.024, 0.2109, 16, 0},
      {32, 26.03, 1.02, 0.2459, 32, 0},
      {64, 43.21, 1.016, 0.2648, 64, 0}}},
    {"dgc", 0.01, true, 10000,
     {{2, 1.963, 1.004, 0.05322, 2, 0},
      {4, 3.732, 0.9964, 0.09923, 4, 0},
      {8, 6.907, 0.9979, 0.133, 8, 0},
      {16, 12.05, 0.997, 0.1665, 16, 0},
      {32, 19.35, 0.9958, 0.1952, 32, 0},
      {64, 27.96, 1.003, 0.231, 64, 0}}},
    {"exdyna", 0.001, false, 1000,
     {{2, 1.001, 1.001, 0.026, 1, 1.77},
      {4, 1, 1, 0.046, 1, 1.48},
      {8, 0.9997, 0.9997, 0.05619, 0.9999, 1.18},
      {16, 1.001, 1.001, 0.0546, 0.9999, 1.07},
      {32, 1, 1, 0.05568, 1, 1.02},
      {64, 1.001, 1.001, 0.08685, 0.9994, 1.05}}},
    {"exdyna", 0.01, false, 10000,
     {{2, 0.9997, 0.9997, 0.007429, 1, 1.5},
      {4, 1.001, 1.001, 0.0241, 1, 1.27},
      {8, 1, 1, 0.03961, 0.9999, 1.1},
      {16, 1.001, 1.001, 0.04965, 0.9999, 1.05},
      {32, 1.001, 1.001, 0.05209, 1, 1.02},
      {64, 0.9995, 0.9995, 0.0566, 0.9994, 1}}},
    {"gaussiank", 0.001, true, 1000,
     {{2, 0.3251, 0.1676, 0.04533, 2, 0},
      {4, 0.6207, 0.1678, 0.09073, 4, 0},
      {8, 1.152, 0.168, 0.1388, 8, 0},
      {16, 2.051, 0.1681, 0.1831, 16, 0},
      {32, 3.497, 0.1687, 0.2059, 32, 0},
      {64, 5.64, 0.1689, 0.2279, 64, 0}}},
    {"gaussiank", 0.01, true, 10000,
     {{2, 0.6035, 0.3233, 0.007255, 2, 0},
      {4, 1.088, 0.3225, 0.01563, 4, 0},
      {8, 1.882, 0.3228, 0.02415, 8, 0},
      {16, 3.098, 0.3224, 0.0306, 16, 0},
      {32, 4.838, 0.3222, 0.03392, 32, 0},
      {64, 7.133, 0.3222, 0.0431, 64, 0}}},
    {"micro", 0.001, false, 1000,
     {{2, 0.9998, 0.9998, 0.3585, 1, 1.7},
      {4, 1, 1, 1.699, 1, 1.7},
      {8, 0.9995, 0.9995, 2.673, 1, 1.45},
      {16, 1, 1, 4.098, 1, 1.45},
      {32, 1.001, 1.001, 4.442, 1, 1.4},
      {64, 1.002, 1.002, 4.969, 1, 1.38}}},
    {"micro", 0.01, false, 10000,
     {{2, 0.9989, 0.9989, 0.1972, 1, 1.48},
      {4, 1.001, 1.001, 1.211, 1, 1.35},
      {8, 0.9997, 0.9997, 1.944, 1, 1.15},
      {16, 1, 1, 2.968, 1, 1.12},
      {32, 0.9996, 0.9996, 3.094, 1, 1.1},
      {64, 1.001, 1.001, 3.185, 1, 1.07}}},
    {"topk", 0.001, true, 1000,
     {{2, 1.957, 1, 0, 2, 0},
      {4, 3.769, 1, 0, 4, 0},
      {8, 7.086, 1, 0, 8, 0},
      {16, 12.82, 1, 0, 16, 0},
      {32, 22.01, 1, 0, 32, 0},
      {64, 35.21, 1, 0, 64, 0}}},
    {"topk", 0.01, true, 10000,
     {{2, 1.856, 1, 0, 2, 0},
      {4, 3.323, 1, 0, 4, 0},
      {8, 5.7, 1, 0, 8, 0},
      {16, 9.285, 1, 0, 16, 0},
      {32, 14.18, 1, 0, 32, 0},
      {64, 19.98, 1, 0, 64, 0}}},
  };
  return table;
}
// clang-format on

}  // namespace

const ScalingTable& builtin_scaling_table() {
  static const ScalingTable table = [] {
    ScalingTable out;
    for (const Measured& m : measured()) {
      out.add(m.density, SchemeScaling(m.scheme, m.independent, m.k, m.points));
    }
    return out;
  }();
  return table;
}

}  // namespace sparsecomm::perf
