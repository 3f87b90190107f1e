#pragma once
// `sparsecomm bench collectives`: time, algorithm bandwidth and bus bandwidth
// of our ring all-reduce, the backend's native all-reduce and Skip-Reduce.

#include <CLI/CLI.hpp>

namespace sparsecomm::cli {

// Adds the `collectives` subcommand to `bench`.
void add_bench_collectives_command(CLI::App& bench);

}  // namespace sparsecomm::cli
