#pragma once
// `sparsecomm plan`: which synchronization method pays on a given network,
// model, compute time, density and number of ranks, by the performance
// model of src/sparsecomm/perf (docs/algorithms.md, "Performance model").

#include <CLI/CLI.hpp>

namespace sparsecomm::cli {

void add_plan_command(CLI::App& app);

}  // namespace sparsecomm::cli
