#pragma once
// `sparsecomm report DIR [DIR...] [--out OUT] [--no-plots]`: reads the run
// directories `sparsecomm train --out DIR` wrote, prints a summary (one run)
// and the comparison table, and draws PNG plots with gnuplot.

#include <CLI/CLI.hpp>

namespace sparsecomm::cli {

// Adds the `report` subcommand to `app`.
void add_report_command(CLI::App& app);

}  // namespace sparsecomm::cli
