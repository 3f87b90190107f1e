#include "sparsecomm/train/run_writer.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/atomic_file.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/json_numbers.h"
#include "sparsecomm/core/log.h"
#include "sparsecomm/report/statistics.h"
#include "sparsecomm/sync/load_balance.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

}  // namespace

nlohmann::json step_json(const TrainStep& s) {
  const StepMetrics& m = s.sync;
  nlohmann::json line = {{"kind", "step"},
                         {"step", s.step},
                         {"epoch", json_number(s.epoch)},
                         {"wall_s", json_number(s.wall_s)},
                         {"lr", json_number(s.lr)},
                         {"loss", json_number(s.loss)},
                         {"compute_s", json_number(s.compute_s)},
                         {"selection_s", json_number(s.selection_s)},
                         {"exchange_s", json_number(s.exchange_s)},
                         {"agreement_s", json_number(m.agreement_s)},
                         {"selection_collective_s", json_number(m.selection_collective_s)},
                         {"selection_collectives", m.selection_collectives},
                         {"candidate_passes", m.candidate_passes},
                         {"update_s", json_number(s.update_s)},
                         {"wait_s", json_number(s.wait_s)},
                         {"density_ratio", json_number(m.density_ratio)},
                         {"imbalance", json_number(m.imbalance)},
                         {"bytes_sent", m.bytes_sent},
                         {"bytes_received", m.bytes_received},
                         {"residual_norm", json_number(m.residual_norm)},
                         {"gradient_norm", json_number(m.gradient_norm)},
                         {"selected", m.selected},
                         {"union_size", m.union_size},
                         {"target", m.target},
                         {"numel", m.numel},
                         {"index_bytes_raw", m.index_bytes_raw},
                         {"index_bytes_encoded", m.index_bytes_encoded},
                         {"value_bits", json_number(m.value_bits)},
                         {"skip_subject", m.skip_subject},
                         {"dense_numel", m.dense_numel},
                         {"overlapped_s", json_number(m.overlapped_s)},
                         {"gradient_clipped", m.gradient_clipped},
                         {"skipped_nonfinite", m.skipped_nonfinite},
                         {"synchronized", s.synchronized}};
  if (m.host_bytes_sent > 0 || m.host_bytes_received > 0) {  // two levels only
    line["host_bytes_sent"] = m.host_bytes_sent;
    line["host_bytes_received"] = m.host_bytes_received;
  }
  if (s.embedding.present) {
    const EmbeddingStep& e = s.embedding;
    line["embedding"] = {{"exchange", e.exchange},
                         {"touched_rows", e.touched_rows},
                         {"table_touched", e.table_touched},
                         {"union_rows", e.union_rows},
                         {"bytes_sent", e.bytes_sent},
                         {"bytes_received", e.bytes_received},
                         {"exchange_s", json_number(e.exchange_s)},
                         {"update_s", json_number(e.update_s)}};
  }
  return line;
}

nlohmann::json eval_json(const TrainEval& e) {
  nlohmann::json line = {{"kind", "eval"},
                         {"step", e.step},
                         {"epoch", json_number(e.epoch)},
                         {"wall_s", json_number(e.wall_s)},
                         {"test_accuracy", json_number(e.test_accuracy)},
                         {"test_loss", json_number(e.test_loss)},
                         {"train_loss", json_number(e.train_loss)}};
  if (std::isfinite(e.test_auc)) line["test_auc"] = e.test_auc;
  return line;
}

RunWriter::RunWriter(fs::path dir, const TrainConfig& config, std::int64_t resume_step)
    : dir_(std::move(dir)), metrics_path_(dir_ / "metrics.jsonl"), config_(config) {
  std::error_code error;
  if (resume_step < 0) {
    if (fs::exists(metrics_path_)) {
      const std::string what_to_do =
          fs::exists(dir_ / "failure.json")
              ? fmt::format(
                    "that run failed (see its failure.json): choose another --out or "
                    "delete {}",
                    dir_.string())
              : fmt::format("pass --resume {} to continue it, or choose another --out",
                            dir_.string());
      throw InvalidArgument(
          fmt::format("the output directory {} already holds a run (metrics.jsonl); {}",
                      dir_.string(), what_to_do));
    }
    fs::create_directories(dir_, error);
    if (error) {
      throw InvalidArgument(
          fmt::format("cannot create the output directory {}: {}", dir_.string(), error.message()));
    }
    std::ofstream touch(metrics_path_);  // an empty file marks the directory as a run
    if (!touch) throw Error(fmt::format("cannot write {}", metrics_path_.string()));
  } else {
    // Keep what happened before the checkpoint, drop what will be redone.
    std::ifstream in(metrics_path_);
    std::string kept;
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json record =
          nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_discarded() || !record.is_object() || !record.contains("step")) continue;
      const std::int64_t step = record.value("step", std::int64_t{0});
      const bool is_eval = record.value("kind", "") == "eval";
      if (is_eval ? step > resume_step : step >= resume_step) continue;
      resumed_wall_s_ = std::max(resumed_wall_s_, record.value("wall_s", 0.0));
      kept += line;
      kept += '\n';
    }
    atomic_write(metrics_path_, kept);
    steps_completed_ = resume_step;
    // The run goes on: an earlier failure's or stop's record no longer
    // describes it (summary.json is written again at the end).
    fs::remove(dir_ / "failure.json", error);
    fs::remove(dir_ / "summary.json", error);
  }
  report::write_json_atomically(dir_ / "config.json", to_json(config_));
}

void RunWriter::write_step(const TrainStep& step) {
  report::append_line(metrics_path_, step_json(step).dump());
  steps_completed_ = step.step + 1;
}

void RunWriter::write_failure(const std::string& error) noexcept {
  try {
    report::write_json_atomically(
        dir_ / "failure.json",
        {{"failed", true}, {"error", error}, {"steps_completed", steps_completed_}});
  } catch (const std::exception& e) {
    logger().warn("could not record the failure in {}: {}", dir_.string(), e.what());
  }
}

void RunWriter::write_eval(const TrainEval& eval) {
  report::append_line(metrics_path_, eval_json(eval).dump());
}

nlohmann::json RunWriter::finish(const RunInfo& info, double wall_s, const nlohmann::json& extra) {
  const report::RunData run = report::load_run(dir_);
  const report::RunSummary s = report::derive_summary(run.config, run.steps, run.evals);

  // What derive_summary does not know: density judged after settling, the
  // Skip-Reduce share, throughput.
  std::vector<double> ratios;
  std::vector<double> deviations;
  std::vector<double> imbalances;
  std::vector<double> union_sizes;
  const bool settled = std::any_of(run.steps.begin(), run.steps.end(),
                                   [](const auto& r) { return r.step >= kSettleSteps; });
  for (const report::StepRecord& r : run.steps) {
    if (settled && r.step < kSettleSteps) continue;
    if (!r.synchronized || !std::isfinite(r.density_ratio)) continue;
    ratios.push_back(r.density_ratio);
    deviations.push_back(std::abs(r.density_ratio - 1.0));
    if (std::isfinite(r.imbalance)) imbalances.push_back(r.imbalance);
    if (std::isfinite(r.union_size)) union_sizes.push_back(r.union_size);
  }
  // The counting floor of the imbalance at the mean K (load_balance.h): what
  // no balancer can beat with K elements on this many ranks.
  const double mean_union = report::mean(union_sizes);
  const double floor = std::isfinite(mean_union)
                           ? imbalance_floor(info.workers, std::llround(mean_union))
                           : std::nan("");
  std::vector<double> skip_fractions;
  double overlapped = 0.0;
  double communication = 0.0;
  {
    std::ifstream in(dir_ / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto record = nlohmann::json::parse(line, nullptr, false);
      if (record.is_discarded() || record.value("kind", "") != "step") continue;
      const double numel = record.value("numel", 0.0);
      if (numel > 0) skip_fractions.push_back(record.value("skip_subject", 0.0) / numel);
      const auto seconds = [&](const char* key) {
        return record.contains(key) && record[key].is_number() ? record[key].get<double>() : 0.0;
      };
      overlapped += seconds("overlapped_s");
      communication += seconds("selection_s") + seconds("exchange_s");
    }
  }
  const std::int64_t steps = static_cast<std::int64_t>(run.steps.size());
  const double samples = static_cast<double>(steps * info.workers * config_.batch);

  nlohmann::json summary = {
      {"method", config_.method},
      {"model", config_.model},
      {"dataset", config_.dataset},
      {"workers", info.workers},
      {"backend", info.backend},
      {"threads_per_rank", info.threads},
      {"deterministic", config_.deterministic},
      {"seed", config_.seed},
      {"density", config_.density},
      {"numel", info.numel},
      {"embedding_numel", info.embedding_numel},
      {"epochs", json_number(s.epochs)},
      {"steps", steps},
      {"test_accuracy", json_number(s.test_accuracy)},
      {"best_test_accuracy", json_number(s.best_test_accuracy)},
      {"wall_s", json_number(wall_s)},
      {"time_breakdown_s",
       {{"compute", json_number(s.time_breakdown_s.compute)},
        {"selection", json_number(s.time_breakdown_s.selection)},
        {"exchange", json_number(s.time_breakdown_s.exchange)},
        {"update", json_number(s.time_breakdown_s.update)}}},
      {"bytes_per_rank_per_step", json_number(s.bytes_per_rank_per_step)},
      {"density_ratio_mean", json_number(report::mean(ratios))},
      {"density_ratio_p95_deviation", json_number(report::percentile(deviations, 95))},
      {"density_ratio_from_step", settled ? kSettleSteps : 0},
      {"imbalance_mean", json_number(report::mean(imbalances))},
      {"imbalance_p95", json_number(report::percentile(imbalances, 95))},
      {"imbalance_floor", json_number(floor)},
      {"imbalance_from_step", settled ? kSettleSteps : 0},
      {"skip_subject_fraction", json_number(report::mean(skip_fractions))},
      {"buckets", info.buckets},
      {"pipelining", info.pipelining},
      {"overlap_fraction", json_number(communication > 0 ? overlapped / communication : 0.0)},
      {"samples_per_s", json_number(wall_s > 0 ? samples / wall_s : std::nan(""))},
      {"resumed_from_step", info.first_step},
      {"run_dir", dir_.string()},
      {"servers", info.servers},
      {"sync", info.sync.empty() ? std::string("allreduce") : info.sync}};
  if (s.host_bytes_per_rank_per_step > 0) {  // two levels
    summary["host_bytes_per_rank_per_step"] = json_number(s.host_bytes_per_rank_per_step);
  }
  for (const auto& [key, value] : extra.items()) summary[key] = value;
  report::write_json_atomically(dir_ / "summary.json", summary);
  return summary;
}

}  // namespace sparsecomm
