// The performance model on two levels (Scenario::ranks_per_host,
// docs/algorithms/two-level.md): the method priced among one leader per
// host, the host's all-reduce and broadcast on the link inside it.

#include <string>

#include <gtest/gtest.h>

#include "error_message.h"
#include "sparsecomm/perf/collective_cost.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/perf/step_model.h"

namespace sparsecomm::perf {
namespace {

using testing::error_message;

Scenario cnn_like(int ranks) {
  Scenario s;
  s.ranks = ranks;
  s.numel = 1e6;
  s.density = 0.01;
  s.compute_s = 0.02;
  return s;
}

TEST(TwoLevelModel, OneRankPerHostIsFlatAndOneHostSendsNothingBetweenHosts) {
  const CostProfile slow = network_profile(0.1, 100.0);
  const CostProfile fast = network_profile(100.0, 2.0);
  for (const std::string method : {"dense", "skipreduce", "topk", "exdyna"}) {
    Scenario s = cnn_like(16);
    const StepPrediction flat = predict_step(method, s, slow);
    s.host_link = &fast;
    s.ranks_per_host = 1;
    const StepPrediction same = predict_step(method, s, slow);
    EXPECT_EQ(flat.step_s, same.step_s) << method;
    EXPECT_EQ(same.host_s, 0.0) << method;
    s.ranks_per_host = 16;
    const StepPrediction one_host = predict_step(method, s, slow);
    EXPECT_EQ(one_host.bytes_sent, 0.0) << method;
    EXPECT_GT(one_host.host_s, 0.0) << method;
    EXPECT_LT(one_host.step_s, flat.step_s) << method;
  }
}

TEST(TwoLevelModel, TheMethodRunsAmongTheLeadersAfterTheHostsAllreduce) {
  const CostProfile slow = network_profile(0.1, 100.0);
  const CostProfile fast = network_profile(100.0, 2.0);
  Scenario s = cnn_like(32);
  s.ranks_per_host = 8;
  s.host_link = &fast;
  Scenario leaders = cnn_like(4);
  for (const std::string method : {"dense", "topk", "exdyna"}) {
    const StepPrediction two = predict_step(method, s, slow);
    const StepPrediction among_leaders = predict_step(method, leaders, slow);
    const double inside = ring_allreduce(fast, 8, 4e6).seconds + broadcast(fast, 8, 4e6).seconds;
    EXPECT_NEAR(two.host_s, inside, 1e-12) << method;
    // Between hosts: the 4 leaders' exchange, and their bytes.
    EXPECT_NEAR(two.exchange_s - two.host_s, among_leaders.exchange_s, 1e-9) << method;
    EXPECT_EQ(two.bytes_sent, among_leaders.bytes_sent) << method;
  }
  // Top-k's all-gather grows with the ranks that exchange: hosts, not ranks.
  EXPECT_LT(predict_step("topk", s, slow).bytes_sent,
            0.25 * predict_step("topk", cnn_like(32), slow).bytes_sent);
}

TEST(TwoLevelModel, ABadTopologyOrThePsIsRefused) {
  const CostProfile slow = network_profile(1.0, 10.0);
  Scenario s = cnn_like(12);
  s.ranks_per_host = 8;
  EXPECT_NE(error_message([&] {
              predict_step("dense", s, slow);
            }).find("8 ranks per host do not divide 12 ranks"),
            std::string::npos);
  s.ranks_per_host = 4;
  EXPECT_NE(error_message([&] { predict_step("ps", s, slow); }).find("ps runs on one level"),
            std::string::npos);
}

}  // namespace
}  // namespace sparsecomm::perf
