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

void SparseSelection::check(std::size_t numel) const {
  for (std::size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] >= numel || (i > 0 && indices[i] <= indices[i - 1])) {
      throw InvalidArgument(fmt::format(
          "the selection must be strictly ascending indices below d = {}, but index {} is {}{}",
          numel, i, indices[i], i > 0 ? fmt::format(" after {}", indices[i - 1]) : ""));
    }
  }
  std::size_t known_end = 0;
  for (const Range& range : known) {
    if (range.begin > range.end || range.end > numel || range.begin < known_end) {
      throw InvalidArgument(
          fmt::format("the known ranges must be ascending, non-overlapping and inside [0, {}), "
                      "but [{}, {}) follows a range ending at {}",
                      numel, range.begin, range.end, known_end));
    }
    known_end = range.end;
  }
  for (std::size_t i = 0, r = 0; i < indices.size() && r < known.size();) {
    if (known[r].end <= indices[i]) {
      ++r;
    } else if (indices[i] >= known[r].begin) {
      throw InvalidArgument(
          fmt::format("selected index {} lies in the known range [{}, {}): they must be disjoint",
                      indices[i], known[r].begin, known[r].end));
    } else {
      ++i;
    }
  }
}

void SparseSelection::expand_known(std::span<const float> accumulated, SparseSelection& out) const {
  check(accumulated.size());
  if (values.size() != indices.size()) {
    throw InvalidArgument(
        fmt::format("the selection has {} indices but {} values", indices.size(), values.size()));
  }
  std::size_t total = size();
  for (const Range& range : known) total += range.size();
  out.clear();
  out.indices.resize(total);
  out.values.resize(total);
  std::size_t placed = 0;
  std::size_t next = 0;  // of indices
  const auto take_selected_before = [&](std::size_t end) {
    for (; next < size() && indices[next] < end; ++next, ++placed) {
      out.indices[placed] = indices[next];
      out.values[placed] = values[next];
    }
  };
  for (const Range& range : known) {
    take_selected_before(range.begin);
    for (std::size_t i = range.begin; i < range.end; ++i, ++placed) {
      out.indices[placed] = static_cast<Index>(i);
      out.values[placed] = accumulated[i];
    }
  }
  take_selected_before(accumulated.size());
}

void for_each_layer_and_gap(
    std::string_view who, std::size_t numel, std::span<const LayerSpan> layers,
    const std::function<void(std::size_t begin, std::size_t end, const LayerSpan* layer)>& visit) {
  std::size_t covered = 0;
  for (const LayerSpan& layer : layers) {
    if (layer.offset < covered || layer.size > numel || layer.offset > numel - layer.size) {
      throw InvalidArgument(fmt::format(
          "{} layer '{}' ([{}, {})) is not inside the {}-element gradient after the layers "
          "before it",
          who, layer.name, layer.offset, layer.offset + layer.size, numel));
    }
    visit(covered, layer.offset, nullptr);
    visit(layer.offset, layer.offset + layer.size, &layer);
    covered = layer.offset + layer.size;
  }
  visit(covered, numel, nullptr);
}

std::size_t target_count(double density, std::size_t numel) {
  if (numel == 0) return 0;
  const double k = std::floor(density * static_cast<double>(numel));
  return std::max<std::size_t>(1, std::min(numel, static_cast<std::size_t>(k)));
}

}  // namespace sparsecomm
