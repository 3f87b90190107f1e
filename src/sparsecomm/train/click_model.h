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
// table-batched embeddings lay them out), so FlatModule and DataParallel
// see only the MLPs. forward() copies the batch's rows into a leaf tensor;
// after backward, table_gradient() sums its gradient per touched row
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

// Tables of `cardinalities[f]` rows each, stacked, every row `width` floats.
// Row r of table f is drawn uniform in +-1/sqrt(cardinalities[f]) (DLRM's
// initialization) from (seed, offset(f) + r): the same on every rank.
class EmbeddingTables {
 public:
  // InvalidArgument for no table, an empty table, width 0 or more than
  // 2^32 rows in all.
  EmbeddingTables(std::vector<std::size_t> cardinalities, std::size_t width, std::uint64_t seed);

  std::size_t tables() const { return cardinalities_.size(); }
  std::size_t rows() const { return offsets_.back(); }  // all tables together
  std::size_t width() const { return width_; }
  std::size_t numel() const { return values_.size(); }
  // First stacked row of table f; offset(tables()) == rows().
  std::size_t offset(std::size_t f) const { return offsets_[f]; }
  std::span<const std::size_t> cardinalities() const { return cardinalities_; }
  // Which table a stacked row belongs to.
  std::size_t table_of(std::size_t row) const;

  std::span<float> values() { return values_; }
  std::span<const float> values() const { return values_; }
  std::span<const float> row(std::size_t stacked) const {
    return {values_.data() + stacked * width_, width_};
  }

 private:
  std::vector<std::size_t> cardinalities_;
  std::vector<std::size_t> offsets_;
  std::size_t width_ = 0;
  UninitVector<float> values_;
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
  // generator (seed it first, as for make_model); the tables take `seed`.
  ClickModel(const ClickModelShape& shape, std::uint64_t seed);

  // Logits [rows] of the batch. Keeps the batch's stacked row ids and the
  // leaf of its rows for table_gradient(). InvalidArgument when the batch's
  // fields or numeric features do not match the shape.
  torch::Tensor forward(const ClickBatch& batch);

  // After backward of the last forward(): the tables' gradient summed per
  // touched stacked row (ids ascending).
  void table_gradient(RowSparse& out) const;
  // The last forward's lookups, field-major (lookups()[f * rows + j] is row
  // j's stacked id of table f).
  std::span<const Index> lookups() const { return lookups_; }

  EmbeddingTables& tables() { return tables_; }
  const EmbeddingTables& tables() const { return tables_; }
  const ClickModelShape& shape() const { return shape_; }

 private:
  ClickModelShape shape_;
  EmbeddingTables tables_;
  std::vector<torch::nn::Linear> bottom_;
  std::vector<torch::nn::Linear> top_;
  torch::Tensor pair_first_, pair_second_;  // the interaction's i < j pairs
  UninitVector<Index> lookups_;
  torch::Tensor gathered_;  // [fields, rows, width] leaf of the last forward
};

}  // namespace sparsecomm
