// Parameter-server mode of the trainer (`sparsecomm train --servers S`):
// BSP with dense pushes trains like the all-reduce dense trainer (same seed,
// same data order), SSP/DSSP with a straggler train and respect their bounds
// (checked on the servers' logs), sparse pushes cut bytes per push, and bad
// options fail clearly.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "error_message.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/train/evaluation.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/trainer.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

// testing::short_run with `workers` workers and `servers` servers (0: the
// all-reduce trainer with `workers` ranks), on half its samples.
TrainConfig ps_run(const std::string& method, const fs::path& out, int workers, int servers) {
  TrainConfig c = testing::short_run(method, out);
  c.workers = workers;
  c.servers = servers;
  c.train_samples = 2048;
  c.test_samples = 500;
  return c;
}

double mean_loss(const report::RunData& run, bool last, std::size_t n = 8) {
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    sum += run.steps[last ? run.steps.size() - 1 - i : i].loss;
  }
  return sum / static_cast<double>(n);
}

std::vector<nlohmann::json> read_lines(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// (The PS run evaluates deferred, the all-reduce run during training.)
TEST(PsTrain, BspDenseEqualsAllReduceDense) {
  const testing::ScratchDir scratch("ps_bsp");
  TrainConfig ps = ps_run("dense", scratch.path() / "ps", 2, 2);
  ps.sync = "bsp";
  ps.eval_deferred = true;  // evaluated after training, on the parameters of each point
  const nlohmann::json summary = run_training(ps);
  TrainConfig ar = ps_run("dense", scratch.path() / "ar", 2, 0);
  run_training(ar);

  const report::RunData a = report::load_run(ps.out);
  const report::RunData b = report::load_run(ar.out);
  ASSERT_EQ(a.steps.size(), 64u);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  EXPECT_LT(mean_loss(a, true), 0.8 * mean_loss(a, false)) << "the loss did not go down";
  // Rank 0's loss on the same batch with the same parameters, step by step.
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_NEAR(a.steps[i].loss, b.steps[i].loss, 1e-5 * (1.0 + b.steps[i].loss)) << "step " << i;
  }
  ASSERT_EQ(a.evals.size(), b.evals.size());
  for (std::size_t i = 0; i < a.evals.size(); ++i) {
    EXPECT_EQ(a.evals[i].step, b.evals[i].step);
    EXPECT_NEAR(a.evals[i].test_loss, b.evals[i].test_loss, 1e-5) << "eval " << i;
    EXPECT_NEAR(a.evals[i].test_accuracy, b.evals[i].test_accuracy, 0.005) << "eval " << i;
  }
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.5);
  EXPECT_EQ(summary.at("sync"), "bsp");
  EXPECT_EQ(summary.at("servers"), 2);
  EXPECT_EQ(summary.at("workers"), 2);
  EXPECT_EQ(summary.at("staleness_steps_max"), 0);
  EXPECT_EQ(summary.at("staleness_pushes_max"), 0);
  EXPECT_EQ(summary.at("wait_s_per_worker").size(), 2u);
  EXPECT_TRUE(fs::exists(fs::path(ps.out) / "server0.jsonl"));
  EXPECT_TRUE(fs::exists(fs::path(ps.out) / "server1.jsonl"));
}

// Staleness bound at every grant of the controller's log.
std::int64_t max_lead(const fs::path& server0) {
  std::int64_t lead = 0;
  for (const nlohmann::json& line : read_lines(server0)) {
    if (line.at("kind") != "begin") continue;
    lead = std::max(
        lead, line.at("clock").get<std::int64_t>() - line.at("min_clock").get<std::int64_t>());
  }
  return lead;
}

TEST(PsTrain, SspAndDsspWithAStragglerTrainWithinTheirBounds) {
  const testing::ScratchDir scratch("ps_ssp");
  struct Case {
    std::string sync;
    std::int64_t s, low, high;
    std::string name;
    std::int64_t bound;
  };
  for (const Case& k : {Case{"ssp", 2, 0, 0, "ssp:2", 2}, Case{"dssp", 0, 1, 3, "dssp:1:3", 3},
                        Case{"asp", 0, 0, 0, "asp", -1}}) {
    TrainConfig c = ps_run("dense", scratch.path() / k.sync, 3, 1);
    c.sync = k.sync;
    c.staleness = k.s;
    c.staleness_low = k.low;
    c.staleness_high = k.high;
    c.slowdown = {"1:3"};
    c.eval_every = 16;
    const nlohmann::json summary = run_training(c);
    const report::RunData run = report::load_run(c.out);
    ASSERT_EQ(run.steps.size(), 42u) << k.sync;
    EXPECT_LT(mean_loss(run, true), 0.8 * mean_loss(run, false)) << k.sync;
    EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.5) << k.sync;
    EXPECT_EQ(summary.at("sync"), k.name);
    EXPECT_EQ(summary.at("servers"), 1);
    EXPECT_EQ(summary.at("applied_pushes"), 3 * 42);
    const double mean = summary.at("staleness_pushes_mean").get<double>();
    const auto max = summary.at("staleness_pushes_max").get<std::int64_t>();
    EXPECT_GE(mean, 0.0) << k.sync;
    EXPECT_LE(mean, static_cast<double>(max)) << k.sync;
    EXPECT_GT(max, 0) << k.sync << ": a 3x straggler makes stale updates";
    // In steps, the unit of --staleness: the bound holds in the summary,
    // and the summary agrees with the controller's log.
    if (k.bound >= 0) {
      const auto steps_max = summary.at("staleness_steps_max").get<std::int64_t>();
      EXPECT_EQ(steps_max, max_lead(fs::path(c.out) / "server0.jsonl")) << k.sync;
      EXPECT_GT(steps_max, 0) << k.sync;
      EXPECT_LE(steps_max, k.bound) << k.sync;
      EXPECT_LE(summary.at("staleness_steps_mean").get<double>(), static_cast<double>(steps_max));
    } else {  // ASP: no step requests, so not measured
      EXPECT_TRUE(summary.at("staleness_steps_max").is_null()) << k.sync;
    }
    ASSERT_EQ(summary.at("wait_s_per_worker").size(), 3u);
    for (const auto& w : summary.at("wait_s_per_worker")) EXPECT_GE(w.get<double>(), 0.0);
    EXPECT_GT(summary.at("samples_per_s").get<double>(), 0.0);
    EXPECT_GT(summary.at("bytes_per_push").get<double>(), 0.0);
    EXPECT_GT(summary.at("bytes_per_pull").get<double>(), 0.0);
    // Evaluations every 16 steps plus the epoch ends (21, 42).
    EXPECT_EQ(run.evals.size(), 4u) << k.sync;
    if (k.bound >= 0) {
      EXPECT_LE(max_lead(fs::path(c.out) / "server0.jsonl"), k.bound) << k.sync;
    }
  }
}

// A BSP run stopped after step 20 (a checkpoint's cut) and resumed ends
// with every rank's parameters, the workers' last pull and the servers'
// shards, bit for bit those of the uninterrupted run (the servers sum a
// step's pushes in worker order), and the same evaluations; for dense
// pushes and a partition-based scheme (its sparsifier's state resumes).
TEST(PsTrain, ABspRunResumesBitForBit) {
  const testing::ScratchDir scratch("ps_resume_bsp");
  for (const std::string method : {"dense", "exdyna"}) {
    TrainConfig whole = ps_run(method, scratch.path() / (method + "-whole"), 2, 2);
    whole.sync = "bsp";
    whole.checkpoint_every = 1000;  // only the final checkpoint
    run_training(whole);
    TrainConfig half = whole;
    half.out = (scratch.path() / (method + "-half")).string();
    half.stop_at_step = 20;
    run_training(half);
    ASSERT_EQ((*latest_checkpoint(half.out))["step"], 20) << method;
    TrainConfig rest = half;
    rest.stop_at_step = 0;
    rest.out.clear();
    const nlohmann::json summary = run_training(rest, nullptr, half.out);
    EXPECT_EQ(summary.at("resumed_from_step"), 20) << method;
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(testing::checkpoint_parameters(whole.out, rank),
                testing::checkpoint_parameters(half.out, rank))
          << method << " rank " << rank;
    }
    const report::RunData a = report::load_run(whole.out);
    const report::RunData b = report::load_run(half.out);
    ASSERT_EQ(a.steps.size(), b.steps.size()) << method;
    ASSERT_EQ(a.evals.size(), b.evals.size()) << method;
    for (std::size_t i = 0; i < a.evals.size(); ++i) {
      EXPECT_EQ(a.evals[i].test_loss, b.evals[i].test_loss) << method << " eval " << i;
    }
  }
}

// An SSP run with a 3x straggler (the workers drift apart between the
// cuts), checkpointed every 10 steps, stopped after 25 and resumed: every
// push of every worker is applied on every server exactly once, by the
// servers' logs, and the summary counts them all.
TEST(PsTrain, AnSspRunResumedAppliesEveryPushExactlyOnce) {
  const testing::ScratchDir scratch("ps_resume_ssp");
  TrainConfig c = ps_run("topk", scratch.path() / "run", 3, 2);
  c.sync = "ssp";
  c.staleness = 2;
  c.slowdown = {"1:3"};
  c.checkpoint_every = 10;
  c.stop_at_step = 25;
  run_training(c);
  ASSERT_EQ((*latest_checkpoint(c.out))["step"], 25);
  TrainConfig rest = c;
  rest.stop_at_step = 0;
  rest.out.clear();
  const nlohmann::json summary = run_training(rest, nullptr, c.out);
  constexpr std::int64_t kSteps = 42;  // 2048 samples / 3 workers / 32, two epochs
  EXPECT_EQ(summary.at("applied_pushes"), 3 * kSteps * 2);
  for (const char* log : {"server0.jsonl", "server1.jsonl"}) {
    std::map<std::pair<int, std::int64_t>, int> applied;
    std::int64_t pushes = -1;
    for (const nlohmann::json& line : read_lines(fs::path(c.out) / log)) {
      if (line.at("kind") == "push") {
        ++applied[{line.at("worker").get<int>(), line.at("clock").get<std::int64_t>()}];
      } else if (line.at("kind") == "server") {
        pushes = line.at("pushes").get<std::int64_t>();
      }
    }
    EXPECT_EQ(pushes, 3 * kSteps) << log;
    EXPECT_EQ(applied.size(), static_cast<std::size_t>(3 * kSteps)) << log;
    for (int worker = 0; worker < 3; ++worker) {
      for (std::int64_t clock = 0; clock < kSteps; ++clock) {
        const auto it = applied.find({worker, clock});
        EXPECT_TRUE(it != applied.end() && it->second == 1)
            << log << ": worker " << worker << " clock " << clock << " applied "
            << (it == applied.end() ? 0 : it->second) << " times";
      }
    }
  }
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.5);
}

TEST(PsTrain, SparsePushesCutBytesPerPush) {
  const testing::ScratchDir scratch("ps_topk");
  TrainConfig dense = ps_run("dense", scratch.path() / "dense", 2, 1);
  dense.max_steps = 16;
  const nlohmann::json d = run_training(dense);
  TrainConfig topk = ps_run("topk", scratch.path() / "topk", 2, 1);
  topk.sync = "ssp";
  topk.staleness = 1;
  topk.density = 0.01;
  topk.max_steps = 16;
  const nlohmann::json t = run_training(topk);
  EXPECT_LT(t.at("bytes_per_push").get<double>() * 20, d.at("bytes_per_push").get<double>());
  EXPECT_EQ(t.at("bytes_per_pull"), d.at("bytes_per_pull"));
  // ExDyna (partition-based: the workers all-gather counts) under BSP.
  TrainConfig exdyna = ps_run("exdyna", scratch.path() / "exdyna", 2, 1);
  exdyna.density = 0.01;
  exdyna.max_steps = 16;
  const nlohmann::json e = run_training(exdyna);
  EXPECT_LT(e.at("bytes_per_push").get<double>() * 20, d.at("bytes_per_push").get<double>());
  EXPECT_EQ(e.at("applied_pushes"), 2 * 16);
}

TEST(PsTrain, RandomSlowdownSlowsOneWorkerPerStepAlikeOnEveryRank) {
  TrainConfig c;
  c.slowdown = {"random:2", "1:3"};
  const Slowdowns slow = parse_slowdowns(c);
  constexpr int kWorkers = 4;
  constexpr std::int64_t kSteps = 4000;
  std::vector<int> picked(kWorkers, 0);
  std::int64_t moves = 0;
  int last = -1;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    int slowed = -1;
    for (int w = 0; w < kWorkers; ++w) {
      const double f = slow.factor(w, kWorkers, step);
      const double fixed = w == 1 ? 3.0 : 1.0;
      ASSERT_TRUE(f == fixed || f == 2.0 * fixed) << "worker " << w << " step " << step;
      if (f == 2.0 * fixed) {
        ASSERT_EQ(slowed, -1) << "two workers drawn at step " << step;
        slowed = w;
      }
    }
    ASSERT_NE(slowed, -1) << "no worker drawn at step " << step;
    ++picked[static_cast<std::size_t>(slowed)];
    moves += slowed != last ? 1 : 0;
    last = slowed;
  }
  // Every worker is drawn about a quarter of the time, and the draw moves.
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_GT(picked[static_cast<std::size_t>(w)], kSteps / 5) << w;
    EXPECT_LT(picked[static_cast<std::size_t>(w)], kSteps * 3 / 10) << w;
  }
  EXPECT_GT(moves, kSteps / 2);
  // The draw depends on the seed only: the same config gives the same draw.
  TrainConfig other = c;
  other.seed = c.seed + 1;
  const Slowdowns again = parse_slowdowns(c);
  const Slowdowns reseeded = parse_slowdowns(other);
  int differ = 0;
  for (std::int64_t step = 0; step < 100; ++step) {
    for (int w = 0; w < kWorkers; ++w) {
      EXPECT_EQ(again.factor(w, kWorkers, step), slow.factor(w, kWorkers, step));
      differ += reseeded.factor(w, kWorkers, step) != slow.factor(w, kWorkers, step) ? 1 : 0;
    }
  }
  EXPECT_GT(differ, 0);
}

TEST(PsTrain, BadOptionsFailClearly) {
  const testing::ScratchDir scratch("ps_bad");
  auto message = [&](TrainConfig c) { return testing::error_message([&] { run_training(c); }); };
  TrainConfig c = ps_run("dense", scratch.path() / "a", 2, 0);
  c.sync = "ssp";
  EXPECT_NE(message(c).find("add --servers"), std::string::npos) << message(c);
  c = ps_run("dense", scratch.path() / "b", 2, 1);
  c.sync = "dssp";
  c.staleness_low = 3;
  c.staleness_high = 1;
  EXPECT_NE(message(c).find("s_L <= s_U"), std::string::npos) << message(c);
  c = ps_run("dense", scratch.path() / "c", 2, 1);
  c.sync = "ssp";
  c.staleness = -1;
  EXPECT_NE(message(c).find("must be >= 0"), std::string::npos) << message(c);
  c = ps_run("dense", scratch.path() / "d", 2, 1);
  c.slowdown = {"2:2"};  // rank 2 is the server
  EXPECT_NE(message(c).find("not a worker"), std::string::npos) << message(c);
  c = ps_run("exdyna", scratch.path() / "e", 2, 1);
  c.sync = "ssp";
  EXPECT_NE(message(c).find("use --sync bsp"), std::string::npos) << message(c);
  c = ps_run("skipreduce", scratch.path() / "e2", 2, 1);
  EXPECT_NE(message(c).find("skipreduce is not a push method: it compresses inside an all-reduce"),
            std::string::npos)
      << message(c);
  c = ps_run("qsgd", scratch.path() / "e4", 2, 1);
  EXPECT_NE(message(c).find("qsgd sends every coordinate and compresses through its value codec"),
            std::string::npos)
      << message(c);
  c = ps_run("powersgd", scratch.path() / "e3", 2, 1);
  EXPECT_NE(message(c).find("the summed P is orthonormalized before each worker's Q"),
            std::string::npos)
      << message(c);
  c = ps_run("demo", scratch.path() / "e5", 2, 1);
  EXPECT_NE(message(c).find("demo is not a push method"), std::string::npos) << message(c);
  c = ps_run("dense", scratch.path() / "f", 2, 1);
  c.sync = "gossip";
  EXPECT_NE(message(c).find("bsp, asp, ssp, dssp"), std::string::npos) << message(c);
  c = ps_run("dense", scratch.path() / "g", 2, 10'000'000);
  EXPECT_NE(message(c).find("more servers than"), std::string::npos) << message(c);
  c = ps_run("dense", scratch.path() / "i", 2, 1);
  c.slowdown = {"0:0.5"};
  EXPECT_NE(message(c).find("must be >= 1"), std::string::npos) << message(c);
  c.slowdown = {"random:0.5"};
  EXPECT_NE(message(c).find("must be >= 1"), std::string::npos) << message(c);
  c.slowdown = {"random:2", "random:3"};
  EXPECT_NE(message(c).find("random:FACTOR is given twice"), std::string::npos) << message(c);
  c.slowdown = {"slowest:2"};
  EXPECT_NE(message(c).find("or random:FACTOR"), std::string::npos) << message(c);
  // An --out that holds a run: say how to resume it.
  c = ps_run("dense", scratch.path() / "taken", 2, 1);
  fs::create_directories(c.out);
  std::ofstream(fs::path(c.out) / "metrics.jsonl") << "{}\n";
  const std::string taken = message(c);
  EXPECT_NE(taken.find("already holds a run"), std::string::npos) << taken;
  EXPECT_NE(taken.find("--resume"), std::string::npos) << taken;

  // The new fields round-trip through config.json.
  TrainConfig full = ps_run("topk", scratch.path() / "j", 3, 2);
  full.sync = "dssp";
  full.staleness_low = 1;
  full.staleness_high = 4;
  full.slowdown = {"1:2"};
  TrainConfig back;
  update_from_json(back, to_json(full), "test");
  EXPECT_EQ(to_json(back), to_json(full));
  EXPECT_EQ(back.servers, 2);
  EXPECT_EQ(back.slowdown, std::vector<std::string>{"1:2"});
  EXPECT_EQ(sync_model_name(back), "dssp:1:4");
}

// Rank 0 evaluates alone in parameter-server mode. An evaluation (here made
// to take 2.5 s) longer than the communication timeout (1 s) must not look
// like a dead rank to the workers waiting for rank 0's pushes under BSP:
// the run completes with every evaluation recorded.
TEST(PsTrain, ASlowEvaluationIsNotMistakenForADeadRank) {
  const testing::ScratchDir scratch("ps_slow_eval");
  TrainConfig c = ps_run("dense", scratch.path() / "run", 2, 1);
  c.sync = "bsp";
  c.epochs = 1;
  c.eval_every = 8;  // evaluations at steps 8, 16, 24 and 32 (the end)
  c.timeout_s = 1.0;
  set_evaluation_hook([] { std::this_thread::sleep_for(std::chrono::milliseconds(2500)); });
  const std::string error = testing::error_message([&] { run_training(c); });
  set_evaluation_hook(nullptr);
  EXPECT_EQ(error, "") << "a slow evaluation ended the run";
  const report::RunData run = report::load_run(c.out);
  EXPECT_EQ(run.steps.size(), 32u);
  ASSERT_EQ(run.evals.size(), 4u);
  for (std::size_t i = 0; i < run.evals.size(); ++i) {
    EXPECT_EQ(run.evals[i].step, static_cast<std::int64_t>(8 * (i + 1)));
  }
}

// summary.json gathers every worker's phase times, in both trainers: a
// worker slowed tenfold computes longer and, since the step is synchronous,
// the other worker spends that difference waiting in its exchange.
TEST(PsTrain, EveryWorkersPhaseTimesReachTheSummary) {
  const testing::ScratchDir scratch("phase_times");
  for (const int servers : {0, 1}) {
    TrainConfig c = ps_run("dense", scratch.path() / fmt::format("s{}", servers), 2, servers);
    if (servers > 0) c.sync = "bsp";
    c.epochs = 1;
    c.slowdown = {"1:10"};
    const nlohmann::json summary = run_training(c);
    const nlohmann::json& means = summary.at("per_worker_mean_s");
    ASSERT_EQ(means.at("compute").size(), 2u) << servers;  // the workers only, no server
    ASSERT_EQ(means.at("exchange").size(), 2u) << servers;
    const double compute0 = means["compute"][0], compute1 = means["compute"][1];
    const double exchange0 = means["exchange"][0], exchange1 = means["exchange"][1];
    EXPECT_GT(compute1, 2 * compute0) << servers;
    EXPECT_GT(exchange0, exchange1) << servers << ": the fast worker did not wait";
    EXPECT_GT(summary.at("compute_spread_s").get<double>(), 0.0) << servers;
    EXPECT_GT(summary.at("arrival_wait_s").get<double>(), 0.0) << servers;
    EXPECT_EQ(summary.at("phase_times_skipped_steps"), 3) << servers;  // the warm-up
  }
}

// An evaluation that fails on its background thread ends the run with its
// error (on rank 0's next step), not with a hang or a silent gap.
TEST(PsTrain, AFailedBackgroundEvaluationEndsTheRunWithItsError) {
  const testing::ScratchDir scratch("ps_failed_eval");
  TrainConfig c = ps_run("dense", scratch.path() / "run", 2, 1);
  c.sync = "bsp";
  c.epochs = 1;
  c.eval_every = 8;
  set_evaluation_hook([] { throw Error("injected evaluation failure"); });
  const std::string error = testing::error_message([&] { run_training(c); });
  set_evaluation_hook(nullptr);
  EXPECT_NE(error.find("injected evaluation failure"), std::string::npos) << error;
}

}  // namespace
}  // namespace sparsecomm
