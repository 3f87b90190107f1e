#include "sparsecomm/core/sparse.h"

#include <algorithm>
#include <cmath>

namespace sparsecomm {

std::size_t target_count(double density, std::size_t numel) {
  if (numel == 0) return 0;
  const double k = std::floor(density * static_cast<double>(numel));
  return std::max<std::size_t>(1, std::min(numel, static_cast<std::size_t>(k)));
}

}  // namespace sparsecomm
