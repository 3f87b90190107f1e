#pragma once
// `sparsecomm bench exchange`: time and bytes per rank of the sparse
// exchange patterns (union all-reduce, sparse allgather, sparse all-reduce
// by recursive doubling and by split) against world size and density.

#include <CLI/CLI.hpp>

namespace sparsecomm::cli {

// Adds the `exchange` subcommand to `bench`.
void add_bench_exchange_command(CLI::App& bench);

}  // namespace sparsecomm::cli
