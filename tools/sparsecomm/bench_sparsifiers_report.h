#pragma once
// What `sparsecomm bench sparsifiers` reports: one row per scheme, from its
// SchemeRun, printed as a table or written as JSON. The columns and JSON
// keys are part of the command's interface (docs/benchmarks/selection.md
// quotes them).

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_sparsifiers_options.h"
#include "bench_sparsifiers_probe.h"
#include "bench_util.h"

namespace sparsecomm::cli {

// One scheme's line of the table, object of the JSON.
struct SchemeRow {
  std::string scheme;
  std::string exchange;
  double select_ms = 0.0;
  std::optional<double> floor_ms;  // none: the scheme has no streaming floor
  std::optional<double> floor_ratio;
  std::optional<double> read_fraction;  // median elements read per (rank, step) / d
  bool partitioned = false;             // per-rank reads differ (partition schemes)
  bool leader_only = false;             // only the leader has a floor (CLT-k)
  std::string skipped;                  // why the scheme did not finish (empty: it did)
  double nth_element_speedup = 0.0;
  std::optional<double> torch_topk_speedup;
  double density_ratio_mean = 0.0;
  double density_error_p95 = 0.0;
  double imbalance_mean = 0.0;
  double imbalance_floor = 0.0;  // the counting floor at the mean K (load_balance.h)
  double rounds_mean = 0.0;      // select()'s own collectives per step
  double rescans = 0.0;          // share of steps with a second candidate pass
  double bytes_per_rank = 0.0;
  double selected_mean = 0.0;               // |I_r| over ranks and steady steps
  std::optional<double> index_bytes_saved;  // none when no index was sent
};

// The row of one run: selection time over the timed steps, density, balance
// and traffic over the steady state (the steps after the warm-up).
SchemeRow summarize(const SchemeRun& run, const Baselines& baselines,
                    const SparsifierBenchOptions& options);

// One object per scheme, keys in a fixed order; a skipped scheme's
// measurements are null and "skipped" says why.
nlohmann::ordered_json to_json(const SchemeRow& row, const SparsifierBenchOptions& options);

// The table with its header (run, source, machine, baselines) and footnotes.
void print_table(const std::vector<SchemeRow>& rows, const Baselines& b, const Machine& machine,
                 const SparsifierBenchOptions& options);

}  // namespace sparsecomm::cli
