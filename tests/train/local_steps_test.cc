// --local-steps (optim/outer_loop.h in the trainer): rounds of local steps,
// the pseudo-gradient synchronized through the method, the outer step.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_message.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/trainer.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

using testing::short_run;

// H = 1, an outer learning rate of 1 and no outer momentum over plain SGD is
// synchronous training: the same parameters up to the order of rounding
// (the ranks average lr * g instead of g).
TEST(LocalSteps, OneLocalStepWithAPlainOuterStepIsSynchronousTraining) {
  const testing::ScratchDir scratch("local_one");
  TrainConfig sync = short_run("dense", scratch.path() / "sync");
  sync.deterministic = true;
  sync.max_steps = 24;
  sync.momentum = 0.0;
  sync.nesterov = false;
  sync.checkpoint_every = 1000;
  TrainConfig local = sync;
  local.out = (scratch.path() / "local").string();
  local.local_steps = 1;
  local.outer_lr = 1.0;
  local.outer_momentum = 0.0;
  local.outer_nesterov = false;
  run_training(sync);
  run_training(local);
  const std::vector<float> a = testing::checkpoint_parameters(sync.out, 0);
  const std::vector<float> b = testing::checkpoint_parameters(local.out, 0);
  ASSERT_EQ(a.size(), b.size());
  float largest = 0.0f, moved = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i) {
    largest = std::max(largest, std::abs(a[i] - b[i]));
  }
  const std::vector<float> start = [&] {
    TrainConfig none = sync;
    none.out = (scratch.path() / "none").string();
    none.max_steps = 1;
    run_training(none);
    return testing::checkpoint_parameters(none.out, 0);
  }();
  for (std::size_t i = 0; i < a.size(); ++i) moved = std::max(moved, std::abs(a[i] - start[i]));
  EXPECT_LT(largest, 1e-5f) << "synchronous and one-local-step training differ";
  EXPECT_GT(moved, 1e-2f) << "the runs hardly trained: the comparison says nothing";
}

// A round of 5 local steps sends nothing until its last step; the run's last
// step closes the last (shorter) round, so every rank ends on the same
// parameters; the evaluation inside a round reads the anchor.
TEST(LocalSteps, RoundsSendAtTheirEndAndTheRunEndsInAgreement) {
  const testing::ScratchDir scratch("local_rounds");
  TrainConfig c = short_run("topk", scratch.path() / "run");
  c.local_steps = 5;
  c.checkpoint_every = 1000;
  const nlohmann::json summary = run_training(c);
  const report::RunData run = report::load_run(c.out);
  ASSERT_EQ(run.steps.size(), 64u);
  int rounds = 0;
  for (const report::StepRecord& s : run.steps) {
    const bool round_end = (s.step + 1) % 5 == 0 || s.step == 63;
    EXPECT_EQ(s.synchronized, round_end) << "step " << s.step;
    EXPECT_EQ(s.bytes_sent > 0, round_end) << "step " << s.step;
    rounds += round_end ? 1 : 0;
  }
  ASSERT_EQ(rounds, 13);
  // K/k is averaged over the rounds (Top-k's union over 4 ranks: above 1),
  // not diluted by the inner steps' empty records (it would be about a fifth).
  EXPECT_GT(summary.at("density_ratio_mean").get<double>(), 1.0);
  EXPECT_GT(run.summary.density_ratio_mean, 1.0);
  const std::vector<float> rank0 = testing::checkpoint_parameters(c.out, 0);
  for (int rank = 1; rank < c.workers; ++rank) {
    EXPECT_EQ(testing::checkpoint_parameters(c.out, rank), rank0) << "rank " << rank;
  }
  ASSERT_EQ(run.evals.size(), 2u);  // step 32 (inside a round: the anchor) and 64
  EXPECT_GT(run.evals.front().test_accuracy, 0.5);
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.6);
}

// Train's outer step with DiLoCo's Nesterov momentum (the default is the
// plain average, which keeps no momentum).
void use_diloco_outer_step(TrainConfig& c) {
  c.outer_lr = 0.7;
  c.outer_momentum = 0.9;
  c.outer_nesterov = true;
}

// A checkpoint inside a round holds the anchor, the outer momentum and each
// rank's own parameters: the resumed run ends bit-identical.
TEST(LocalSteps, ResumingInsideARoundIsExact) {
  const testing::ScratchDir scratch("local_resume");
  TrainConfig whole = short_run("topk", scratch.path() / "whole");
  whole.local_steps = 4;
  use_diloco_outer_step(whole);
  TrainConfig half = whole;
  half.out = (scratch.path() / "half").string();
  testing::expect_resume_matches_uninterrupted(whole, half, 30, "local steps");
}

// --outer-overlap: a round's exchange runs during the next round and lands
// at its end, so the first round's end sends and receives nothing it
// reports, every later round's end reports the exchange that arrived, and
// the run's last step adds its own round's exchange: the ranks end on the
// same parameters, and every round's bytes are counted once.
TEST(LocalSteps, OverlappedRoundsLandOneRoundLateAndEndInAgreement) {
  const testing::ScratchDir scratch("local_overlap");
  TrainConfig c = short_run("topk", scratch.path() / "overlap");
  c.local_steps = 5;
  c.outer_overlap = true;
  c.checkpoint_every = 1000;
  const nlohmann::json summary = run_training(c);
  TrainConfig plain = c;
  plain.outer_overlap = false;
  plain.out = (scratch.path() / "plain").string();
  run_training(plain);
  const report::RunData run = report::load_run(c.out);
  const report::RunData reference = report::load_run(plain.out);
  ASSERT_EQ(run.steps.size(), 64u);
  double bytes = 0.0, reference_bytes = 0.0;
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    const report::StepRecord& s = run.steps[i];
    const bool round_end = (s.step + 1) % 5 == 0 || s.step == 63;
    EXPECT_EQ(s.synchronized, round_end && s.step != 4) << "step " << s.step;
    EXPECT_EQ(s.bytes_sent > 0, round_end && s.step != 4) << "step " << s.step;
    bytes += s.bytes_sent;
    reference_bytes += reference.steps[i].bytes_sent;
  }
  // Top-k's bytes depend on the drifts (the union), which differ from the
  // synchronous run's: the same number of exchanges, about the same bytes.
  EXPECT_NEAR(bytes / reference_bytes, 1.0, 0.2);
  const std::vector<float> rank0 = testing::checkpoint_parameters(c.out, 0);
  for (int rank = 1; rank < c.workers; ++rank) {
    EXPECT_EQ(testing::checkpoint_parameters(c.out, rank), rank0) << "rank " << rank;
  }
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.6);
}

// A checkpoint inside a round with the previous round's mean pending (step
// 27: the exchange begun at step 24's end) resumes bit-identical.
TEST(LocalSteps, ResumingWithAnOverlappedExchangePendingIsExact) {
  const testing::ScratchDir scratch("local_overlap_resume");
  TrainConfig whole = short_run("topk", scratch.path() / "whole");
  whole.local_steps = 5;
  whole.outer_overlap = true;
  use_diloco_outer_step(whole);
  TrainConfig half = whole;
  half.out = (scratch.path() / "half").string();
  testing::expect_resume_matches_uninterrupted(whole, half, 27, "overlapped local steps");
}

// With local steps a sparsifier keeps error feedback under AdamW (EF21's
// per-step estimate means nothing for a pseudo-gradient) and the spike clip
// is off unless asked for (a pseudo-gradient's norm follows the schedule).
TEST(LocalSteps, MethodDefaultsFollowThePseudoGradient) {
  TrainConfig c;
  c.method = "topk";
  c.optimizer = "adamw";
  EXPECT_EQ(effective_method_options(c).at("memory"), "ef21");
  EXPECT_EQ(effective_method_options(c).count("clip_ratio"), 0u);
  c.local_steps = 16;
  EXPECT_EQ(effective_method_options(c).count("memory"), 0u);
  EXPECT_EQ(effective_method_options(c).at("clip_ratio"), "0");
  c.method_options["clip_ratio"] = "3";
  EXPECT_EQ(effective_method_options(c).at("clip_ratio"), "3");
  c.method = "dense";  // takes no clip
  c.method_options.clear();
  EXPECT_EQ(effective_method_options(c).count("clip_ratio"), 0u);
}

TEST(LocalSteps, WhatDoesNotCombineIsRefused) {
  const testing::ScratchDir scratch("local_bad");
  const auto refusal = [&](TrainConfig c) {
    return testing::error_message([&] { run_training(c); });
  };
  TrainConfig c = short_run("topk", scratch.path() / "a");
  c.outer_lr = 0.5;
  EXPECT_NE(refusal(c).find("add it, or drop them"), std::string::npos);
  c.local_steps = 8;
  c.bucket_mb = 1.0;
  EXPECT_NE(refusal(c).find("do not combine with --bucket-mb"), std::string::npos);
  c.bucket_mb = 0.0;
  c.outer_momentum = 1.0;
  EXPECT_NE(refusal(c).find("--outer-momentum"), std::string::npos);
  c = short_run("dgc", scratch.path() / "b");
  c.local_steps = 8;
  EXPECT_NE(refusal(c).find("-o memory=ef"), std::string::npos);
  c = short_run("topk", scratch.path() / "c");
  c.local_steps = -2;
  EXPECT_NE(refusal(c).find("--local-steps"), std::string::npos);
  c = short_run("topk", scratch.path() / "d");
  c.outer_overlap = true;
  EXPECT_NE(refusal(c).find("--outer-overlap set the outer step of --local-steps H"),
            std::string::npos);
}

}  // namespace
}  // namespace sparsecomm
