#pragma once
// `sparsecomm train`: data-parallel training with a chosen synchronization
// method (flags, a JSON config file, --compare, --resume), with a progress
// bar, per-epoch lines, a final table and the run directory.

#include <CLI/CLI.hpp>

namespace sparsecomm::cli {

// Adds the `train` subcommand to `app`.
void add_train_command(CLI::App& app);

// Adds the `methods` subcommand: every synchronization method and its options.
void add_methods_command(CLI::App& app);

}  // namespace sparsecomm::cli
