#include "sparsecomm/core/row_sparse.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

constexpr std::size_t kMaxWidth = std::size_t{1} << 24;  // floats per row
constexpr std::size_t kMaxRows = std::size_t{1} << 32;   // ids are 32-bit

}  // namespace

void RowSparse::reset(std::size_t table_rows, std::size_t row_width) {
  rows = table_rows;
  width = row_width;
  ids.clear();
  values.clear();
}

void check_row_sparse(const RowSparse& g, std::string_view what) {
  if (g.width < 1 || g.width > kMaxWidth) {
    throw InvalidArgument(fmt::format("[row-sparse] {}: a row must have 1 to {} floats, got {}",
                                      what, kMaxWidth, g.width));
  }
  if (g.rows > kMaxRows) {
    throw InvalidArgument(fmt::format(
        "[row-sparse] {}: a table has at most 2^32 rows (32-bit ids), got {}", what, g.rows));
  }
  if (g.values.size() != g.ids.size() * g.width) {
    throw InvalidArgument(
        fmt::format("[row-sparse] {}: {} ids of {}-float rows need {} values, got {}", what,
                    g.ids.size(), g.width, g.ids.size() * g.width, g.values.size()));
  }
  for (std::size_t j = 0; j < g.ids.size(); ++j) {
    if (g.ids[j] >= g.rows) {
      throw InvalidArgument(fmt::format(
          "[row-sparse] {}: id {} (entry {}) is not below the {} rows", what, g.ids[j], j, g.rows));
    }
    if (j > 0 && g.ids[j] <= g.ids[j - 1]) {
      throw InvalidArgument(
          fmt::format("[row-sparse] {}: ids must be strictly ascending; entry {} is {} after {} "
                      "(coalesce_rows sorts and sums repeated ids)",
                      what, j, g.ids[j], g.ids[j - 1]));
    }
  }
}

void coalesce_rows(std::span<const Index> lookup_ids, std::span<const float> lookup_rows,
                   std::size_t rows, std::size_t width, RowSparse& out) {
  out.reset(rows, width);
  check_row_sparse(out, "coalesce_rows");  // the shape alone
  if (lookup_rows.size() != lookup_ids.size() * width) {
    throw InvalidArgument(fmt::format(
        "[row-sparse] coalesce_rows: {} lookups of {}-float rows need {} values, got {}",
        lookup_ids.size(), width, lookup_ids.size() * width, lookup_rows.size()));
  }
  for (std::size_t j = 0; j < lookup_ids.size(); ++j) {
    if (lookup_ids[j] >= rows) {
      throw InvalidArgument(fmt::format(
          "[row-sparse] coalesce_rows: lookup {} has id {}, not below the table's {} rows", j,
          lookup_ids[j], rows));
    }
  }
  // Lookups by id, stable: a row's lookups keep their order.
  std::vector<std::size_t> order(lookup_ids.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return lookup_ids[a] < lookup_ids[b]; });
  for (std::size_t j = 0; j < order.size(); ++j) {
    const Index id = lookup_ids[order[j]];
    if (out.ids.empty() || out.ids.back() != id) {
      out.ids.push_back(id);
      out.values.resize(out.values.size() + width, 0.0f);
    }
    float* to = out.values.data() + out.values.size() - width;
    const float* from = lookup_rows.data() + order[j] * width;
    for (std::size_t c = 0; c < width; ++c) to[c] += from[c];
  }
}

}  // namespace sparsecomm
