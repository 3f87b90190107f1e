#include "sparsecomm/report/statistics.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm::report {

double mean(std::span<const double> values) {
  if (values.empty()) return std::nan("");
  double sum = 0.0;
  for (const double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

ComputeSpread compute_spread(std::span<const double> times, int ranks) {
  if (ranks < 1 || times.size() % static_cast<std::size_t>(ranks) != 0) {
    throw InvalidArgument(
        fmt::format("compute_spread: {} times do not make rows of equal length for {} ranks",
                    times.size(), ranks));
  }
  const std::size_t n = static_cast<std::size_t>(ranks);
  const std::size_t steps = times.size() / n;
  ComputeSpread out;
  if (steps == 0 || n == 1) return out;
  double variance_sum = 0.0;
  double wait_sum = 0.0;
  for (std::size_t t = 0; t < steps; ++t) {
    double sum = 0.0;
    double slowest = times[t];
    for (std::size_t r = 0; r < n; ++r) {
      sum += times[r * steps + t];
      slowest = std::max(slowest, times[r * steps + t]);
    }
    const double step_mean = sum / static_cast<double>(n);
    double squares = 0.0;
    for (std::size_t r = 0; r < n; ++r) {
      const double deviation = times[r * steps + t] - step_mean;
      squares += deviation * deviation;
    }
    variance_sum += squares / static_cast<double>(n - 1);
    wait_sum += slowest - step_mean;  // the mean over ranks of (slowest - own)
  }
  out.spread_s = std::sqrt(variance_sum / static_cast<double>(steps));
  out.wait_s = wait_sum / static_cast<double>(steps);
  return out;
}

double percentile(std::vector<double> values, int percent) {
  if (percent < 0 || percent > 100) {
    throw InvalidArgument(fmt::format("percentile: {} is outside [0, 100]", percent));
  }
  if (values.empty()) return std::nan("");
  const std::size_t at =
      std::min(values.size() - 1, values.size() * static_cast<std::size_t>(percent) / 100);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(at), values.end());
  return values[at];
}

double median(std::vector<double> values) {
  if (values.empty()) throw InvalidArgument("median of an empty list");
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace sparsecomm::report
