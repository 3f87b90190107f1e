// --ranks-per-host in the trainer (sync/two_level.h): a run on hosts of two
// ranks trains, sends fewer bytes per rank between hosts than the flat run,
// keeps every rank's parameters equal, resumes bit for bit, and what does
// not combine with it is refused naming the flag.

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_message.h"
#include "sparsecomm/report/compare_table.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/trainer.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

using testing::short_run;

double mean_bytes_sent(const std::string& run_dir) {
  const report::RunData run = report::load_run(run_dir);
  double sum = 0.0;
  for (const report::StepRecord& step : run.steps) sum += step.bytes_sent;
  return sum / static_cast<double>(run.steps.size());
}

TEST(TwoLevelTraining, HostsOfTwoRanksTrainWithFewerBytesBetweenHosts) {
  const testing::ScratchDir scratch("two_level");
  TrainConfig flat = short_run("exdyna", scratch.path() / "flat");
  flat.epochs = 1;
  flat.checkpoint_every = 1000;
  TrainConfig hosts = flat;
  hosts.ranks_per_host = 2;
  hosts.out = (scratch.path() / "hosts").string();
  run_training(flat);
  run_training(hosts);
  const report::RunData run = report::load_run(hosts.out);
  ASSERT_FALSE(run.evals.empty());
  EXPECT_GT(run.evals.back().test_accuracy, 0.6);
  // Rank 0 leads a host: it exchanges with one other leader instead of
  // three ranks.
  EXPECT_LT(mean_bytes_sent(hosts.out), 0.8 * mean_bytes_sent(flat.out));
  // The summary gives the bytes inside the host beside them (two levels only).
  EXPECT_GT(run.summary.host_bytes_per_rank_per_step, 0.0);
  EXPECT_EQ(report::load_run(flat.out).summary.host_bytes_per_rank_per_step, 0.0);
  EXPECT_NE(report::format_run_summary(run).find("inside its host"), std::string::npos);
  const std::vector<float> first = testing::checkpoint_parameters(hosts.out, 0);
  for (int rank = 1; rank < hosts.workers; ++rank) {
    EXPECT_EQ(testing::checkpoint_parameters(hosts.out, rank), first) << "rank " << rank;
  }
}

TEST(TwoLevelTraining, AResumedRunEndsBitIdentical) {
  const testing::ScratchDir scratch("two_level_resume");
  TrainConfig whole = short_run("exdyna", scratch.path() / "whole");
  whole.ranks_per_host = 2;
  whole.max_steps = 24;
  TrainConfig half = whole;
  half.out = (scratch.path() / "half").string();
  testing::expect_resume_matches_uninterrupted(whole, half, 10, "two levels");
}

TEST(TwoLevelTraining, WhatDoesNotCombineIsRefused) {
  const testing::ScratchDir scratch("two_level_bad");
  const auto refusal = [&](TrainConfig c) {
    return testing::error_message([&] { run_training(c); });
  };
  TrainConfig c = short_run("topk", scratch.path() / "a");
  c.ranks_per_host = 3;
  EXPECT_NE(refusal(c).find("3 ranks per host do not divide the 4 ranks"), std::string::npos)
      << refusal(c);
  c.ranks_per_host = -1;
  EXPECT_NE(refusal(c).find("--ranks-per-host"), std::string::npos) << refusal(c);
  c.ranks_per_host = 2;
  c.servers = 2;
  EXPECT_NE(refusal(c).find("drop --servers or --ranks-per-host"), std::string::npos) << refusal(c);
  c.servers = 0;
  c.local_steps = 4;
  c.outer_overlap = true;
  EXPECT_NE(refusal(c).find("--outer-overlap"), std::string::npos) << refusal(c);
}

}  // namespace
}  // namespace sparsecomm
