// Kernel throughput against the read-pass floor on 25M heavy-tailed floats,
// on every SIMD level this CPU runs. A measurement, not a test: run
// build/tests/sparsify/kernel_timing (it takes about a minute).

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sparsify/kernels/simd.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"
#include "sparsecomm/sparsify/kernels/topk.h"
#include "sparsify/kernel_inputs.h"

namespace sparsecomm {
namespace {

struct Timing {
  double floor_ms = 0.0;  // read_pass, median
  double ms = 0.0;        // the kernel, median
  double ratio = 0.0;     // median of the per-round kernel / read_pass ratios
};

// Runs the floor (read_pass at the best level) and fn alternately `rounds`
// times: the machine's bandwidth drifts, so each ratio compares runs taken
// side by side.
template <class Fn>
Timing time_against_floor(std::span<const float> x, int rounds, Fn&& fn) {
  std::vector<double> floor_ms;
  std::vector<double> ms;
  std::vector<double> ratio;
  volatile float sink = 0.0f;
  for (int r = 0; r < rounds; ++r) {
    Stopwatch w;
    sink = sink + read_pass(x, detected_simd_level());
    floor_ms.push_back(w.seconds() * 1e3);
    w.restart();
    fn();
    ms.push_back(w.seconds() * 1e3);
    ratio.push_back(ms.back() / floor_ms.back());
  }
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(floor_ms), median(ms), median(ratio)};
}

}  // namespace
}  // namespace sparsecomm

int main() {
  using namespace sparsecomm;
  const std::size_t n = 25'000'000;
  const std::vector<float> x = heavy_tailed_vector(n, 2026);
  const int rounds = 21;
  std::printf("n = %zu floats (Student-t 3 x 1e-3), %d rounds, medians\n", n, rounds);
  auto print = [](SimdLevel level, const std::string& what, const Timing& t) {
    std::printf("%-7s %-34s %7.2f ms  floor %5.2f ms (%4.1f GB/s)  ratio %.2fx\n",
                std::string(simd_level_name(level)).c_str(), what.c_str(), t.ms, t.floor_ms,
                25e6 * 4 / t.floor_ms / 1e6, t.ratio);
  };
  for (SimdLevel level : supported_simd_levels()) {
    SparseSelection out;
    for (double density : {0.001, 0.01}) {
      const float thr = magnitude_at_rank(x, static_cast<std::size_t>(density * n));
      const Timing t = time_against_floor(x, rounds, [&] {
        out.clear();
        threshold_select(x, thr, 0, out, level);
      });
      print(level, "threshold_select c=" + std::to_string(density).substr(0, 5), t);
    }
    TopKSelector selector(level);
    for (double density : {0.001, 0.01}) {
      const auto k = static_cast<std::size_t>(density * n);
      const Timing t = time_against_floor(x, rounds, [&] {
        out.clear();
        selector.select(x, k, 0, out);
      });
      print(level,
            "TopKSelector k=" + std::to_string(density).substr(0, 5) +
                "n passes=" + std::to_string(selector.last_passes()),
            t);
    }
    volatile double sink = 0.0;
    print(level, "moments",
          time_against_floor(x, rounds, [&] { sink = sink + moments(x, level).mean; }));
    print(level, "all_finite",
          time_against_floor(x, rounds, [&] { sink = sink + (all_finite(x, level) ? 1.0 : 0.0); }));
    print(level, "count_at_least", time_against_floor(x, rounds, [&] {
            sink = sink + static_cast<double>(count_at_least(x, 0.01f, level));
          }));
  }
  return 0;
}
