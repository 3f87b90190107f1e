#include "sparsecomm/train/click_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"

namespace sparsecomm {

EmbeddingTables::EmbeddingTables(std::vector<std::size_t> cardinalities, std::size_t width,
                                 std::uint64_t seed)
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
  values_.resize(rows() * width_);
  const Philox draws(seed ^ 0x656d626564646e67ULL);  // "embeddng"
  for (std::size_t f = 0; f < cardinalities_.size(); ++f) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(cardinalities_[f]));
    for (std::size_t r = offsets_[f]; r < offsets_[f + 1]; ++r) {
      float* out = values_.data() + r * width_;
      for (std::size_t q = 0; q < width_; q += 4) {
        const Philox::Block block = draws.block(r, q / 4);
        for (std::size_t i = 0; i < 4 && q + i < width_; ++i) {
          // 24 random bits -> [0, 1) -> [-scale, scale)
          const float unit = static_cast<float>(block[i] >> 8) * 0x1p-24f;
          out[q + i] = (2.0f * unit - 1.0f) * scale;
        }
      }
    }
  }
}

std::size_t EmbeddingTables::table_of(std::size_t row) const {
  return static_cast<std::size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), row) -
                                  offsets_.begin()) -
         1;
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

ClickModel::ClickModel(const ClickModelShape& shape, std::uint64_t seed)
    : shape_(shape), tables_(shape.cardinalities, shape.width, seed) {
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

torch::Tensor ClickModel::forward(const ClickBatch& batch) {
  const std::size_t fields = tables_.tables();
  if (batch.fields != fields || batch.dense_features != shape_.dense_features) {
    throw InvalidArgument(fmt::format(
        "the click model has {} tables and {} numeric features; the batch has {} and {}", fields,
        shape_.dense_features, batch.fields, batch.dense_features));
  }
  const std::size_t rows = batch.rows;
  const std::size_t width = tables_.width();
  lookups_.resize(fields * rows);
  gathered_ = torch::empty({static_cast<std::int64_t>(fields), static_cast<std::int64_t>(rows),
                            static_cast<std::int64_t>(width)});
  float* out = gathered_.data_ptr<float>();
  for (std::size_t f = 0; f < fields; ++f) {
    const std::size_t offset = tables_.offset(f);
    const std::size_t height = tables_.cardinalities()[f];
    for (std::size_t j = 0; j < rows; ++j) {
      const Index id = batch.ids[j * fields + f];
      if (id >= height) {
        throw InvalidArgument(
            fmt::format("row {} of the batch: field {} has ID {}, but table {} has {} rows", j, f,
                        id, f, height));
      }
      const auto stacked = static_cast<Index>(offset + id);
      lookups_[f * rows + j] = stacked;
      std::memcpy(out + (f * rows + j) * width, tables_.row(stacked).data(), width * sizeof(float));
    }
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
  const std::size_t width = tables_.width();
  if (!gathered_.defined() || !gathered_.grad().defined()) {
    out.reset(tables_.rows(), width);
    return;
  }
  const torch::Tensor grad = gathered_.grad().contiguous();
  coalesce_rows(lookups_, std::span<const float>(grad.data_ptr<float>(), lookups_.size() * width),
                tables_.rows(), width, out);
}

}  // namespace sparsecomm
