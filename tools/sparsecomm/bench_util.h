#pragma once
// Helpers shared by the `sparsecomm bench` subcommands: checks of their
// common flags, the per-step reduction of timings over ranks, and the
// machine a run measured.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm::cli {

// Throws InvalidArgument unless iters >= 1 (--iters) and warmup >= 0 (--warmup).
void check_iterations(int iters, int warmup);

// Throws InvalidArgument unless `format` (--format) is "table" or "json".
void check_format(std::string_view format);

// Per iteration the maximum over ranks (a step waits for its slowest rank),
// then the median over iterations. A collective: every rank calls it, with
// `mine` of the same length.
double median_of_rank_max(Communicator& comm, const std::vector<double>& mine);

// The machine a benchmark ran on, for its report.
struct Machine {
  std::string cpu = "unknown CPU";
  unsigned cores = 0;
  double memory_gib = 0.0;
  double available_gib = 0.0;
  std::string load;  // 1-minute load average at the start: how busy the shared machine was
  std::string date;
};

// From /proc (cpuinfo, meminfo, loadavg) and the clock; what cannot be read
// keeps its default.
Machine describe_machine();

// The size of one last-level cache instance (the highest level CPU 0's
// sysfs lists), in bytes: sysconf's figure can be the whole package's (384
// MiB on a 32 MiB-per-CCD EPYC). nullopt when sysfs lists none; each caller
// says what it assumes then.
std::optional<std::size_t> last_level_cache_bytes();

}  // namespace sparsecomm::cli
