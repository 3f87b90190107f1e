#pragma once
// `sparsecomm calibrate`: measures the performance model's constants on the
// machine or cluster at hand (alpha from a chain of 8-byte ring rounds, beta
// from our ring all-reduce at several sizes, wire framing from the NIC
// counters, the host's per-element costs) and writes them as a JSON cost
// profile (src/sparsecomm/perf/cost_profile.h).

#include <CLI/CLI.hpp>

namespace sparsecomm::cli {

void add_calibrate_command(CLI::App& app);

}  // namespace sparsecomm::cli
