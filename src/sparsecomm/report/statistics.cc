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
  double deviation_sum = 0.0;
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
    deviation_sum += std::sqrt(squares / static_cast<double>(n - 1));
    wait_sum += slowest - step_mean;  // the mean over ranks of (slowest - own)
  }
  // c4(n) = sqrt(2 / (n-1)) Gamma(n/2) / Gamma((n-1)/2): the mean of the
  // sample standard deviation of n normal values over their sigma.
  const double ranks_d = static_cast<double>(n);
  const double c4 = std::sqrt(2.0 / (ranks_d - 1.0)) *
                    std::exp(std::lgamma(ranks_d / 2.0) - std::lgamma((ranks_d - 1.0) / 2.0));
  out.spread_s = deviation_sum / static_cast<double>(steps) / c4;
  out.spread_rms_s = std::sqrt(variance_sum / static_cast<double>(steps));
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
