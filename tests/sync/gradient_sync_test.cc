// Every synchronization method by name: dense averages exactly, Skip-Reduce
// with error feedback conserves gradient mass, options are validated.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_message.h"
#include "sparsecomm/collectives/skip_reduce.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/sync/gradient_sync.h"

namespace sparsecomm {
namespace {

using testing::error_message;

std::vector<float> gradient_of(int rank, std::int64_t step, std::size_t numel) {
  const Philox rng(99);
  std::vector<float> g(numel);
  for (std::size_t i = 0; i < numel; ++i) {
    g[i] = static_cast<float>(rng.below(2001, static_cast<std::uint64_t>(rank * 1000 + step), i)) /
               1000.0f -
           1.0f;
  }
  return g;
}

StepContext context(const Communicator& comm, std::int64_t step) {
  StepContext ctx;
  ctx.step = step;
  ctx.rank = comm.rank();
  ctx.world = comm.size();
  return ctx;
}

TEST(GradientSync, DenseIsTheExactAverageOnEveryRank) {
  constexpr std::size_t kNumel = 1001;
  run_thread_world(3, [&](Communicator& comm) {
    auto sync = make_gradient_sync("dense", SchemeOptions{});
    std::vector<float> g = gradient_of(comm.rank(), 0, kNumel);
    const StepMetrics m = sync->synchronize(g, context(comm, 0), comm);
    for (std::size_t i = 0; i < kNumel; ++i) {
      double sum = 0.0;
      for (int r = 0; r < 3; ++r) sum += gradient_of(r, 0, kNumel)[i];
      EXPECT_NEAR(g[i], sum / 3.0, 1e-6);
    }
    EXPECT_EQ(m.union_size, kNumel);
    EXPECT_DOUBLE_EQ(m.density_ratio, 1.0);
    EXPECT_GT(m.bytes_sent, 0u);
  });
}

// values=fp16 / bf16: the ring's wire in 16 bits, half dense's bytes, the
// average within the 16-bit roundings; refused with the native all-reduce.
TEST(GradientSync, DenseWithHalfValuesSendsHalfTheBytes) {
  constexpr std::size_t kNumel = 1001;
  run_thread_world(3, [&](Communicator& comm) {
    auto fp32 = make_gradient_sync("dense", SchemeOptions{});
    std::vector<float> exact = gradient_of(comm.rank(), 0, kNumel);
    const StepMetrics full = fp32->synchronize(exact, context(comm, 0), comm);
    for (const char* values : {"values=fp16", "values=bf16"}) {
      SchemeOptions options;
      options.set(values);
      auto half = make_gradient_sync("dense", options);
      std::vector<float> g = gradient_of(comm.rank(), 0, kNumel);
      const StepMetrics m = half->synchronize(g, context(comm, 0), comm);
      EXPECT_EQ(2 * m.bytes_sent, full.bytes_sent) << values;
      const double unit = std::string(values) == "values=fp16" ? 0x1p-11 : 0x1p-8;
      for (std::size_t i = 0; i < kNumel; ++i) {
        double magnitude = 0.0;
        for (int r = 0; r < 3; ++r) magnitude += std::fabs(gradient_of(r, 0, kNumel)[i]);
        EXPECT_NEAR(g[i], exact[i], 3 * unit * magnitude / 3.0) << values << " " << i;
      }
    }
  });
  SchemeOptions native;
  native.set("values=bf16");
  native.set("allreduce=native");
  EXPECT_NE(error_message<InvalidArgument>([&] {
              make_gradient_sync("dense", native);
            }).find("values=bf16 travels on our ring"),
            std::string::npos);
}

// The residual a Skip-Reduce sync saved (its state: tag, then the array).
std::vector<float> residual_of(const GradientSync& sync) {
  StateWriter writer;
  sync.save(writer);
  StateReader reader(writer.bytes());
  reader.expect_tag("skipreduce");
  return reader.array<float>();
}

// A NaN in a chunk its rank drops would enter that rank's residual unseen
// by the average: with error feedback the ranks agree on finiteness first.
// Policy skip: every rank skips the step and keeps its residual as it was;
// policy stop: every rank stops, naming the rank.
TEST(GradientSync, SkipReduceWithErrorFeedbackCatchesANaNInADroppedChunk) {
  constexpr int kWorld = 4;
  constexpr std::size_t kNumel = 4000;
  SkipReduceOptions schedule_options;
  schedule_options.skip = 2;
  schedule_options.min_elements = 0;
  schedule_options.step = 1;
  const SkipSchedule schedule = skip_reduce_schedule(kWorld, kNumel, schedule_options);
  std::size_t poisoned = kNumel;  // an element of a chunk rank 1 drops at step 1
  for (const SkipChunk& chunk : schedule.chunks) {
    if (chunk.dropped(1, kWorld) && chunk.end > chunk.begin) poisoned = chunk.begin;
  }
  ASSERT_LT(poisoned, kNumel);
  for (const NonFinitePolicy policy : {NonFinitePolicy::kSkip, NonFinitePolicy::kStop}) {
    run_thread_world(kWorld, [&](Communicator& comm) {
      SchemeOptions options;
      options.set("memory=ef");
      options.set("min_elements=0");
      options.set("skip=2");
      auto sync = make_gradient_sync("skipreduce", options, policy);
      std::vector<float> g = gradient_of(comm.rank(), 0, kNumel);
      sync->synchronize(g, context(comm, 0), comm);
      const std::vector<float> residual = residual_of(*sync);
      g = gradient_of(comm.rank(), 1, kNumel);
      if (comm.rank() == 1) g[poisoned] = std::nanf("");
      if (policy == NonFinitePolicy::kStop) {
        const std::string message =
            error_message<NonFiniteGradient>([&] { sync->synchronize(g, context(comm, 1), comm); });
        EXPECT_NE(message.find("rank(s) 1"), std::string::npos) << message;
        return;
      }
      const StepMetrics m = sync->synchronize(g, context(comm, 1), comm);
      EXPECT_TRUE(m.skipped_nonfinite);
      EXPECT_EQ(residual_of(*sync), residual) << "rank " << comm.rank();
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
      // The next step goes on with finite values.
      g = gradient_of(comm.rank(), 2, kNumel);
      EXPECT_FALSE(sync->synchronize(g, context(comm, 2), comm).skipped_nonfinite);
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); }));
    });
  }
}

TEST(GradientSync, SkipReduceWithErrorFeedbackConservesGradientMass) {
  constexpr int kWorld = 4;
  constexpr std::size_t kNumel = 4000;
  std::vector<std::vector<float>> residuals(kWorld, std::vector<float>(kNumel, 0.0f));
  std::vector<std::vector<float>> outputs(kWorld);
  std::vector<double> old_mass(kNumel, 0.0);  // sum over ranks of the residuals before the step
  run_thread_world(kWorld, [&](Communicator& comm) {
    SchemeOptions options;
    options.set("memory=ef");
    options.set("min_elements=0");
    options.set("skip=2");
    auto sync = make_gradient_sync("skipreduce", options);
    for (std::int64_t step = 0; step < 3; ++step) {
      std::vector<float> g = gradient_of(comm.rank(), step, kNumel);
      const StepMetrics m = sync->synchronize(g, context(comm, step), comm);
      EXPECT_EQ(m.skip_subject, kNumel);
      EXPECT_EQ(m.selected, kNumel - kNumel / 2);  // s = 2 of 4: half of its chunks dropped
      const std::span<const float> kept = sync->kept();
      residuals[static_cast<std::size_t>(comm.rank())].assign(kept.begin(), kept.end());
      EXPECT_EQ(residual_of(*sync), residuals[static_cast<std::size_t>(comm.rank())]);
      outputs[static_cast<std::size_t>(comm.rank())] = g;
      comm.barrier();
      // n * average + all residuals = all gradients + all old residuals.
      if (comm.rank() == 0) {
        for (std::size_t i = 0; i < kNumel; i += 37) {
          double lhs = kWorld * static_cast<double>(outputs[0][i]);
          double rhs = 0.0;
          for (int r = 0; r < kWorld; ++r) {
            lhs += residuals[static_cast<std::size_t>(r)][i];
            rhs += gradient_of(r, step, kNumel)[i];
          }
          EXPECT_NEAR(lhs, rhs + old_mass[i], 1e-4) << "step " << step << " element " << i;
        }
      }
      comm.barrier();
      if (comm.rank() == 0) {
        for (std::size_t i = 0; i < kNumel; ++i) {
          double sum = 0.0;
          for (int r = 0; r < kWorld; ++r) sum += residuals[static_cast<std::size_t>(r)][i];
          old_mass[i] = sum;
        }
      }
      comm.barrier();
    }
  });
}

TEST(GradientSync, KeptIsTheResidualOfMethodsWithMemoryOnly) {
  constexpr std::size_t kNumel = 500;
  run_thread_world(2, [&](Communicator& comm) {
    SchemeOptions sparse;
    sparse.set("density=0.05");
    auto dense = make_gradient_sync("dense", SchemeOptions{});
    auto topk = make_gradient_sync("topk", sparse);
    EXPECT_TRUE(topk->kept().empty());  // before the first step
    std::vector<float> g = gradient_of(comm.rank(), 0, kNumel);
    std::vector<float> h = g;
    dense->synchronize(g, context(comm, 0), comm);
    const StepMetrics m = topk->synchronize(h, context(comm, 0), comm);
    EXPECT_TRUE(dense->kept().empty());
    ASSERT_EQ(topk->kept().size(), kNumel);
    // What this rank did not send stays behind: every nonzero element but
    // its selection (fp32 values leave nothing at the sent positions).
    std::size_t nonzero_given = 0;
    for (float v : gradient_of(comm.rank(), 0, kNumel)) nonzero_given += v != 0.0f;
    std::size_t nonzero_kept = 0;
    for (float v : topk->kept()) nonzero_kept += v != 0.0f;
    EXPECT_GT(m.selected, 0u);
    EXPECT_EQ(nonzero_kept, nonzero_given - m.selected);
  });
}

TEST(GradientSync, OptionsAndNamesAreValidated) {
  EXPECT_THROW(make_gradient_sync("nosuch", SchemeOptions{}), InvalidArgument);
  try {
    make_gradient_sync("nosuch", SchemeOptions{});
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("dense, skipreduce, powersgd, demo, topk"),
              std::string::npos);
  }
  SchemeOptions both;
  both.set("memory=ef");
  both.set("rescale=true");
  EXPECT_THROW(make_gradient_sync("skipreduce", both), InvalidArgument);
  SchemeOptions unknown;
  unknown.set("bogus=1");
  EXPECT_THROW(make_gradient_sync("dense", unknown), InvalidArgument);
  EXPECT_TRUE(make_gradient_sync("dgc", SchemeOptions{})->applies_momentum());
  EXPECT_FALSE(make_gradient_sync("topk", SchemeOptions{})->applies_momentum());
  // skip must fit the world, checked when the world is known.
  run_thread_world(2, [](Communicator& comm) {
    SchemeOptions options;
    options.set("skip=3");
    auto sync = make_gradient_sync("skipreduce", options);
    std::vector<float> g(10, 1.0f);
    EXPECT_THROW(sync->synchronize(g, context(comm, 0), comm), InvalidArgument);
  });
}

}  // namespace
}  // namespace sparsecomm
