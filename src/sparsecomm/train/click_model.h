#pragma once
// The click model `dlrm` (LibTorch; docs/algorithms.md, "The click model"):
// DLRM's shape on the click log of src/sparsecomm/data/click_log.h.
//
//   bottom MLP   13 numeric features -> 64 -> 16, ReLU after each layer
//   embeddings   one 16-wide row per categorical field (26 tables)
//   interaction  the pairwise dot products of the 27 vectors (bottom output
//                and the 26 rows): 351 features, with the bottom output
//   top MLP      367 -> 128 -> 64 -> 1 logit, ReLU between
//
// The tables are not module parameters: they live in EmbeddingTables, one
// stacked rows x width buffer (table f's rows start at offset(f), as
// table-batched embeddings lay them out), either whole on every rank or
// split over the ranks that own them, so FlatModule and DataParallel see
// only the MLPs. forward() copies the batch's rows from a RowReader (the
// tables, or the rows pulled from their owners) into a leaf tensor; after
// backward, table_gradient() sums its gradient per touched row
// (core/row_sparse.h): the step's table gradient, never dense.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <torch/torch.h>

#include "sparsecomm/core/row_sparse.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/data/click_log.h"

namespace sparsecomm {

// The tables' geometry: table f has cardinalities[f] rows of `width`
// floats; the tables are stacked into one id space, table f's rows first
// at offset(f).
class TableLayout {
 public:
  // InvalidArgument for no table, an empty table, width 0 or more than
  // 2^32 rows in all.
  TableLayout(std::vector<std::size_t> cardinalities, std::size_t width);

  std::size_t tables() const { return cardinalities_.size(); }
  std::size_t rows() const { return offsets_.back(); }  // all tables together
  std::size_t width() const { return width_; }
  std::size_t numel() const { return rows() * width_; }
  // First stacked row of table f; offset(tables()) == rows().
  std::size_t offset(std::size_t f) const { return offsets_[f]; }
  std::span<const std::size_t> cardinalities() const { return cardinalities_; }
  // Which table a stacked row belongs to.
  std::size_t table_of(std::size_t row) const;
  // The batch's lookups as stacked ids, field-major (lookups[f * rows + j]
  // is row j's id of table f). InvalidArgument when the batch has another
  // number of fields or an id outside its table.
  void stack(const ClickBatch& batch, UninitVector<Index>& lookups) const;

 private:
  std::vector<std::size_t> cardinalities_;
  std::vector<std::size_t> offsets_;
  std::size_t width_ = 0;
};

// Where forward() reads the rows of a batch's lookups.
class RowReader {
 public:
  virtual ~RowReader() = default;
  // The `width` floats of stacked row `stacked`, which the reader must hold.
  virtual const float* row(Index stacked) const = 0;
};

// The stored rows [first, last) of the stacked tables: all of them for
// replicated tables, one owner's range for sharded ones. Row r is drawn
// uniform in +-1/sqrt(cardinality of its table) (DLRM's initialization)
// from (seed, r): the same on every rank, whatever range it stores.
class EmbeddingTables final : public RowReader {
 public:
  EmbeddingTables(TableLayout layout, std::uint64_t seed);  // every row
  // InvalidArgument unless first <= last <= layout.rows().
  EmbeddingTables(TableLayout layout, std::uint64_t seed, std::size_t first, std::size_t last);

  const TableLayout& layout() const { return layout_; }
  std::size_t first() const { return first_; }
  std::size_t last() const { return last_; }
  std::span<float> values() { return values_; }  // rows first .. last - 1
  std::span<const float> values() const { return values_; }
  const float* row(Index stacked) const override {
    return values_.data() + (stacked - first_) * layout_.width();
  }
  // A fingerprint of the stored rows that does not depend on how the rows
  // are split over ranks: the sum mod 2^64 of each row's hash (seeded by
  // its stacked id), and the sum of |values| in double.
  std::uint64_t row_hash_sum() const;
  double abs_sum() const;

 private:
  TableLayout layout_;
  std::size_t first_ = 0;
  std::size_t last_ = 0;
  UninitVector<float> values_;
};

// Rows pulled from their owners for one batch (ids ascending).
class PulledRows final : public RowReader {
 public:
  explicit PulledRows(const RowSparse& rows) : rows_(rows) {}
  const float* row(Index stacked) const override;  // std::logic_error when absent

 private:
  const RowSparse& rows_;
};

struct ClickModelShape {
  std::vector<std::size_t> cardinalities;
  std::size_t dense_features = 13;
  std::size_t width = 16;                   // embedding width = bottom MLP output
  std::vector<std::int64_t> bottom = {64};  // hidden widths of the bottom MLP
  std::vector<std::int64_t> top = {128, 64};
};

class ClickModel : public torch::nn::Module {
 public:
  // The MLPs take LibTorch's default initialization from its global
  // generator (seed it first, as for make_model). The tables are not here:
  // forward() reads them from a RowReader.
  explicit ClickModel(const ClickModelShape& shape);

  // Logits [rows] of the batch, its lookups' rows read from `tables`. Keeps
  // the batch's stacked row ids and the leaf of its rows for
  // table_gradient(). InvalidArgument when the batch's fields or numeric
  // features do not match the shape.
  torch::Tensor forward(const ClickBatch& batch, const RowReader& tables);

  // After backward of the last forward(): the tables' gradient summed per
  // touched stacked row (ids ascending).
  void table_gradient(RowSparse& out) const;
  // The last forward's lookups, field-major (lookups()[f * rows + j] is row
  // j's stacked id of table f).
  std::span<const Index> lookups() const { return lookups_; }

  const TableLayout& layout() const { return layout_; }
  const ClickModelShape& shape() const { return shape_; }

 private:
  ClickModelShape shape_;
  TableLayout layout_;
  std::vector<torch::nn::Linear> bottom_;
  std::vector<torch::nn::Linear> top_;
  torch::Tensor pair_first_, pair_second_;  // the interaction's i < j pairs
  UninitVector<Index> lookups_;
  torch::Tensor gathered_;  // [fields, rows, width] leaf of the last forward
};

}  // namespace sparsecomm
