#include "sparsecomm/train/click_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/hash.h"
#include "sparsecomm/core/rng.h"

namespace sparsecomm {

TableLayout::TableLayout(std::vector<std::size_t> cardinalities, std::size_t width)
    : cardinalities_(std::move(cardinalities)), width_(width) {
  if (cardinalities_.empty()) throw InvalidArgument("embedding tables: no table");
  if (width_ == 0) throw InvalidArgument("embedding tables: the row width must be >= 1");
  offsets_.assign(1, 0);
  for (std::size_t f = 0; f < cardinalities_.size(); ++f) {
    if (cardinalities_[f] == 0) {
      throw InvalidArgument(fmt::format("embedding tables: table {} has no rows", f));
    }
    offsets_.push_back(offsets_.back() + cardinalities_[f]);
  }
  if (rows() > std::numeric_limits<Index>::max()) {
    throw InvalidArgument(fmt::format(
        "embedding tables: {} rows in all; stacked row ids are 32-bit, so at most {} (lower the "
        "tables' cap)",
        rows(), std::numeric_limits<Index>::max()));
  }
}

std::size_t TableLayout::table_of(std::size_t row) const {
  return static_cast<std::size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), row) -
                                  offsets_.begin()) -
         1;
}

void TableLayout::stack(const ClickBatch& batch, UninitVector<Index>& lookups) const {
  const std::size_t fields = tables();
  if (batch.fields != fields) {
    throw InvalidArgument(fmt::format("the click model has {} tables; the batch has {} fields",
                                      fields, batch.fields));
  }
  const std::size_t rows = batch.rows;
  lookups.resize(fields * rows);
  for (std::size_t f = 0; f < fields; ++f) {
    for (std::size_t j = 0; j < rows; ++j) {
      const Index id = batch.ids[j * fields + f];
      if (id >= cardinalities_[f]) {
        throw InvalidArgument(
            fmt::format("row {} of the batch: field {} has ID {}, but table {} has {} rows", j, f,
                        id, f, cardinalities_[f]));
      }
      lookups[f * rows + j] = static_cast<Index>(offsets_[f] + id);
    }
  }
}

EmbeddingTables::EmbeddingTables(TableLayout layout, std::uint64_t seed)
    : EmbeddingTables(layout, seed, 0, layout.rows()) {}

EmbeddingTables::EmbeddingTables(TableLayout layout, std::uint64_t seed, std::size_t first,
                                 std::size_t last)
    : layout_(std::move(layout)), first_(first), last_(last) {
  if (first_ > last_ || last_ > layout_.rows()) {
    throw InvalidArgument(
        fmt::format("embedding tables: rows [{}, {}) are not a range of the {} "
                    "stacked rows",
                    first_, last_, layout_.rows()));
  }
  const std::size_t width = layout_.width();
  values_.resize((last_ - first_) * width);
  const Philox draws(seed ^ 0x656d626564646e67ULL);  // "embeddng"
  std::size_t f = first_ < last_ ? layout_.table_of(first_) : 0;
  for (std::size_t r = first_; r < last_; ++r) {
    while (r >= layout_.offset(f + 1)) ++f;
    const float scale = 1.0f / std::sqrt(static_cast<float>(layout_.cardinalities()[f]));
    float* out = values_.data() + (r - first_) * width;
    for (std::size_t q = 0; q < width; q += 4) {
      const Philox::Block block = draws.block(r, q / 4);
      for (std::size_t i = 0; i < 4 && q + i < width; ++i) {
        // 24 random bits -> [0, 1) -> [-scale, scale)
        const float unit = static_cast<float>(block[i] >> 8) * 0x1p-24f;
        out[q + i] = (2.0f * unit - 1.0f) * scale;
      }
    }
  }
}

std::uint64_t EmbeddingTables::row_hash_sum() const {
  const std::size_t width = layout_.width();
  std::uint64_t sum = 0;
  for (std::size_t r = first_; r < last_; ++r) {
    const std::span<const float> row(values_.data() + (r - first_) * width, width);
    sum += hash_bytes(std::as_bytes(row), r);
  }
  return sum;
}

double EmbeddingTables::abs_sum() const {
  double sum = 0.0;
  for (const float v : values_) sum += std::abs(v);
  return sum;
}

const float* PulledRows::row(Index stacked) const {
  const auto it = std::lower_bound(rows_.ids.begin(), rows_.ids.end(), stacked);
  if (it == rows_.ids.end() || *it != stacked) {
    throw std::logic_error(fmt::format("PulledRows: row {} was not pulled", stacked));
  }
  return rows_.values.data() + static_cast<std::size_t>(it - rows_.ids.begin()) * rows_.width;
}

namespace {

std::vector<torch::nn::Linear> make_layers(torch::nn::Module& module, std::string_view prefix,
                                           std::int64_t in,
                                           const std::vector<std::int64_t>& widths) {
  std::vector<torch::nn::Linear> layers;
  for (std::size_t i = 0; i < widths.size(); ++i) {
    layers.push_back(module.register_module(fmt::format("{}{}", prefix, i + 1),
                                            torch::nn::Linear(in, widths[i])));
    in = widths[i];
  }
  return layers;
}

}  // namespace

ClickModel::ClickModel(const ClickModelShape& shape)
    : shape_(shape), layout_(shape.cardinalities, shape.width) {
  const auto width = static_cast<std::int64_t>(shape.width);
  std::vector<std::int64_t> bottom = shape.bottom;
  bottom.push_back(width);  // the bottom output meets the rows in the interaction
  bottom_ = make_layers(*this, "bottom", static_cast<std::int64_t>(shape.dense_features), bottom);
  const auto vectors = static_cast<std::int64_t>(shape.cardinalities.size()) + 1;
  std::vector<std::int64_t> first, second;
  for (std::int64_t i = 0; i < vectors; ++i) {
    for (std::int64_t j = i + 1; j < vectors; ++j) {
      first.push_back(i);
      second.push_back(j);
    }
  }
  pair_first_ = torch::tensor(first, torch::kInt64);
  pair_second_ = torch::tensor(second, torch::kInt64);
  std::vector<std::int64_t> top = shape.top;
  top.push_back(1);
  top_ = make_layers(*this, "top", width + static_cast<std::int64_t>(first.size()), top);
}

torch::Tensor ClickModel::forward(const ClickBatch& batch, const RowReader& tables) {
  if (batch.dense_features != shape_.dense_features) {
    throw InvalidArgument(fmt::format("the click model has {} numeric features; the batch has {}",
                                      shape_.dense_features, batch.dense_features));
  }
  layout_.stack(batch, lookups_);
  const std::size_t rows = batch.rows;
  const std::size_t width = layout_.width();
  gathered_ = torch::empty({static_cast<std::int64_t>(layout_.tables()),
                            static_cast<std::int64_t>(rows), static_cast<std::int64_t>(width)});
  float* out = gathered_.data_ptr<float>();
  for (std::size_t i = 0; i < lookups_.size(); ++i) {
    std::memcpy(out + i * width, tables.row(lookups_[i]), width * sizeof(float));
  }
  gathered_.requires_grad_(true);

  torch::Tensor x = torch::from_blob(const_cast<float*>(batch.dense.data()),
                                     {static_cast<std::int64_t>(rows),
                                      static_cast<std::int64_t>(shape_.dense_features)})
                        .clone();
  for (auto& layer : bottom_) x = torch::relu(layer(x));
  // [rows, fields + 1, width]: the bottom output, then each table's row.
  const torch::Tensor vectors = torch::cat({x.unsqueeze(1), gathered_.transpose(0, 1)}, 1);
  const torch::Tensor dots = torch::bmm(vectors, vectors.transpose(1, 2));
  const torch::Tensor pairs = dots.index({torch::indexing::Slice(), pair_first_, pair_second_});
  torch::Tensor z = torch::cat({x, pairs}, 1);
  for (std::size_t i = 0; i < top_.size(); ++i) {
    z = top_[i](z);
    if (i + 1 < top_.size()) z = torch::relu(z);
  }
  return z.squeeze(1);
}

void ClickModel::table_gradient(RowSparse& out) const {
  const std::size_t width = layout_.width();
  if (!gathered_.defined() || !gathered_.grad().defined()) {
    out.reset(layout_.rows(), width);
    return;
  }
  const torch::Tensor grad = gathered_.grad().contiguous();
  coalesce_rows(lookups_, std::span<const float>(grad.data_ptr<float>(), lookups_.size() * width),
                layout_.rows(), width, out);
}

}  // namespace sparsecomm
