#pragma once
// Helpers of the trainer tests (scratch directories: scratch_dir.h), a short run's
// configuration, reading the parameters out of a checkpoint payload, and
// runs stopped and resumed.

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "scratch_dir.h"

#include "sparsecomm/core/state_io.h"
#include "sparsecomm/core/stop_request.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/train/checkpoint.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/trainer.h"

namespace sparsecomm::testing {

// A short run on the first 4096 training and 1000 test samples of
// Fashion-MNIST: the MLP on 4 thread ranks, 2 epochs of batch 32, lr 0.05,
// density 0.05 for the sparse methods, no plots.
inline TrainConfig short_run(const std::string& method, const std::filesystem::path& out) {
  TrainConfig c;
  c.backend = "thread";
  c.workers = 4;
  c.model = "mlp";
  c.train_samples = 4096;
  c.test_samples = 1000;
  c.method = method;
  c.density = 0.05;
  c.epochs = 2;
  c.batch = 32;
  c.lr = 0.05;
  c.out = out.string();
  c.plots = false;
  return c;
}

// The flat parameters saved in one rank's checkpoint payload (its layout:
// see RankTrainer::save_checkpoint in src/sparsecomm/train/allreduce_trainer.cc).
inline std::vector<float> parameters_of_checkpoint(std::span<const std::byte> payload) {
  StateReader reader(payload);
  reader.expect_tag("sparsecomm-checkpoint");
  reader.value<std::uint32_t>();  // version
  reader.string();                // fingerprint
  reader.value<std::int64_t>();   // step
  reader.value<double>();         // wall time
  return reader.array<float>();
}

// The flat parameters of rank `rank` in the latest checkpoint of `run_dir`.
inline std::vector<float> checkpoint_parameters(const std::filesystem::path& run_dir, int rank) {
  const auto latest = latest_checkpoint(run_dir);
  EXPECT_TRUE(latest.has_value());
  const auto bytes = read_rank_checkpoint(run_dir, (*latest)["step"].get<std::int64_t>(), rank);
  return parameters_of_checkpoint(bytes);
}

// Runs `whole` uninterrupted (checkpoint at the end only) and `half` (the
// same run in another directory) stopped after `stop_at` steps and resumed;
// expects every rank's final parameters bit for bit equal.
inline void expect_resume_matches_uninterrupted(TrainConfig whole, TrainConfig half,
                                                std::int64_t stop_at, const std::string& label) {
  whole.checkpoint_every = 1000;
  run_training(whole);
  half.stop_at_step = stop_at;
  run_training(half);
  ASSERT_EQ((*latest_checkpoint(half.out))["step"], stop_at) << label;
  TrainConfig rest = half;
  rest.stop_at_step = 0;
  rest.checkpoint_every = 1000;
  rest.out.clear();
  run_training(rest, nullptr, half.out);
  for (int rank = 0; rank < whole.workers; ++rank) {
    EXPECT_EQ(checkpoint_parameters(whole.out, rank), checkpoint_parameters(half.out, rank))
        << label << " rank " << rank;
  }
}

// A learnable fortune file in `directory`: `records` records, each a run of
// the alphabet from a pseudo-random letter (drawn from `seed`), so most
// characters follow from the one before.
inline void write_alphabet_corpus(const std::filesystem::path& directory, int records,
                                  std::uint32_t seed) {
  std::filesystem::create_directories(directory);
  std::ofstream out(directory / "alphabet");
  std::uint32_t state = seed;
  for (int record = 0; record < records; ++record) {
    state = state * 1664525u + 1013904223u;
    const std::uint32_t first = (state >> 8) % 26;
    const std::uint32_t length = 20 + (state >> 16) % 40;
    for (std::uint32_t i = 0; i < length; ++i) out << static_cast<char>('a' + (first + i) % 26);
    out << "\n%\n";
  }
}

// Runs `config` for `steps` steps while recording its gradients into
// `trace`; returns the trace's meta.json.
inline nlohmann::json record_trace(TrainConfig config, const std::filesystem::path& trace,
                                   std::int64_t steps) {
  config.max_steps = steps;
  config.record_gradients = trace.string();
  config.record_steps = steps;
  run_training(config);
  std::ifstream meta(trace / "meta.json");
  return nlohmann::json::parse(meta);
}

// Requests a stop (as a signal handler does: it only records it) while
// rank 0 trains step `at`; the request ends with the observer, so that no
// later run in the process stops.
class StopDuringStep : public TrainObserver {
 public:
  explicit StopDuringStep(std::int64_t at) : at_(at) {}
  ~StopDuringStep() override { clear_stop_request(); }
  StopDuringStep(const StopDuringStep&) = delete;
  StopDuringStep& operator=(const StopDuringStep&) = delete;
  void on_step(const TrainStep& step) override {
    if (step.step == at_) request_stop(SIGTERM);
  }

 private:
  std::int64_t at_;
};

// Trains `config` (checkpoint at the end only) with a stop requested during
// step `request_at`; expects the ranks to stop after step `expected_stop`
// with a checkpoint there and summary.json saying so, and the resumed run
// to end with every rank's parameters bit for bit those of `whole` (the
// same run uninterrupted). Returns the summaries of the uninterrupted and
// of the resumed run.
inline std::pair<nlohmann::json, nlohmann::json> expect_stop_resumes_bit_for_bit(
    TrainConfig whole, TrainConfig config, std::int64_t request_at, std::int64_t expected_stop) {
  whole.checkpoint_every = 1000;
  config.checkpoint_every = 1000;
  const nlohmann::json whole_summary = run_training(whole);
  nlohmann::json summary;
  {
    StopDuringStep observer(request_at);
    summary = run_training(config, &observer);
  }
  EXPECT_TRUE(summary.contains("stopped")) << summary.dump();
  if (!summary.contains("stopped")) return {};
  const nlohmann::json stopped = summary.at("stopped");
  EXPECT_EQ(stopped.at("reason"), "SIGTERM");
  EXPECT_EQ(stopped.at("step"), expected_stop);
  EXPECT_EQ(stopped.at("resume"), "sparsecomm train --resume " + config.out);
  EXPECT_EQ((*latest_checkpoint(config.out))["step"], expected_stop);
  EXPECT_EQ(report::load_run(config.out).steps.size(), static_cast<std::size_t>(expected_stop));
  EXPECT_EQ(nlohmann::json::parse(
                std::ifstream(std::filesystem::path(config.out) / "summary.json"))["stopped"],
            stopped);

  TrainConfig rest = config;
  rest.out.clear();
  const nlohmann::json resumed = run_training(rest, nullptr, config.out);
  EXPECT_FALSE(resumed.contains("stopped"));
  for (int rank = 0; rank < whole.workers; ++rank) {
    EXPECT_EQ(checkpoint_parameters(whole.out, rank), checkpoint_parameters(config.out, rank))
        << "rank " << rank;
  }
  EXPECT_EQ(report::load_run(config.out).steps.size(), report::load_run(whole.out).steps.size());
  return {whole_summary, resumed};
}

}  // namespace sparsecomm::testing
