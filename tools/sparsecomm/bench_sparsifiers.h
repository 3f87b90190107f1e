#pragma once
// `sparsecomm bench sparsifiers`: per sparsification scheme, the selection
// time against the memory-bandwidth floor, std::nth_element and torch::topk,
// and the density-control, load-balance and traffic metrics of every step
// (docs/algorithms.md "Metrics every sparse scheme reports each step"), for n
// ranks simulated in one process over a sparsecomm::GradientStream: the
// synthetic stream by default, or a recorded trace (--trace DIR).

#include <CLI/CLI.hpp>

namespace sparsecomm::cli {

// Adds the `sparsifiers` subcommand to `bench`.
void add_bench_sparsifiers_command(CLI::App& bench);

}  // namespace sparsecomm::cli
