#pragma once
// Sparsification statistics measured on the user's own gradients, for the
// performance model: `sparsecomm bench sparsifiers --trace FILE -n N
// --format json` at one or more world sizes N (a recorded gradient trace,
// docs/algorithms.md, "Gradient traces"), turned into the ScalingTable that
// replaces the built-in, synthetic-stream statistics of those schemes.

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparsecomm/perf/scheme_scaling.h"

namespace sparsecomm::perf {

struct MeasuredScaling {
  ScalingTable table;
  // Schemes in the input that the model has no use for (shared-index and
  // leader schemes need no statistics; threshold is not modeled), sorted.
  std::vector<std::string> unused;
};

// One bench output: its rows and where they came from (for errors).
struct BenchRows {
  std::string origin;
  nlohmann::json rows;  // an array of `bench sparsifiers --format json` objects
};

// The statistics in `inputs` (any order; one file per world size is the
// usual). Per (scheme, density), one point per world size: K/k from
// density_ratio_mean; the per-rank selection over its share of k from
// selected_mean (independent schemes) or K/k (partition schemes, whose
// selections are disjoint); imbalance_mean; read_share (null: the whole
// vector for independent schemes, d/n for partition schemes);
// selection_collectives_mean. Skipped schemes (null measurements) are left
// out. Throws InvalidArgument naming the origin, row and field for a row
// that is not a bench row, two rows of one scheme, density and world size,
// or rows of one scheme and density measured on different d.
MeasuredScaling scaling_from_bench_rows(std::span<const BenchRows> inputs);

// Reads the files and calls scaling_from_bench_rows; InvalidArgument names
// a file that cannot be read or is not JSON.
MeasuredScaling load_bench_statistics(std::span<const std::string> paths);

}  // namespace sparsecomm::perf
