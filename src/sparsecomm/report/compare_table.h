#pragma once
// Plain-text reports of runs: an aligned comparison table (one row per run)
// and a multi-line summary of one run.

#include <span>
#include <string>

#include "sparsecomm/report/run_files.h"

namespace sparsecomm::report {

// Whether `run` is the dense baseline: method "dense" (any case), or a
// config "density" >= 1.
bool is_dense_run(const RunData& run);

// 65536 -> "64 KiB", 1536 -> "1.5 KiB", 100 -> "100 B"; NaN -> "-".
std::string human_bytes(double bytes);

// The table, '\n'-terminated lines: a header, a rule, then one row per run
// with the run's name (run_name), model, workers, final and best test
// accuracy (%), wall seconds, the wall seconds and epochs of its first
// evaluation at or above the target accuracy ("-" if it never gets there:
// which run reaches the baseline's accuracy sooner), mean K/k,
// mean imbalance, bytes per rank per step, those bytes against the first
// dense run ("1/48": 48 times fewer; "-" when there is no dense run), the
// compute/selection/exchange/update seconds and the directory; when a run
// has an AUC (the click model), the final held-out log-loss and AUC after
// the accuracies. Unknown
// figures print as "-". Runs whose summary was derived from metrics.jsonl
// (no summary.json) are marked "*" with a footnote. The target is the first
// run's final test accuracy less `target_drop_points` percentage points (one
// run is a noisy target; time-to-accuracy comparisons allow a margin).
// Throws InvalidArgument if `target_drop_points` is negative or not finite.
std::string format_comparison_table(std::span<const RunData> runs, double target_drop_points = 0.0);

// A few labelled lines describing one run (what, how long, accuracy,
// density, traffic, time breakdown) plus its warnings (RunData::warnings,
// which say when there was no summary.json).
std::string format_run_summary(const RunData& run);

}  // namespace sparsecomm::report
