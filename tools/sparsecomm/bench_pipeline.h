#pragma once
// `sparsecomm bench pipeline`: in one run, the same training steps of a model
// synchronized after backward and pipelined in buckets (DataParallel's
// --bucket-mb), with the median step time of each, their ratio and the
// fraction of communication hidden under backward. (LibTorch.)

#include <CLI/CLI.hpp>

namespace sparsecomm::cli {

// Adds the `pipeline` subcommand to `bench`.
void add_bench_pipeline_command(CLI::App& bench);

}  // namespace sparsecomm::cli
