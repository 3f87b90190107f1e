// PowerSGD behind GradientSync (sync/powersgd.h) on thread ranks: a matrix of
// rank <= r comes back whole, what is not sent stays in the error, every
// rank applies the same bits, small tensors are averaged whole, and a saved
// state resumes bit for bit.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sync/sync_checks.h"

namespace sparsecomm::testing {
namespace {

std::unique_ptr<GradientSync> powersgd(std::vector<std::string> options) {
  SchemeOptions parsed;
  for (const std::string& option : options) parsed.set(option);
  return make_gradient_sync("powersgd", parsed);
}

// A 12 x 10 matrix, a vector of 7 and a 9 x 1 column (no factors smaller
// than it: sent whole).
const std::vector<LayerSpan> kLayers = {
    {"weight", 0, 120, 12}, {"bias", 120, 7, 0}, {"column", 127, 9, 9}};
constexpr std::size_t kNumel = 136;

std::vector<float> rank_two_matrix() {
  std::vector<float> m(120);
  for (std::size_t i = 0; i < 12; ++i) {
    for (std::size_t j = 0; j < 10; ++j) {
      m[i * 10 + j] = static_cast<float>(i + 1) * 0.1f * static_cast<float>(j) -
                      0.05f * static_cast<float>(i % 3) * static_cast<float>(j % 4);
    }
  }
  return m;
}

TEST(PowerSgd, AMatrixOfRankAtMostRComesBackWhole) {
  for (const int n : {1, 3}) {
    run_thread_world(n, [&](Communicator& comm) {
      auto sync = powersgd({"rank=2"});
      std::vector<float> gradient(kNumel, 0.0f);
      const std::vector<float> m = rank_two_matrix();
      std::copy(m.begin(), m.end(), gradient.begin());
      StepContext ctx;
      ctx.layers = kLayers;
      sync->synchronize(gradient, ctx, comm);
      double worst = 0.0;
      for (std::size_t i = 0; i < m.size(); ++i) {
        worst = std::max(worst, std::fabs(double{gradient[i]} - m[i]));
      }
      EXPECT_LT(worst, 1e-4) << "n=" << n;
      for (const float e : sync->kept()) EXPECT_LT(std::fabs(e), 1e-4f);
    });
  }
}

TEST(PowerSgd, KeepsWhatItDidNotSendAndEveryRankAppliesTheSameBits) {
  constexpr int kSteps = 5;
  for (const int n : {1, 2, 4}) {
    run_thread_world(n, [&](Communicator& comm) {
      auto sync = powersgd({"rank=1"});
      std::vector<double> sent(kNumel, 0.0);   // sum over steps of the applied mean, times n
      std::vector<double> input(kNumel, 0.0);  // sum over steps of this rank's gradients
      for (int step = 0; step < kSteps; ++step) {
        std::vector<float> gradient(kNumel);
        for (std::size_t i = 0; i < kNumel; ++i) {
          gradient[i] = sync_input(comm.rank(), step, i);
          input[i] += gradient[i];
        }
        const std::vector<float> local = gradient;
        StepContext ctx;
        ctx.step = step;
        ctx.layers = kLayers;
        const StepMetrics metrics = sync->synchronize(gradient, ctx, comm);
        // 12 + 10 floats of the rank-1 factors, 7 + 9 whole.
        EXPECT_EQ(metrics.selected, 38u);
        // Every rank applies the same bits.
        const auto all = gather_all<float>(comm, gradient);
        for (const auto& other : all) EXPECT_EQ(other, gradient) << "step " << step;
        // The whole tensors: the plain mean.
        const auto locals = gather_all<float>(comm, local);
        for (std::size_t i = 120; i < kNumel; ++i) {
          double mean = 0.0;
          for (const auto& g : locals) mean += g[i];
          EXPECT_NEAR(gradient[i], mean / n, 1e-6) << i;
        }
        for (std::size_t i = 0; i < kNumel; ++i) sent[i] += double{gradient[i]} * n;
      }
      // Over the ranks: what was applied plus what is kept is what came in.
      const auto kept = gather_all<float>(comm, sync->kept());
      const auto inputs = gather_all<double>(comm, input);
      for (std::size_t i = 0; i < 120; ++i) {
        double in = 0.0;
        double held = 0.0;
        for (int r = 0; r < n; ++r) {
          in += inputs[static_cast<std::size_t>(r)][i];
          held += kept[static_cast<std::size_t>(r)][i];
        }
        EXPECT_NEAR(sent[i] + held, in, 1e-4) << "n=" << n << " element " << i;
      }
      for (std::size_t i = 120; i < kNumel; ++i) EXPECT_EQ(sync->kept()[i], 0.0f);
    });
  }
}

TEST(PowerSgd, ResumesFromASavedStateBitForBit) {
  run_thread_world(2, [](Communicator& comm) {
    auto step_with = [&](GradientSync& sync, int step) {
      std::vector<float> gradient(kNumel);
      for (std::size_t i = 0; i < kNumel; ++i) gradient[i] = sync_input(comm.rank(), step, i);
      StepContext ctx;
      ctx.step = step;
      ctx.layers = kLayers;
      sync.synchronize(gradient, ctx, comm);
      return gradient;
    };
    auto first = powersgd({"rank=2", "seed=5"});
    for (int step = 0; step < 3; ++step) step_with(*first, step);
    StateWriter writer;
    first->save(writer);
    auto second = powersgd({"rank=2", "seed=5"});
    StateReader reader(writer.bytes());
    second->load(reader);
    for (int step = 3; step < 6; ++step) {
      EXPECT_EQ(step_with(*first, step), step_with(*second, step)) << "step " << step;
    }
    auto other_rank = powersgd({"rank=3"});
    StateReader again(writer.bytes());
    EXPECT_THROW(other_rank->load(again), Error);
  });
}

TEST(PowerSgd, RefusesBadOptionsAndLayersOutsideTheGradient) {
  EXPECT_THROW(powersgd({"rank=0"}), InvalidArgument);
  EXPECT_THROW(powersgd({"density=0.1"}), InvalidArgument);
  run_thread_world(1, [](Communicator& comm) {
    auto sync = powersgd({});
    std::vector<float> gradient(10, 1.0f);
    const std::vector<LayerSpan> outside = {{"w", 4, 12, 3}};
    StepContext ctx;
    ctx.layers = outside;
    EXPECT_THROW(sync->synchronize(gradient, ctx, comm), InvalidArgument);
  });
}

}  // namespace
}  // namespace sparsecomm::testing
