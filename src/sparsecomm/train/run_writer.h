#pragma once
// The run directory of `sparsecomm train` (no LibTorch):
//   config.json    the TrainConfig (reproduces the run)
//   metrics.jsonl  one line per step ({"kind":"step"}) and per evaluation
//                  ({"kind":"eval"}); see sparsecomm/report/run_files.h
//   summary.json   the final figures (written atomically at the end)
//   failure.json   instead of summary.json when the run failed: the error
//                  and the steps completed before it
// Used by rank 0 only.

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "sparsecomm/report/run_files.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/train_records.h"

namespace sparsecomm {

// K/k and imbalance are judged from this step on (the density controller's
// and the balancer's settling phase; docs/algorithms.md, "Density control"),
// in the per-epoch lines and in summary.json, when the run has that many
// steps; shorter runs are judged on every step.
constexpr std::int64_t kSettleSteps = 100;

class RunWriter {
 public:
  // New run: creates `dir`; refuses a directory that already holds a run
  // (its metrics would be lost) with an error that says what to do.
  // Resumed run (resume_step >= 0): keeps the records of steps before
  // resume_step (and evaluations up to it), drops later ones (they are
  // redone), removes failure.json, and continues appending.
  RunWriter(std::filesystem::path dir, const TrainConfig& config, std::int64_t resume_step = -1);

  void write_step(const TrainStep& step);
  void write_eval(const TrainEval& eval);
  // Computes, writes and returns summary.json; the keys of `extra` (an
  // object) are added to it.
  nlohmann::json finish(const RunInfo& info, double wall_s,
                        const nlohmann::json& extra = nlohmann::json::object());
  // Records that the run failed with `error` (failure.json:
  // {"failed": true, "error", "steps_completed"}). Never throws: it runs
  // while another error unwinds; a failure to write is logged.
  void write_failure(const std::string& error) noexcept;

  const std::filesystem::path& dir() const { return dir_; }
  // Wall seconds of the kept records (a resumed run's clock starts there).
  double resumed_wall_s() const { return resumed_wall_s_; }

 private:
  std::filesystem::path dir_;
  std::filesystem::path metrics_path_;
  TrainConfig config_;
  double resumed_wall_s_ = 0.0;
  std::int64_t steps_completed_ = 0;  // records in metrics.jsonl (kept + new)
};

// One {"kind":"step"} / {"kind":"eval"} line of metrics.jsonl.
nlohmann::json step_json(const TrainStep& step);
nlohmann::json eval_json(const TrainEval& eval);

}  // namespace sparsecomm
