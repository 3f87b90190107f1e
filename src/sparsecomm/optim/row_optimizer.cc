#include "sparsecomm/optim/row_optimizer.h"

#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

// The gradient well formed and the table its size.
void check_step(std::string_view who, std::span<const float> table, const RowSparse& gradient,
                double gradient_scale) {
  check_row_sparse(gradient, who);
  if (table.size() != gradient.rows * gradient.width) {
    throw InvalidArgument(fmt::format("[{}] the table has {} floats, a {} x {} gradient needs {}",
                                      who, table.size(), gradient.rows, gradient.width,
                                      gradient.rows * gradient.width));
  }
  if (!std::isfinite(gradient_scale)) {
    throw InvalidArgument(fmt::format("[{}] gradient scale {} is not finite", who, gradient_scale));
  }
}

}  // namespace

RowSgd::RowSgd(RowSgdOptions options) : options_(options) {
  if (!(options_.momentum >= 0.0 && options_.momentum < 1.0)) {
    throw InvalidArgument(
        fmt::format("[row-sgd] momentum {} must lie in [0, 1)", options_.momentum));
  }
  if (!(options_.weight_decay >= 0.0)) {
    throw InvalidArgument(
        fmt::format("[row-sgd] weight decay {} must be >= 0", options_.weight_decay));
  }
}

void RowSgd::step(std::span<float> table, const RowSparse& gradient, double learning_rate,
                  double gradient_scale) {
  check_step("row-sgd", table, gradient, gradient_scale);
  const std::size_t width = gradient.width;
  const auto lr = static_cast<float>(learning_rate);
  const auto scale = static_cast<float>(gradient_scale);
  const auto wd = static_cast<float>(options_.weight_decay);
  const auto mu = static_cast<float>(options_.momentum);
  if (mu > 0.0f && momentum_.size() != table.size()) {
    momentum_.assign(table.size(), 0.0f);
    started_.assign(gradient.rows, 0);
  }
  for (std::size_t j = 0; j < gradient.touched(); ++j) {
    const std::size_t row = gradient.ids[j];
    float* p = table.data() + row * width;
    const float* g = gradient.values.data() + j * width;
    if (mu == 0.0f) {
      for (std::size_t c = 0; c < width; ++c) p[c] -= lr * (scale * g[c] + wd * p[c]);
      continue;
    }
    float* b = momentum_.data() + row * width;
    const bool first = started_[row] == 0;
    started_[row] = 1;
    for (std::size_t c = 0; c < width; ++c) {
      const float d = scale * g[c] + wd * p[c];
      b[c] = first ? d : mu * b[c] + d;
      p[c] -= lr * b[c];
    }
  }
}

void RowSgd::save(StateWriter& writer) const {
  writer.tag("row-sgd");
  writer.array<float>(momentum_);
  writer.array<std::uint8_t>(started_);
}

void RowSgd::load(StateReader& reader) {
  reader.expect_tag("row-sgd");
  momentum_ = reader.array<float>();
  started_ = reader.array<std::uint8_t>();
}

RowAdagrad::RowAdagrad(RowAdagradOptions options) : options_(options) {
  if (!(options_.eps > 0.0)) {
    throw InvalidArgument(fmt::format("[row-adagrad] eps {} must be > 0", options_.eps));
  }
  if (!(options_.initial_accumulator >= 0.0)) {
    throw InvalidArgument(fmt::format("[row-adagrad] initial accumulator {} must be >= 0",
                                      options_.initial_accumulator));
  }
  if (!(options_.weight_decay >= 0.0)) {
    throw InvalidArgument(
        fmt::format("[row-adagrad] weight decay {} must be >= 0", options_.weight_decay));
  }
}

void RowAdagrad::step(std::span<float> table, const RowSparse& gradient, double learning_rate,
                      double gradient_scale) {
  check_step("row-adagrad", table, gradient, gradient_scale);
  const std::size_t width = gradient.width;
  if (accumulators_.size() != gradient.rows) {
    accumulators_.assign(gradient.rows, static_cast<float>(options_.initial_accumulator));
  }
  const auto lr = static_cast<float>(learning_rate);
  const auto scale = static_cast<float>(gradient_scale);
  const auto wd = static_cast<float>(options_.weight_decay);
  const auto eps = static_cast<float>(options_.eps);
  scaled_.resize(width);
  float* d = scaled_.data();
  for (std::size_t j = 0; j < gradient.touched(); ++j) {
    const std::size_t row = gradient.ids[j];
    float* p = table.data() + row * width;
    const float* g = gradient.values.data() + j * width;
    float squares = 0.0f;
    for (std::size_t c = 0; c < width; ++c) {
      d[c] = scale * g[c] + wd * p[c];
      squares += d[c] * d[c];
    }
    accumulators_[row] += squares / static_cast<float>(width);
    const float step = lr / (std::sqrt(accumulators_[row]) + eps);
    for (std::size_t c = 0; c < width; ++c) p[c] -= step * d[c];
  }
}

void RowAdagrad::save(StateWriter& writer) const {
  writer.tag("row-adagrad");
  writer.array<float>(accumulators_);
}

void RowAdagrad::load(StateReader& reader) {
  reader.expect_tag("row-adagrad");
  accumulators_ = reader.array<float>();
}

}  // namespace sparsecomm
