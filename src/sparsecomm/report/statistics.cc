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
