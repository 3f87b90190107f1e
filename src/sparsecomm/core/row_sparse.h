#pragma once
// Row-sparse gradients of embedding tables (docs/algorithms.md, "Row-sparse
// exchange"). A table has `rows` rows of `width` floats; a step touches
// only the rows of the IDs in its batch, so its gradient is a RowSparse:
// the touched row ids, strictly ascending, and their rows. LibTorch's
// sparse embedding gradient repeats an id once per lookup; coalesce_rows
// sums those first. Summed over ranks by collectives/row_exchange.h,
// applied by optim/row_optimizer.h.

#include <cstddef>
#include <span>
#include <string_view>

#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

struct RowSparse {
  std::size_t rows = 0;        // the table's height: every id is below it
  std::size_t width = 0;       // floats per row
  UninitVector<Index> ids;     // strictly ascending
  UninitVector<float> values;  // ids.size() x width, row-major
  std::size_t touched() const { return ids.size(); }
  std::span<const float> row(std::size_t j) const { return {values.data() + j * width, width}; }
  // Resets to an empty gradient of a rows x width table (keeps capacity).
  void reset(std::size_t table_rows, std::size_t row_width);
};

// Throws InvalidArgument unless `g` is well formed: rows <= 2^32, width
// 1 to 2^24, ids strictly ascending and below rows, values.size() ==
// ids.size() x width. `what` names g in the message.
void check_row_sparse(const RowSparse& g, std::string_view what);

// Sums an uncoalesced gradient (one row per lookup: lookup_rows is
// lookup_ids.size() x width, ids in any order and repeating) into `out`:
// the unique ids ascending, each the sum of its lookups' rows in lookup
// order. InvalidArgument when an id is not below `rows` or the sizes
// disagree.
void coalesce_rows(std::span<const Index> lookup_ids, std::span<const float> lookup_rows,
                   std::size_t rows, std::size_t width, RowSparse& out);

}  // namespace sparsecomm
