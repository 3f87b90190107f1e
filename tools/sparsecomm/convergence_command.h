#pragma once
// `sparsecomm convergence RUN_DIR... -o FILE`: collects the evaluations of
// pilot runs of `sparsecomm train` (one model, schedule and world size; any
// methods, densities, rounds and seeds) into a convergence profile that
// `sparsecomm plan --convergence FILE` reads (perf/convergence.h).

#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace sparsecomm::cli {

// The settings that set a run's synchronization apart beyond its method,
// density and rounds, from its config.json ("memory=ef,decay=0.95,..."):
// a configuration's options in the profile.
std::string variant_options(const nlohmann::json& config);

// Adds the `convergence` subcommand to `app`.
void add_convergence_command(CLI::App& app);

}  // namespace sparsecomm::cli
