#include "sparsecomm/core/sparse.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

std::size_t chunk_begin(std::size_t numel, int parts, int chunk) {
  if (parts <= 0 || chunk < 0 || chunk > parts) {
    throw InvalidArgument(
        fmt::format("chunk_begin: chunk {} of {} parts is out of range", chunk, parts));
  }
  const auto p = static_cast<std::size_t>(parts);
  const auto c = static_cast<std::size_t>(chunk);
  return c * (numel / p) + std::min(c, numel % p);
}

std::size_t target_count(double density, std::size_t numel) {
  if (numel == 0) return 0;
  const double k = std::floor(density * static_cast<double>(numel));
  return std::max<std::size_t>(1, std::min(numel, static_cast<std::size_t>(k)));
}

}  // namespace sparsecomm
