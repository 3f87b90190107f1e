#pragma once
// Run directories as `sparsecomm train --out DIR` writes them:
//   config.json    the run's configuration ("method", "model", "workers",
//                  "density", ...)
//   metrics.jsonl  one JSON object per line: {"kind":"step",...} after each
//                  training step, {"kind":"eval",...} after each evaluation
//   summary.json   the final figures; absent when the run was interrupted
//   failure.json   {"failed": true, "error", "steps_completed"} when the
//                  run failed (then there is no summary.json)
// Reading them back (load_run) and the writers the trainer uses
// (write_json_atomically, append_line).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sparsecomm::report {

// One {"kind":"step"} line. A field the line lacks, or writes as null (JSON
// has no NaN/inf, so writers emit null for them), is NaN. Counts are held as
// double (exact below 2^53) so that "absent" is NaN like everywhere else.
struct StepRecord {
  std::int64_t step = 0;
  double epoch = 0, wall_s = 0, lr = 0, loss = 0;
  double compute_s = 0, selection_s = 0, exchange_s = 0, update_s = 0;
  double density_ratio = 0;  // K / k
  double imbalance = 0;
  double bytes_sent = 0, bytes_received = 0;  // this rank, this step
  double host_bytes_sent = 0;  // two levels: inside its host (absent from the line: 0)
  double residual_norm = 0;
  double selected = 0, union_size = 0, target = 0, numel = 0;
  double overlapped_s = 0;  // pipelined: selection + exchange done while backward ran
  // False for a local step inside a round (--local-steps; absent: true):
  // its K/k and imbalance are not the method's, its bytes are 0.
  bool synchronized = true;
  // The click model's tables ("embedding" in the line; 0 for other models):
  // bytes this rank sent for them, its unique rows, and the union's rows.
  double embedding_bytes_sent = 0, embedding_touched_rows = 0, embedding_union_rows = 0;
};

// One {"kind":"eval"} line; test_accuracy is a fraction in [0, 1].
struct EvalRecord {
  std::int64_t step = 0;
  double epoch = 0, wall_s = 0;
  double test_accuracy = 0, test_loss = 0, train_loss = 0;
  double test_auc = 0;  // the click model's; NaN for others
};

// Seconds spent in each phase of a step, summed over the run.
struct TimeBreakdown {
  double compute = 0, selection = 0, exchange = 0, update = 0;
};

// The figures of summary.json. Numbers that are unknown are NaN.
struct RunSummary {
  std::string method, model, backend;
  std::string sync;  // parameter-server mode: "bsp", "ssp:2", ...; "" for all-reduce
  int workers = 0;
  double epochs = 0;
  std::int64_t steps = 0;
  double test_accuracy = 0;       // last evaluation, fraction in [0, 1]
  double test_loss = 0;           // last evaluation
  double test_auc = 0;            // last evaluation (the click model; NaN for others)
  double best_test_accuracy = 0;  // best evaluation, fraction in [0, 1]
  double wall_s = 0;
  TimeBreakdown time_breakdown_s;
  double bytes_per_rank_per_step = 0;  // every synchronization of the step (the tables too)
  // Two levels (--ranks-per-host): rank 0's bytes inside its host; 0 on one
  // level, where summary.json leaves it out.
  double host_bytes_per_rank_per_step = 0;
  double density_ratio_mean = 0;
  double imbalance_mean = 0;
  double samples_per_s = 0;
};

struct RunData {
  std::filesystem::path dir;
  nlohmann::json config;  // config.json (an object)
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
  std::optional<nlohmann::json> summary_json;  // summary.json as written, if present
  // summary.json's fields; fields it lacks (all of them when there is no
  // summary.json) derived from config.json and metrics.jsonl as
  // derive_summary() does.
  RunSummary summary;
  bool summary_derived = false;        // no summary.json: `summary` is derived
  std::optional<std::string> failure;  // failure.json's error, when the run failed
  std::vector<std::string> warnings;   // e.g. a truncated last line; for the user
  // The step and eval lines as written (every field, nested ones included),
  // in the order of `steps` and `evals`; kept only when load_run is asked to.
  std::vector<nlohmann::json> step_lines, eval_lines;
};

struct LoadOptions {
  bool keep_lines = false;  // fill RunData::step_lines and eval_lines
};

// Reads the run directory `dir`. Throws InvalidArgument when `dir` does not
// exist or is not a run directory (naming the missing files), and for a
// malformed file (naming it and, for metrics.jsonl, the line number). A last
// line of metrics.jsonl that is not complete JSON (a run killed mid-write) is
// dropped with a warning in RunData::warnings. Unknown keys are ignored;
// lines of an unknown "kind" are skipped with one warning.
RunData load_run(const std::filesystem::path& dir, const LoadOptions& options = {});

// The run directory `dir` as one JSON object, what `report --format json`
// prints for the scripts: {"dir", "config", "summary" (summary.json as
// written, else the derived figures, unknown ones null), "summary_derived",
// "failure" (null unless the run failed), "warnings", "steps", "evals" (the
// metrics lines as written, read and checked as load_run reads them)}.
nlohmann::json run_json(const std::filesystem::path& dir);

// The summary computable from config.json and metrics.jsonl alone: method,
// model, backend and workers from the config; epochs and wall_s of the last
// record; steps = number of step records; last and best test accuracy, last
// test loss and AUC; the phase times summed over steps; means of bytes_sent
// (with the tables' embedding_bytes_sent), density_ratio and imbalance
// over steps (NaN values left out). samples_per_s stays NaN.
RunSummary derive_summary(const nlohmann::json& config, std::span<const StepRecord> steps,
                          std::span<const EvalRecord> evals);

// The method, with "@<sync>" in parameter-server mode ("dense@ssp:2").
std::string run_name(const RunSummary& summary);

// Labels that tell runs apart in legends: run_name(), or, when names repeat
// (or are empty), the directory name; "#<i>" is appended to any label still
// repeated.
std::vector<std::string> run_labels(std::span<const RunData> runs);

// Writes `value` (indented, newline-terminated) to a temporary file in the
// same directory and renames it over `path`, so a reader never sees a
// partial file. No fsync. Throws Error naming the file on failure.
void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& value);

// Appends `line` plus '\n' to `path` (created if missing) with one O_APPEND
// write, so a killed writer leaves at most a truncated last line. `line` must
// not contain '\n' (InvalidArgument). Throws Error naming the file on failure.
void append_line(const std::filesystem::path& path, std::string_view line);

}  // namespace sparsecomm::report
