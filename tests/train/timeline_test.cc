// --timeline (core/timeline.h, train/run_plan.h RankTimeline): a 4-rank
// ExDyna run writes one Chrome trace with every rank's phases, the spans of
// each thread nest, and rank 0's phase sums equal its metrics.jsonl sums.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "error_message.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/trainer.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;
using testing::short_run;

struct Span {
  double begin_us;
  double end_us;
  std::string name;
};

TEST(Timeline, AnExDynaRunTracesEveryRanksPhasesThatNestAndSumToItsMetrics) {
  const testing::ScratchDir scratch("timeline");
  TrainConfig c = short_run("exdyna", scratch.path() / "run");
  c.model = "cnn";
  c.max_steps = 12;
  c.eval_every = 6;
  c.checkpoint_every = 6;
  c.timeline = (scratch.path() / "trace.json").string();
  run_training(c);

  std::ifstream in(c.timeline);
  ASSERT_TRUE(in) << c.timeline;
  const nlohmann::json trace = nlohmann::json::parse(in);
  ASSERT_TRUE(trace.contains("traceEvents"));
  EXPECT_FALSE(fs::exists(c.timeline + ".parts")) << "the merged parts are removed";

  std::map<int, std::set<std::string>> names;                  // per rank
  std::map<std::pair<int, int>, std::vector<Span>> by_thread;  // (rank, thread)
  std::map<std::string, double> rank0_seconds;                 // span sums of rank 0
  int waits_with_peers = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    const std::string ph = e.at("ph");
    const int rank = e.at("pid");
    if (ph == "M") continue;
    names[rank].insert(e.at("name").get<std::string>());
    if (ph != "X") continue;
    const double ts = e.at("ts");
    const double dur = e.at("dur");
    ASSERT_GE(dur, 0.0);
    by_thread[{rank, e.at("tid").get<int>()}].push_back({ts, ts + dur, e.at("name")});
    if (rank == 0) rank0_seconds[e.at("name")] += dur / 1e6;
    if (e.at("cat") == "wait" && e["args"].contains("peer") && e["args"].contains("bytes")) {
      ++waits_with_peers;
    }
  }
  ASSERT_EQ(names.size(), 4u);
  for (const auto& [rank, seen] : names) {
    for (const char* phase :
         {"compute", "forward", "backward", "synchronize", "accumulate", "select", "agree finite",
          "exchange", "update", "evaluate", "checkpoint", "bytes sent", "K/k", "residual norm"}) {
      EXPECT_TRUE(seen.contains(phase)) << "rank " << rank << " lacks " << phase;
    }
  }
  EXPECT_GT(waits_with_peers, 0) << "no blocking wait named its peer and bytes";

  // Spans of one thread are disjoint or nested (1 ns of rounding).
  for (auto& [thread, spans] : by_thread) {
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return std::tie(a.begin_us, b.end_us) < std::tie(b.begin_us, a.end_us);
    });
    std::vector<const Span*> open;
    for (const Span& span : spans) {
      while (!open.empty() && open.back()->end_us <= span.begin_us + 1e-3) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(span.end_us, open.back()->end_us + 1e-3)
            << span.name << " overlaps " << open.back()->name << " without nesting (rank "
            << thread.first << ")";
      }
      open.push_back(&span);
    }
  }

  // Rank 0's metrics.jsonl against its spans: the same intervals.
  std::map<std::string, double> metrics;
  std::ifstream lines(fs::path(c.out) / "metrics.jsonl");
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json m = nlohmann::json::parse(line);
    if (m.value("kind", "") != "step") continue;
    for (const char* key :
         {"compute_s", "selection_s", "exchange_s", "update_s", "selection_collective_s"}) {
      metrics[key] += m.at(key).get<double>();
    }
  }
  const auto near = [](double spans, double sum) { return std::abs(spans - sum) <= 0.01 * sum; };
  EXPECT_PRED2(near, rank0_seconds["compute"], metrics["compute_s"]);
  // --compress update's direction before the exchange counts as update time.
  EXPECT_PRED2(near, rank0_seconds["update"] + rank0_seconds["update direction"],
               metrics["update_s"]);
  // ExDyna's threshold rounds run inside select; the metrics count them as exchange.
  EXPECT_PRED2(near, rank0_seconds["accumulate"] + rank0_seconds["select"],
               metrics["selection_s"] + metrics["selection_collective_s"]);
  EXPECT_PRED2(near, rank0_seconds["exchange"] + rank0_seconds["agree finite"],
               metrics["exchange_s"] - metrics["selection_collective_s"]);
}

// --bucket-mb: each bucket's exchange runs on the pipeline's thread, on the
// rank's timeline beside its compute.
TEST(Timeline, PipelinedBucketsGoOnTheirOwnThread) {
  const testing::ScratchDir scratch("timeline_pipelined");
  TrainConfig c = short_run("topk", scratch.path() / "run");
  c.max_steps = 4;
  c.bucket_mb = 0.0625;
  c.timeline = (scratch.path() / "trace.json").string();
  run_training(c);
  std::ifstream in(c.timeline);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<int, std::set<int>> compute_threads;
  std::map<int, std::set<int>> bucket_threads;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e.at("ph") != "X") continue;
    if (e.at("name") == "compute") compute_threads[e.at("pid")].insert(e.at("tid").get<int>());
    if (e.at("name") == "bucket exchange") {
      bucket_threads[e.at("pid")].insert(e.at("tid").get<int>());
    }
  }
  ASSERT_EQ(bucket_threads.size(), 4u);
  for (const auto& [rank, threads] : bucket_threads) {
    for (const int thread : threads) {
      EXPECT_FALSE(compute_threads[rank].contains(thread)) << "rank " << rank;
    }
  }
}

TEST(Timeline, ParameterServerModeIsRefusedNamingTheFlags) {
  const testing::ScratchDir scratch("timeline_ps");
  TrainConfig c = short_run("topk", scratch.path() / "run");
  c.servers = 1;
  c.timeline = (scratch.path() / "trace.json").string();
  const std::string message = testing::error_message([&] { run_training(c); });
  EXPECT_NE(message.find("drop --timeline or --servers"), std::string::npos) << message;
}

}  // namespace
}  // namespace sparsecomm
