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

// How far the ranks' compute times spread within each step of a
// synchronous run (the performance model's arrival wait).
struct ComputeSpread {
  // The mean over the steps of the sample standard deviation across ranks,
  // divided by c4(n) (its mean for normal times, 0.80 for 2 ranks, 0.92
  // for 4): an estimate of the ranks' mean standard deviation per step,
  // `plan --compute-spread-ms`. The model's wait for the slowest rank is
  // proportional to a step's spread, so its mean over steps follows the
  // mean spread. 0 for one rank.
  double spread_s = 0.0;
  // The root mean square over the steps of the same sample standard
  // deviation (the model's input before 2026-11-27): a few steps that
  // spread far more than the rest, a rank descheduled, raise it well
  // above the mean spread and the wait it predicts above the wait.
  double spread_rms_s = 0.0;
  // Mean over steps and ranks of the slowest rank's time less the rank's
  // own: how long a rank waited for the slowest to arrive.
  double wait_s = 0.0;
};

// `times` holds `ranks` rows of equal length, one value per step
// (times[r * steps + t]); zeros for no steps. InvalidArgument when ranks
// < 1 or the rows cannot be equal.
ComputeSpread compute_spread(std::span<const double> times, int ranks);

}  // namespace sparsecomm::report
