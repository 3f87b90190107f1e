// The spike clip in front of a gradient memory (sparsify/memory.h,
// with_spike_clip). The mechanism it stops: error feedback sends what a
// loss spike's gradient did not get through over the steps after it, long
// after the spike; the replay test shows that replay with the clip off and
// its end with the clip on, through the real exchange on thread ranks.

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_message.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sync_checks.h"

namespace sparsecomm {
namespace {

using testing::sync_input;

constexpr std::size_t kNumel = 3000;

double norm_of(const std::vector<float>& x) { return std::sqrt(sum_of_squares(x)); }

std::vector<float> accumulated_copy(GradientMemory& memory) {
  const std::span<float> a = memory.accumulated();
  return {a.begin(), a.end()};
}

TEST(SpikeClip, ScalesASpikeDownToTheRatioTimesTheRunningMean) {
  auto memory = with_spike_clip(make_error_feedback(), 2.0);
  std::vector<float> g(kNumel, 1.0f);  // norm sqrt(kNumel)
  const double unit = std::sqrt(static_cast<double>(kNumel));
  for (int t = 0; t < 3; ++t) memory->accumulate(g);  // mean stays `unit`
  EXPECT_EQ(memory->clipped_steps(), 0);
  std::vector<float> before = accumulated_copy(*memory);

  std::vector<float> spike(kNumel, 10.0f);
  memory->accumulate(spike);
  EXPECT_EQ(memory->clipped_steps(), 1);
  std::vector<float> added = accumulated_copy(*memory);
  for (std::size_t i = 0; i < kNumel; ++i) added[i] -= before[i];
  EXPECT_NEAR(norm_of(added), 2.0 * unit, 1e-3 * unit);  // 2 x the mean, not 10 x

  // The mean counted the clipped norm (2 unit): 1.1 unit now, so a gradient
  // of 2 unit still enters whole, one of 2.3 unit does not.
  before = accumulated_copy(*memory);
  std::vector<float> twice(kNumel, 2.0f);
  memory->accumulate(twice);
  EXPECT_EQ(memory->clipped_steps(), 1);
  added = accumulated_copy(*memory);
  for (std::size_t i = 0; i < kNumel; ++i) EXPECT_FLOAT_EQ(added[i] - before[i], 2.0f);
  std::vector<float> more(kNumel, 2.4f);
  memory->accumulate(more);
  EXPECT_EQ(memory->clipped_steps(), 2);
}

TEST(SpikeClip, RefusesRatiosThatCannotBound) {
  for (const double ratio : {1.0, 0.5, -2.0, std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(with_spike_clip(make_error_feedback(), ratio), InvalidArgument) << ratio;
  }
  for (const char* bad : {"clip_ratio=1", "clip_ratio=0.5", "clip_ratio=-1", "clip_ratio=inf"}) {
    SchemeOptions options;
    options.set(bad);
    EXPECT_NE(testing::error_message<InvalidArgument>([&] {
                make_scheme("topk", options);
              }).find("option clip_ratio"),
              std::string::npos)
        << bad;
  }
}

// Steps 0..19 ordinary gradients, step 20 one a hundred times larger (a loss
// spike), then ordinary ones again. Returns the norm of the synchronized
// vector at every step, and the steps whose gradient was clipped.
struct ReplayRun {
  std::vector<double> synchronized_norm;
  std::int64_t clipped_steps = 0;
};

ReplayRun run_spike(const std::string& method, const std::string& clip_option) {
  constexpr int kRanks = 2;
  constexpr std::int64_t kSteps = 80, kSpike = 20;
  ReplayRun run;
  run.synchronized_norm.resize(kSteps);
  run_thread_world(kRanks, [&](Communicator& comm) {
    SchemeOptions options;
    options.set("density=0.01");
    if (!clip_option.empty()) options.set(clip_option);
    auto sync = make_gradient_sync(method, options);
    std::int64_t clipped = 0;
    for (std::int64_t t = 0; t < kSteps; ++t) {
      std::vector<float> g(kNumel);
      const float scale = t == kSpike ? 100.0f : 1.0f;
      for (std::size_t i = 0; i < kNumel; ++i) g[i] = scale * sync_input(comm.rank(), t, i);
      StepContext ctx;
      ctx.step = t;
      ctx.rank = comm.rank();
      ctx.world = comm.size();
      const StepMetrics m = sync->synchronize(g, ctx, comm);
      clipped += m.gradient_clipped ? 1 : 0;
      if (comm.rank() == 0) run.synchronized_norm[static_cast<std::size_t>(t)] = norm_of(g);
    }
    if (comm.rank() == 0) run.clipped_steps = clipped;
  });
  return run;
}

double mean_over(const std::vector<double>& x, std::size_t begin, std::size_t end) {
  return std::accumulate(x.begin() + static_cast<std::ptrdiff_t>(begin),
                         x.begin() + static_cast<std::ptrdiff_t>(end), 0.0) /
         static_cast<double>(end - begin);
}

class SpikeReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(SpikeReplay, ErrorFeedbackReplaysASpikeAndTheClipEndsIt) {
  const std::string method = GetParam();
  const ReplayRun off = run_spike(method, "clip_ratio=0");
  const ReplayRun on = run_spike(method, "");  // the default clip
  const double before_off = mean_over(off.synchronized_norm, 10, 20);
  const double before_on = mean_over(on.synchronized_norm, 10, 20);
  EXPECT_NEAR(before_on, before_off, 1e-9 * before_off) << "no clip binds before the spike";
  // Clip off: 30 to 60 steps after the spike, the vector every rank applies
  // is still many times what it was before: the spike, sent 1% at a time.
  const double replay_off = mean_over(off.synchronized_norm, 50, 80);
  EXPECT_GT(replay_off, 10.0 * before_off) << method;
  // Clip on: the spike entered at twice the running mean, and the steps
  // after it apply about what they did before.
  const double replay_on = mean_over(on.synchronized_norm, 50, 80);
  EXPECT_LT(replay_on, 2.0 * before_on) << method;
  EXPECT_EQ(off.clipped_steps, 0);
  EXPECT_GE(on.clipped_steps, 1);
}

INSTANTIATE_TEST_SUITE_P(Methods, SpikeReplay,
                         ::testing::Values("topk", "exdyna", "micro", "deft", "randomk"));

// The clip's running mean is state: a resumed copy clips where the
// uninterrupted one does, bit for bit.
TEST(SpikeClip, ResumesBitForBit) {
  run_thread_world(2, [&](Communicator& comm) {
    SchemeOptions options;
    options.set("density=0.02");
    auto straight = make_gradient_sync("topk", options);
    auto resumed = make_gradient_sync("topk", options);
    for (std::int64_t t = 0; t < 12; ++t) {
      if (t == 6) {
        StateWriter writer;
        resumed->save(writer);
        resumed = make_gradient_sync("topk", options);
        StateReader reader(writer.bytes());
        resumed->load(reader);
      }
      std::vector<float> a(kNumel);
      const float scale = t == 8 ? 50.0f : 1.0f;  // a spike after the resume
      for (std::size_t i = 0; i < kNumel; ++i) a[i] = scale * sync_input(comm.rank(), t, i);
      std::vector<float> b = a;
      StepContext ctx;
      ctx.step = t;
      ctx.rank = comm.rank();
      ctx.world = comm.size();
      const StepMetrics ma = straight->synchronize(a, ctx, comm);
      const StepMetrics mb = resumed->synchronize(b, ctx, comm);
      EXPECT_EQ(ma.gradient_clipped, t == 8) << t;
      EXPECT_EQ(mb.gradient_clipped, ma.gradient_clipped) << t;
      for (std::size_t i = 0; i < kNumel; ++i) ASSERT_EQ(a[i], b[i]) << "step " << t << " " << i;
    }
  });
}

// memory=none keeps nothing to replay, nor does density 1: no clip unless
// asked for.
TEST(SpikeClip, OffByDefaultWhereNothingIsKept) {
  const ReplayRun none = run_spike("topk", "memory=none");
  EXPECT_EQ(none.clipped_steps, 0);
  EXPECT_EQ(run_spike("topk", "density=1").clipped_steps, 0);
  EXPECT_GE(run_spike("topk", "clip_ratio=2").clipped_steps, 1);
  SchemeOptions options;
  options.set("memory=none");
  options.set("clip_ratio=3");
  EXPECT_NO_THROW(make_scheme("topk", options));
}

}  // namespace
}  // namespace sparsecomm
