// Beyond plain error feedback. AdamW around a sparsifying method: with
// --compress update nothing of the ranks' AdamW directions is lost (what the
// ranks sent plus what they keep is what they produced), and the dense steps
// before a frozen variance are exactly the dense method's, the later ones
// exactly the method's. EF21: the vector applied is the mean of the ranks'
// gradient estimates, each its gradient less what it still keeps.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/optim/update_rule.h"
#include "sparsecomm/sync/dense_warmup.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/sync/selection_step.h"
#include "sync_checks.h"

namespace sparsecomm {
namespace {

using testing::sync_input;

constexpr int kRanks = 4;
constexpr std::size_t kNumel = 3000;

StepContext context_of(const Communicator& comm, std::int64_t step) {
  StepContext ctx;
  ctx.step = step;
  ctx.rank = comm.rank();
  ctx.world = comm.size();
  return ctx;
}

SchemeOptions density(double d) {
  SchemeOptions options;
  options.set("density=" + std::to_string(d));
  return options;
}

class CompressedUpdateTest : public ::testing::TestWithParam<std::string> {};

// Per rank: residual_T + sum_t sent_t = sum_t u_t (error feedback), and the
// synchronized vector is the mean of what was sent, so
//   n * sum_t synchronized_t + sum_r residual_r,T = sum_r sum_t u_r,t.
TEST_P(CompressedUpdateTest, WhatWasSentPlusWhatIsKeptIsEveryDirection) {
  const std::string method = GetParam();
  std::vector<std::vector<double>> produced(kRanks, std::vector<double>(kNumel, 0.0));
  std::vector<std::vector<float>> kept(kRanks);
  std::vector<double> delivered(kNumel, 0.0);
  run_thread_world(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    OptimizerOptions options;
    options.name = "adamw";
    UpdateRule rule(options, Compress::kUpdate);
    auto sync = make_gradient_sync(method, density(0.01));
    for (std::int64_t t = 0; t < 12; ++t) {
      std::vector<float> g(kNumel);
      for (std::size_t i = 0; i < kNumel; ++i)
        g[i] = sync_input(r, t, i) * static_cast<float>(1 + i % 7);
      rule.before_sync(g);
      for (std::size_t i = 0; i < kNumel; ++i) {
        ASSERT_TRUE(std::isfinite(g[i]));
        produced[r][i] += g[i];
      }
      sync->synchronize(g, context_of(comm, t), comm);
      if (r == 0) {
        for (std::size_t i = 0; i < kNumel; ++i) delivered[i] += kRanks * static_cast<double>(g[i]);
      }
    }
    kept[r].assign(sync->kept().begin(), sync->kept().end());
  });
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < kNumel; ++i) {
    double all = 0.0, rest = delivered[i];
    for (int r = 0; r < kRanks; ++r) {
      all += produced[r][i];
      rest += kept[r][i];
    }
    worst = std::max(worst, std::abs(all - rest));
    scale = std::max(scale, std::abs(all));
  }
  EXPECT_LT(worst, 1e-4 * scale) << method;
  EXPECT_GT(scale, 1.0);  // AdamW's directions are of order 1: the test has something to lose
}

INSTANTIATE_TEST_SUITE_P(Methods, CompressedUpdateTest,
                         ::testing::Values("topk", "exdyna", "micro", "deft", "gaussiank"));

TEST(DenseWarmup, TheFirstStepsAreDenseAndTheRestAreTheMethods) {
  run_thread_world(kRanks, [&](Communicator& comm) {
    auto warm =
        with_dense_warmup(make_gradient_sync("topk", density(0.02)), 3, NonFinitePolicy::kStop);
    auto dense = make_gradient_sync("dense", SchemeOptions{});
    auto topk = make_gradient_sync("topk", density(0.02));
    EXPECT_EQ(warm->method(), "topk");
    for (std::int64_t t = 0; t < 7; ++t) {
      std::vector<float> g(kNumel);
      for (std::size_t i = 0; i < kNumel; ++i) g[i] = sync_input(comm.rank(), t, i);
      std::vector<float> expected = g;
      warm->synchronize(g, context_of(comm, t), comm);
      if (t < 3) {
        dense->synchronize(expected, context_of(comm, t), comm);
      } else {
        topk->synchronize(expected, context_of(comm, t - 3), comm);
      }
      EXPECT_EQ(g, expected) << "step " << t;
    }
    // The warm-up's state resumes; another length of warm-up is refused.
    StateWriter writer;
    warm->save(writer);
    auto again =
        with_dense_warmup(make_gradient_sync("topk", density(0.02)), 3, NonFinitePolicy::kStop);
    StateReader reader(writer.bytes());
    again->load(reader);
    EXPECT_EQ(std::vector<float>(again->kept().begin(), again->kept().end()),
              std::vector<float>(warm->kept().begin(), warm->kept().end()));
    auto other =
        with_dense_warmup(make_gradient_sync("topk", density(0.02)), 4, NonFinitePolicy::kStop);
    StateReader reader2(writer.bytes());
    EXPECT_THROW(other->load(reader2), Error);
  });
  EXPECT_THROW(
      with_dense_warmup(make_gradient_sync("topk", density(0.02)), -1, NonFinitePolicy::kStop),
      InvalidArgument);
}

class Ef21Test : public ::testing::TestWithParam<std::string> {};

TEST_P(Ef21Test, TheAppliedVectorIsTheMeanOfTheRanksEstimates) {
  const std::string method = GetParam();
  constexpr int kSteps = 8;
  // [step][rank]: h = g - kept after the step; the vector every rank applied.
  std::vector<std::vector<std::vector<float>>> estimates(kSteps,
                                                         std::vector<std::vector<float>>(kRanks));
  std::vector<std::vector<float>> applied(kSteps);
  run_thread_world(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    SchemeOptions options = density(0.02);
    options.set("memory=ef21");
    auto sync = make_gradient_sync(method, options);
    for (std::int64_t t = 0; t < kSteps; ++t) {
      if (t == 4) {  // a resumed copy carries on exactly
        StateWriter writer;
        sync->save(writer);
        auto resumed = make_gradient_sync(method, options);
        StateReader reader(writer.bytes());
        resumed->load(reader);
        sync = std::move(resumed);
      }
      std::vector<float> g(kNumel);
      for (std::size_t i = 0; i < kNumel; ++i) g[i] = sync_input(r, t, i);
      const std::vector<float> local = g;
      sync->synchronize(g, context_of(comm, t), comm);
      const std::span<const float> kept = sync->kept();
      ASSERT_EQ(kept.size(), kNumel);
      auto& h = estimates[static_cast<std::size_t>(t)][static_cast<std::size_t>(r)];
      h.resize(kNumel);
      for (std::size_t i = 0; i < kNumel; ++i) h[i] = local[i] - kept[i];
      if (r == 0) applied[static_cast<std::size_t>(t)] = g;
    }
  });
  std::vector<std::size_t> filled(kSteps, 0);
  for (std::size_t t = 0; t < kSteps; ++t) {
    for (std::size_t i = 0; i < kNumel; ++i) {
      double mean = 0.0;
      for (int r = 0; r < kRanks; ++r) mean += estimates[t][static_cast<std::size_t>(r)][i];
      mean /= kRanks;
      ASSERT_NEAR(applied[t][i], mean, 1e-5) << method << " step " << t << " element " << i;
      filled[t] += applied[t][i] != 0.0f ? 1 : 0;
    }
  }
  // The estimate fills in: later steps add their selections to the earlier ones.
  EXPECT_GT(filled.back(), filled.front()) << method;
}

INSTANTIATE_TEST_SUITE_P(Methods, Ef21Test, ::testing::Values("topk", "exdyna", "deft"));

// At density 1 every difference is sent: the estimate is the gradient, and
// the applied vector is the dense mean.
TEST(Ef21, AtDensityOneAppliesTheMeanGradient) {
  run_thread_world(kRanks, [&](Communicator& comm) {
    SchemeOptions options = density(1.0);
    options.set("memory=ef21");
    auto sync = make_gradient_sync("topk", options);
    auto dense = make_gradient_sync("dense", SchemeOptions{});
    for (std::int64_t t = 0; t < 3; ++t) {
      std::vector<float> g(kNumel);
      for (std::size_t i = 0; i < kNumel; ++i) g[i] = sync_input(comm.rank(), t, i);
      std::vector<float> expected = g;
      sync->synchronize(g, context_of(comm, t), comm);
      dense->synchronize(expected, context_of(comm, t), comm);
      for (std::size_t i = 0; i < kNumel; ++i) ASSERT_NEAR(g[i], expected[i], 1e-6) << i;
    }
  });
  // A selection without the exchange cannot finish the estimate.
  SchemeOptions options = density(0.1);
  options.set("memory=ef21");
  EXPECT_THROW(SelectionStep(make_scheme("topk", options), NonFinitePolicy::kStop),
               InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm
