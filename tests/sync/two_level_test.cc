// Two-level synchronization (sync/two_level.h) on thread ranks grouped into
// hosts: dense gives the flat average, every scheme's error feedback is exact
// over both levels and every exchange pattern with the residual kept once per
// host, a non-finite gradient on any rank skips or stops every rank, and a
// resumed run goes on bit for bit.

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_message.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/sync/two_level.h"
#include "sync_checks.h"

namespace sparsecomm {
namespace {

using testing::error_message;
using testing::sync_input;

constexpr std::chrono::milliseconds kTimeout{20000};

std::unique_ptr<GradientSync> two_level(std::string_view method,
                                        const std::map<std::string, std::string>& options,
                                        int ranks_per_host,
                                        NonFinitePolicy policy = NonFinitePolicy::kStop) {
  return with_two_levels(make_gradient_sync(method, SchemeOptions(options), policy),
                         HostTopology{ranks_per_host});
}

void fill(std::vector<float>& gradient, int rank, std::int64_t step) {
  for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] = sync_input(rank, step, i);
}

TEST(TwoLevel, DenseIsTheFlatAverageOnEveryRank) {
  for (const std::pair<int, int>& shape : {std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3}}) {
    const int hosts = shape.first;
    const int per_host = shape.second;
    const int world = hosts * per_host;
    run_thread_world(
        world,
        [&](Communicator& comm) {
          auto sync = two_level("dense", {}, per_host);
          constexpr std::size_t kNumel = 1001;
          std::vector<float> gradient(kNumel);
          for (std::int64_t step = 0; step < 2; ++step) {
            fill(gradient, comm.rank(), step);
            StepContext ctx;
            ctx.step = step;
            const StepMetrics metrics = sync->synchronize(gradient, ctx, comm);
            // Inside the host: its ring all-reduce, 2 (R-1)/R of the buffer
            // (one rank per host: nothing), and the leader's broadcast.
            EXPECT_EQ(metrics.host_bytes_sent > 0, per_host > 1);
            EXPECT_GE(metrics.host_bytes_sent, 2 * (per_host - 1) * kNumel * 4 / per_host / 2);
            EXPECT_EQ(metrics.bytes_sent > 0, comm.rank() % per_host == 0 && hosts > 1)
                << "rank " << comm.rank() << ": bytes between hosts";
            double worst = 0.0;
            for (std::size_t i = 0; i < kNumel; ++i) {
              double mean = 0.0;
              for (int r = 0; r < world; ++r) mean += sync_input(r, step, i);
              worst = std::max(worst, std::abs(mean / world - gradient[i]));
            }
            EXPECT_LT(worst, 1e-6) << hosts << " hosts x " << per_host;
            // The same bits on every rank.
            std::vector<float> first(gradient);
            comm.broadcast(std::as_writable_bytes(std::span<float>(first)), 0);
            EXPECT_EQ(first, gradient) << "rank " << comm.rank();
          }
        },
        kTimeout);
  }
}

// What the hosts sent plus what their leaders kept is every rank's gradient:
// H * sum_t average_t + sum_h residual_h == (1/R) sum_t sum_r g_{r,t}.
// Every scheme, over every exchange pattern it accepts.
TEST(TwoLevel, ErrorFeedbackIsExactOverBothLevelsForEverySchemeAndPattern) {
  constexpr int kHosts = 3;
  constexpr int kPerHost = 2;
  constexpr std::size_t kNumel = 1000;
  constexpr std::int64_t kSteps = 4;
  for (const SchemeInfo& scheme : scheme_registry()) {
    for (const std::string& exchange : exchange_choices(scheme.traits)) {
      std::map<std::string, std::string> options{{"memory", "ef"}, {"exchange", exchange}};
      if (scheme.name == "threshold") options["lambda"] = "0.8";
      // ok-topk and the sparse all-reduce sum values on the way: fp32 ones.
      if (exchange == "ok-topk" || exchange == "sparse-allreduce") options["values"] = "fp32";
      SCOPED_TRACE(scheme.name + " exchange=" + exchange);
      run_thread_world(
          kHosts * kPerHost,
          [&](Communicator& comm) {
            auto sync = two_level(scheme.name, options, kPerHost);
            std::vector<float> gradient(kNumel);
            std::vector<double> applied(kNumel, 0.0);
            std::vector<double> sent_in(kNumel, 0.0);
            for (std::int64_t step = 0; step < kSteps; ++step) {
              fill(gradient, comm.rank(), step);
              StepContext ctx;
              ctx.step = step;
              sync->synchronize(gradient, ctx, comm);
              for (std::size_t i = 0; i < kNumel; ++i) {
                applied[i] += gradient[i];
                for (int r = 0; r < comm.size(); ++r) sent_in[i] += sync_input(r, step, i);
              }
            }
            const bool leader = comm.rank() % kPerHost == 0;
            const std::span<const float> kept = sync->kept();
            EXPECT_EQ(kept.size(), leader ? kNumel : 0u)
                << scheme.name << ": rank " << comm.rank() << " keeps a residual";
            std::vector<float> residuals(kNumel, 0.0f);
            if (leader && kept.size() == kNumel)
              std::copy(kept.begin(), kept.end(), residuals.begin());
            allreduce(comm, std::span<float>(residuals));
            double worst = 0.0;
            for (std::size_t i = 0; i < kNumel; ++i) {
              const double left = kHosts * applied[i] + residuals[i];
              worst = std::max(worst, std::abs(left - sent_in[i] / kPerHost));
            }
            EXPECT_LT(worst, 1e-4) << scheme.name << ": rank " << comm.rank();
          },
          kTimeout);
    }
  }
}

TEST(TwoLevel, ANonFiniteGradientOnAnyRankSkipsOrStopsEveryRank) {
  for (const NonFinitePolicy policy : {NonFinitePolicy::kSkip, NonFinitePolicy::kStop}) {
    run_thread_world(
        4,
        [&](Communicator& comm) {
          auto sync = two_level("topk", {{"density", "0.1"}}, 2, policy);
          std::vector<float> gradient(100);
          fill(gradient, comm.rank(), 0);
          if (comm.rank() == 3) gradient[17] = std::nanf("");  // not a leader
          StepContext ctx;
          if (policy == NonFinitePolicy::kStop) {
            EXPECT_THROW(sync->synchronize(gradient, ctx, comm), NonFiniteGradient)
                << "rank " << comm.rank();
            return;
          }
          const StepMetrics metrics = sync->synchronize(gradient, ctx, comm);
          EXPECT_TRUE(metrics.skipped_nonfinite) << "rank " << comm.rank();
          for (const float value : gradient) ASSERT_EQ(value, 0.0f);
        },
        kTimeout);
  }
}

TEST(TwoLevel, ResumingGoesOnBitForBit) {
  run_thread_world(
      4,
      [&](Communicator& comm) {
        std::vector<float> gradient(500);
        auto step = [&](GradientSync& sync, std::int64_t at) {
          fill(gradient, comm.rank(), at);
          StepContext ctx;
          ctx.step = at;
          sync.synchronize(gradient, ctx, comm);
          return gradient;
        };
        auto straight = two_level("exdyna", {{"density", "0.05"}}, 2);
        std::vector<float> expected;
        for (std::int64_t at = 0; at < 4; ++at) expected = step(*straight, at);

        auto first = two_level("exdyna", {{"density", "0.05"}}, 2);
        step(*first, 0);
        step(*first, 1);
        StateWriter writer;
        first->save(writer);
        auto resumed = two_level("exdyna", {{"density", "0.05"}}, 2);
        StateReader reader(writer.bytes());
        resumed->load(reader);
        step(*resumed, 2);
        EXPECT_EQ(step(*resumed, 3), expected) << "rank " << comm.rank();

        auto other = two_level("exdyna", {{"density", "0.05"}}, 4);
        StateReader again(writer.bytes());
        EXPECT_NE(error_message([&] { other->load(again); }).find("2 ranks per host"),
                  std::string::npos);
      },
      kTimeout);
}

// --ranks-per-host auto: R consecutive ranks per host from the hosts'
// names; placements that are not are refused naming the first rank off.
TEST(TwoLevel, TheHostsNamesGiveTheTopologyOrARefusal) {
  EXPECT_EQ(topology_of_hosts(std::vector<int>{0, 0, 1, 1, 2, 2}).ranks_per_host, 2);
  EXPECT_EQ(topology_of_hosts(std::vector<int>{0, 1, 2}).ranks_per_host, 1);
  EXPECT_EQ(topology_of_hosts(std::vector<int>{0, 0, 0}).ranks_per_host, 3);
  const std::string scattered = error_message([] {
    topology_of_hosts(std::vector<int>{0, 1, 0, 1});
  });
  EXPECT_NE(scattered.find("do not place 2 consecutive ranks on each host, as rank 0's host has "
                           "(rank 1 is on host 2 of 2)"),
            std::string::npos)
      << scattered;
  EXPECT_NE(scattered.find("--map-by slot"), std::string::npos) << scattered;
  const std::string uneven = error_message([] {
    topology_of_hosts(std::vector<int>{0, 0, 1, 1, 2});
  });
  EXPECT_NE(uneven.find("(rank 4 is on host 3 of 3)"), std::string::npos) << uneven;
  EXPECT_THROW(topology_of_hosts(std::vector<int>{0, 0, 1, 1, 1, 1}), InvalidArgument);
  // Thread ranks share a process: one host of every rank.
  run_thread_world(
      3,
      [](Communicator& comm) {
        EXPECT_EQ(resolve_host_topology(kDetectRanksPerHost, comm).ranks_per_host, 3);
        EXPECT_EQ(resolve_host_topology(1, comm).ranks_per_host, 1);
        EXPECT_THROW(resolve_host_topology(2, comm), InvalidArgument);
      },
      kTimeout);
}

TEST(TwoLevel, RanksPerHostMustDivideTheWorld) {
  run_thread_world(
      6,
      [&](Communicator& comm) {
        auto sync = two_level("dense", {}, 4);
        std::vector<float> gradient(10, 1.0f);
        const std::string message =
            error_message([&] { sync->synchronize(gradient, StepContext{}, comm); });
        EXPECT_NE(message.find("4 ranks per host do not divide the world of 6"), std::string::npos)
            << message;
      },
      kTimeout);
  EXPECT_NE(error_message([] { two_level("dense", {}, 0); }).find("0 ranks per host"),
            std::string::npos);
}

}  // namespace
}  // namespace sparsecomm
