// Density control and partition balance of MiCRO and ExDyna on the skewed,
// drifting synthetic stream (docs/algorithms.md "Density control (the
// targets)"): d = 10^6, 300 steps while the gradient scale falls 10x, error
// feedback, union all-reduce, on the thread backend. Asserts the default
// schemes' figures. SPARSECOMM_DENSITY_TABLE=1 runs the documented table
// instead: 1,000 steps (the same 10x drift, slower), with the faithful
// scheme's figures printed beside them (not asserted).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/schemes/partitioned.h"
#include "sparsecomm/sync/sparsify_exchange_step.h"
#include "sparsecomm/traces/gradient_stream.h"

namespace sparsecomm {
namespace {

constexpr std::size_t kNumel = 1000000;
constexpr int kWarmup = 100;  // statistics over steps 100 and later

// The documented table's run (above), or the shorter one of the test suite.
bool table_run() {
  const char* value = std::getenv("SPARSECOMM_DENSITY_TABLE");
  return value != nullptr && std::string(value) == "1";
}
int stream_steps() { return table_run() ? 1000 : 300; }

struct RunFigures {
  double mean = 0;       // mean(K/k)
  double bias = 0;       // |mean(K/k) - 1|
  double p95_error = 0;  // p95 of |K/k - 1|
  double imbalance = 0;  // mean load imbalance
};

RunFigures run_scheme(const char* scheme, int n, double density, const GradientStream& stream,
                      const std::vector<std::string>& extra = {}) {
  std::vector<double> ratios;
  std::vector<double> imbalances;
  run_thread_world(n, [&](Communicator& comm) {
    SchemeOptions options;
    options.set("density", std::to_string(density));
    for (const std::string& option : extra) options.set(option);
    SchemeParts parts;
    parts.sparsifier = make_partitioned_sparsifier(partitioned_options_from(scheme, options));
    parts.memory = make_error_feedback();
    parts.exchange = ExchangePattern::kUnionAllreduce;
    SparsifyExchangeStep sync(std::move(parts));
    std::vector<float> gradient(kNumel);
    for (int step = 0; step < stream_steps(); ++step) {
      stream.fill(comm.rank(), step, gradient);
      StepContext ctx{step, 0.0, comm.rank(), n, stream.layers()};
      const StepMetrics metrics = sync.synchronize(gradient, ctx, comm);
      if (comm.rank() == 0 && step >= kWarmup) {
        ratios.push_back(metrics.density_ratio);
        imbalances.push_back(metrics.imbalance);
      }
    }
  });
  RunFigures figures;
  double sum = 0;
  std::vector<double> errors;
  for (double r : ratios) {
    sum += r;
    errors.push_back(std::fabs(r - 1.0));
  }
  figures.mean = sum / static_cast<double>(ratios.size());
  figures.bias = std::fabs(figures.mean - 1.0);
  std::sort(errors.begin(), errors.end());
  figures.p95_error =
      errors[static_cast<std::size_t>(0.95 * static_cast<double>(errors.size() - 1))];
  double imbalance = 0;
  for (double v : imbalances) imbalance += v;
  figures.imbalance = imbalance / static_cast<double>(imbalances.size());
  std::string label = scheme;
  for (const std::string& option : extra) label += " " + option;
  std::printf(
      "[density] %-30s n=%d c=%.1f%%: mean K/k %.4f, bias %.4f, p95 |K/k-1| %.4f, imbalance %.4f\n",
      label.c_str(), n, density * 100, figures.mean, figures.bias, figures.p95_error,
      figures.imbalance);
  return figures;
}

const GradientStream& stream() {
  static const std::unique_ptr<GradientStream> instance = [] {
    SyntheticStreamOptions options;
    options.numel = kNumel;
    options.drift_factor = 10.0;
    options.drift_steps = stream_steps();
    return make_synthetic_stream(options);
  }();
  return *instance;
}

struct DensityCase {
  int n;
  double density;
};

class DensityControl : public ::testing::TestWithParam<DensityCase> {};

// The threshold that selects the k-th largest |g| of rank 0's first gradient:
// the faithful table's starting point here, because its reference initial
// value 1/(2 sqrt k) has no relation to this stream's scale (it would start
// orders of magnitude off and never converge within the run).
double first_step_threshold(const GradientStream& source, double density) {
  std::vector<float> g(source.numel());
  source.fill(0, 0, g);
  for (float& v : g) v = std::fabs(v);
  const std::size_t k = target_count(density, g.size());
  std::nth_element(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(k - 1), g.end(),
                   std::greater<>());
  return g[k - 1];
}

// The default MiCRO and ExDyna hold the density on target on every step.
// ExDyna's cap keeps every rank at or below 1.05 k/n; per-rank quotas
// balance by construction. Without the cap (one global threshold, where the
// layout decides the balance), ExDyna's block-cyclic partitions balance
// better than MiCRO's equal contiguous ones. The faithful scheme is printed
// beside them.
TEST_P(DensityControl, DefaultSchemesHoldTheTargetAndExDynaBalances) {
  const auto [n, density] = GetParam();
  const RunFigures micro = run_scheme("micro", n, density, stream());
  const RunFigures exdyna = run_scheme("exdyna", n, density, stream());
  const RunFigures quota = run_scheme("exdyna", n, density, stream(), {"controller=quota"});
  const RunFigures global = run_scheme("exdyna", n, density, stream(), {"cap=0"});
  if (table_run()) {
    run_scheme("exdyna-faithful", n, density, stream(),
               {fmt::format("initial_threshold={:.4g}", first_step_threshold(stream(), density))});
  }
  for (const RunFigures& f : {micro, exdyna, quota, global}) {
    EXPECT_LE(f.bias, 0.02);
    EXPECT_LE(f.p95_error, 0.10);
  }
  // The cap: the busiest rank at most 1.05 k/n (+ the 1% tolerance on K).
  EXPECT_LE(exdyna.imbalance, 0.07);
  // Quotas: each rank within the 1% tolerance of k/n.
  EXPECT_LE(quota.imbalance, 0.03);
  EXPECT_LT(global.imbalance, micro.imbalance);
  // Selections per partition are counts of rare events: with K/n selected
  // per partition, Poisson noise alone gives an expected imbalance of about
  // 1.4 / sqrt(K/n) for n = 8 (E[max of 8 normals] = 1.42). The 0.10 target
  // is asserted where that floor is well below it (K/n >= 250).
  const double per_partition = density * kNumel / n;
  if (per_partition >= 250) {
    EXPECT_LE(global.imbalance, 0.10);
  } else {
    EXPECT_LE(global.imbalance, 0.10 + 1.5 / std::sqrt(per_partition));
  }
}

INSTANTIATE_TEST_SUITE_P(Stream, DensityControl,
                         ::testing::Values(DensityCase{4, 0.001}, DensityCase{4, 0.01},
                                           DensityCase{8, 0.001}, DensityCase{8, 0.01}),
                         [](const ::testing::TestParamInfo<DensityCase>& param) {
                           return fmt::format("n{}_c{}permille", param.param.n,
                                              static_cast<int>(param.param.density * 1000));
                         });

// The mechanism behind ExDyna's divergence at c = 0.1% on the CNN (K/k
// jumped from ~1 to 3.3 and 9 in two steps, the loss spiked, the residual ran
// away): a threshold predicted from earlier steps meets a step whose
// accumulated gradient is suddenly larger, and releases a large part of the
// residual at once. Here the gradient of a small model (d = 20,000, 4 ranks,
// error feedback) grows 8x at step 30. The previous-step controller's K
// jumps far above k; the same-step threshold keeps K within its tolerance of
// k on every step, the jump included.
TEST(DensityControlSpike, AGradientJumpCannotReleaseTheResidualAtOnce) {
  constexpr std::size_t kSmall = 20000;
  constexpr int kJumpStep = 30;
  const auto max_ratio = [&](const std::vector<std::string>& extra, double* jump_ratio) {
    std::vector<double> ratios(40, 0.0);
    run_thread_world(4, [&](Communicator& comm) {
      SchemeOptions options;
      options.set("density", "0.01");
      for (const std::string& option : extra) options.set(option);
      SchemeParts parts;
      parts.sparsifier = make_partitioned_sparsifier(partitioned_options_from("exdyna", options));
      parts.memory = make_error_feedback();
      parts.exchange = ExchangePattern::kUnionAllreduce;
      SparsifyExchangeStep sync(std::move(parts));
      std::vector<float> gradient(kSmall);
      const Philox rng(3);
      for (int step = 0; step < 40; ++step) {
        const double scale = step >= kJumpStep ? 8.0 : 1.0;
        for (std::size_t i = 0; i < kSmall; ++i) {
          const auto bits = rng.block(i, static_cast<std::uint64_t>(step * 8 + comm.rank()));
          const double u = (bits[0] + 0.5) / 4294967296.0;
          gradient[i] = static_cast<float>(scale * (u - 0.5) * (1.0 + static_cast<double>(i % 5)));
        }
        StepContext ctx{step, 0.0, comm.rank(), 4, {}};
        const StepMetrics m = sync.synchronize(gradient, ctx, comm);
        if (comm.rank() == 0) ratios[static_cast<std::size_t>(step)] = m.density_ratio;
      }
    });
    *jump_ratio = ratios[kJumpStep];
    double worst = 0.0;
    for (std::size_t t = 1; t < ratios.size(); ++t)
      worst = std::max(worst, std::fabs(ratios[t] - 1.0));
    return worst;
  };
  double predicted_jump = 0.0;
  max_ratio({"controller=histogram", "balancer=counts"}, &predicted_jump);
  EXPECT_GT(predicted_jump, 3.0) << "the previous-step threshold releases the residual at once";
  double exact_jump = 0.0;
  const double worst = max_ratio({}, &exact_jump);
  std::printf("[density] spike at step %d: K/k %.2f (histogram controller), %.3f (same-step)\n",
              kJumpStep, predicted_jump, exact_jump);
  EXPECT_LE(worst, 0.01 + 1.0 / 200) << "K stays within the tolerance of k = 200 on every step";
}

}  // namespace
}  // namespace sparsecomm
