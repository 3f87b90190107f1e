#include "sparsecomm/report/compare_table.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/json_numbers.h"

namespace sparsecomm::report {
namespace {

// `value` with `digits` decimals, "-" when unknown.
std::string fixed(double value, int digits) {
  return std::isfinite(value) ? fmt::format("{:.{}f}", value, digits) : "-";
}

std::string percent(double fraction) { return fixed(100.0 * fraction, 2); }

// run / dense as "1/48" (48 times fewer bytes), "1" (same) or "2.5x" (more).
std::string ratio_to_dense(double bytes, double dense_bytes) {
  if (!std::isfinite(bytes) || !std::isfinite(dense_bytes) || dense_bytes <= 0 || bytes < 0) {
    return "-";
  }
  if (bytes == 0) return "0";
  const double fewer = dense_bytes / bytes;
  if (std::abs(fewer - 1.0) < 0.005) return "1";
  if (fewer > 1.0) return fmt::format("1/{}", fewer >= 10 ? fixed(fewer, 0) : fixed(fewer, 1));
  return fmt::format("{}x", fixed(1.0 / fewer, 2));
}

std::string workers_text(int workers) { return workers > 0 ? std::to_string(workers) : "-"; }

std::string text_or_dash(const std::string& s) { return s.empty() ? "-" : s; }

// The first evaluation of `run` at or above `accuracy`; nullptr if none.
const EvalRecord* first_reaching(const RunData& run, double accuracy) {
  const auto it = std::find_if(run.evals.begin(), run.evals.end(),
                               [&](const EvalRecord& e) { return e.test_accuracy >= accuracy; });
  return it == run.evals.end() ? nullptr : &*it;
}

}  // namespace

bool is_dense_run(const RunData& run) {
  std::string method = run.summary.method;
  std::transform(method.begin(), method.end(), method.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (method == "dense") return true;
  const auto density = run.config.find("density");
  return density != run.config.end() && density->is_number() && density->get<double>() >= 1.0;
}

std::string human_bytes(double bytes) {
  if (!std::isfinite(bytes)) return "-";
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (std::abs(bytes) >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  if (bytes == std::round(bytes)) return fmt::format("{:.0f} {}", bytes, kUnits[unit]);
  return fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

std::string format_comparison_table(std::span<const RunData> runs, double target_drop_points) {
  if (!std::isfinite(target_drop_points) || target_drop_points < 0) {
    throw InvalidArgument(fmt::format(
        "the target's margin must be a finite number of points >= 0, got {}", target_drop_points));
  }
  const auto dense = std::find_if(runs.begin(), runs.end(), is_dense_run);
  const double dense_bytes = dense == runs.end() ? NAN : dense->summary.bytes_per_rank_per_step;
  // Time to the first run's final accuracy (less the margin): which run gets
  // there sooner.
  const double target =
      runs.empty() ? NAN : runs.front().summary.test_accuracy - target_drop_points / 100.0;
  // Click models: their held-out log-loss and AUC too.
  const bool clicks = std::any_of(runs.begin(), runs.end(), [](const RunData& run) {
    return std::isfinite(run.summary.test_auc);
  });
  std::vector<std::string> header = {"method",
                                     "model",
                                     "workers",
                                     "final acc %",
                                     "best acc %",
                                     "wall s",
                                     fmt::format("s to {}%", percent(target)),
                                     "epochs to",
                                     "K/k mean",
                                     "imbal.",
                                     "bytes/rank/step",
                                     "vs dense",
                                     "compute s",
                                     "selection s",
                                     "exchange s",
                                     "update s",
                                     "run"};
  constexpr std::size_t kAfterAccuracy = 5;
  if (clicks) header.insert(header.begin() + kAfterAccuracy, {"log-loss", "AUC"});
  // Columns 0, 1 and the last are text (left-aligned); the others numbers.
  const auto left = [&](std::size_t c) { return c <= 1 || c + 1 == header.size(); };
  std::vector<std::vector<std::string>> rows = {header};
  bool any_derived = false;
  std::string failures;
  for (const RunData& run : runs) {
    const RunSummary& s = run.summary;
    if (run.failure) {
      failures +=
          fmt::format("! {} failed after {} steps: {}\n", run_name(s), s.steps, *run.failure);
    } else {
      any_derived = any_derived || run.summary_derived;
    }
    const EvalRecord* reached = std::isfinite(target) ? first_reaching(run, target) : nullptr;
    const char* mark = run.failure ? "!" : run.summary_derived ? "*" : "";
    std::vector<std::string> row = {text_or_dash(run_name(s)) + mark,
                                    text_or_dash(s.model),
                                    workers_text(s.workers),
                                    percent(s.test_accuracy),
                                    percent(s.best_test_accuracy),
                                    fixed(s.wall_s, 1),
                                    reached ? fixed(reached->wall_s, 1) : "-",
                                    reached ? fixed(reached->epoch, 2) : "-",
                                    fixed(s.density_ratio_mean, 3),
                                    fixed(s.imbalance_mean, 3),
                                    human_bytes(s.bytes_per_rank_per_step),
                                    ratio_to_dense(s.bytes_per_rank_per_step, dense_bytes),
                                    fixed(s.time_breakdown_s.compute, 2),
                                    fixed(s.time_breakdown_s.selection, 2),
                                    fixed(s.time_breakdown_s.exchange, 2),
                                    fixed(s.time_breakdown_s.update, 2),
                                    run.dir.string()};
    if (clicks) {
      row.insert(row.begin() + kAfterAccuracy, {fixed(s.test_loss, 4), fixed(s.test_auc, 4)});
    }
    rows.push_back(std::move(row));
  }
  std::vector<std::size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  const auto emit = [&](const std::vector<std::string>& row) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += "  ";
      line += left(c) ? fmt::format("{:<{}}", row[c], width[c])
                      : fmt::format("{:>{}}", row[c], width[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit(rows[0]);
  // The rule stops at the directory column's header (paths may be long).
  std::size_t total = 2 * (width.size() - 1) + header.back().size();
  for (std::size_t c = 0; c + 1 < width.size(); ++c) total += width[c];
  out += std::string(total, '-') + "\n";
  for (std::size_t r = 1; r < rows.size(); ++r) emit(rows[r]);
  if (any_derived) {
    out += "* no summary.json (interrupted run): figures derived from metrics.jsonl\n";
  }
  out += failures;  // "!": the run failed; its figures cover the steps before
  return out;
}

std::string format_run_summary(const RunData& run) {
  const RunSummary& s = run.summary;
  std::string out;
  auto line = [&](const char* key, const std::string& value) {
    fmt::format_to(std::back_inserter(out), "{:<9} {}\n", key, value);
  };
  line("run", run.dir.string());
  std::string what = fmt::format("{} (model {}, {} workers", text_or_dash(s.method),
                                 text_or_dash(s.model), workers_text(s.workers));
  if (!s.backend.empty()) what += ", backend " + s.backend;
  if (const auto d = run.config.find("density"); d != run.config.end() && d->is_number()) {
    what += fmt::format(", density {}", d->get<double>());
  }
  const auto h = run.config.find("local_steps");
  const std::int64_t local_steps =
      h == run.config.end() ? 0 : json_integer<std::int64_t>(*h).value_or(0);
  if (local_steps > 0) what += fmt::format(", local steps {}", local_steps);
  line("method", what + ")");
  std::string length = fmt::format("{} steps, {} epochs, wall {} s", s.steps, fixed(s.epochs, 2),
                                   fixed(s.wall_s, 1));
  if (std::isfinite(s.samples_per_s)) length += fmt::format(", {:.0f} samples/s", s.samples_per_s);
  line("length", length);
  line("accuracy", fmt::format("final {} %, best {} % ({} evaluations)", percent(s.test_accuracy),
                               percent(s.best_test_accuracy), run.evals.size()));
  if (std::isfinite(s.test_auc)) {
    line("held out",
         fmt::format("log-loss {}, AUC {}", fixed(s.test_loss, 4), fixed(s.test_auc, 4)));
  } else if (std::isfinite(s.test_loss) && !run.evals.empty()) {
    line("held out", fmt::format("loss {} (perplexity {})", fixed(s.test_loss, 4),
                                 fixed(std::exp(s.test_loss), 2)));
  }
  line("density", fmt::format("K/k mean {}, imbalance mean {}", fixed(s.density_ratio_mean, 3),
                              fixed(s.imbalance_mean, 3)));
  line("traffic", human_bytes(s.bytes_per_rank_per_step) + " per rank per step" +
                      (s.host_bytes_per_rank_per_step > 0
                           ? fmt::format(" between hosts, {} inside its host",
                                         human_bytes(s.host_bytes_per_rank_per_step))
                           : "") +
                      (local_steps > 0 ? " (inner steps included)" : ""));
  const TimeBreakdown& t = s.time_breakdown_s;
  line("time",
       fmt::format("compute {} s, selection {} s, exchange {} s, update {} s", fixed(t.compute, 2),
                   fixed(t.selection, 2), fixed(t.exchange, 2), fixed(t.update, 2)));
  for (const std::string& warning : run.warnings) line("warning", warning);
  return out;
}

}  // namespace sparsecomm::report
