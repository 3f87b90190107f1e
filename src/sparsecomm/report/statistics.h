#pragma once
// Summary statistics of a measured series: one definition each, shared by
// the trainer's summary.json (train/run_writer.cc) and the benchmarks
// (tools/sparsecomm), so that their figures mean the same thing.

#include <span>
#include <vector>

namespace sparsecomm::report {

// The arithmetic mean, summed in order; NaN for an empty list.
double mean(std::span<const double> values);

// The value at 0-based position min(n - 1, n * percent / 100) (integer
// division) of the sorted list: percentile(v, 95) of 20 values is the
// largest, of 32 values the 31st smallest. NaN for an empty list;
// InvalidArgument unless 0 <= percent <= 100.
double percentile(std::vector<double> values, int percent);

// The middle value; for an even count the mean of the two middle values.
// InvalidArgument for an empty list.
double median(std::vector<double> values);

}  // namespace sparsecomm::report
