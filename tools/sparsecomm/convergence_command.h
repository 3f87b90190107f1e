#pragma once
// `sparsecomm convergence RUN_DIR... -o FILE`: collects the evaluations of
// pilot runs of `sparsecomm train` (one model, schedule and world size; any
// methods, densities, rounds and seeds) into a convergence profile that
// `sparsecomm plan --convergence FILE` reads (perf/convergence.h).

#include <CLI/CLI.hpp>

namespace sparsecomm::cli {

// Adds the `convergence` subcommand to `app`.
void add_convergence_command(CLI::App& app);

}  // namespace sparsecomm::cli
