#include "sparsecomm/optim/adamw.h"

#include <cmath>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

FlatAdamW::FlatAdamW(AdamWOptions options) : options_(options) {
  const auto check_beta = [](double beta, const char* name) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      throw InvalidArgument(fmt::format("[adamw] {} = {} must lie in [0, 1)", name, beta));
    }
  };
  check_beta(options_.beta1, "beta1");
  check_beta(options_.beta2, "beta2");
  if (!(options_.eps > 0.0 && std::isfinite(options_.eps))) {
    throw InvalidArgument(fmt::format("[adamw] eps = {} must be > 0", options_.eps));
  }
  if (!(options_.weight_decay >= 0.0 && std::isfinite(options_.weight_decay))) {
    throw InvalidArgument(
        fmt::format("[adamw] weight decay {} must be >= 0", options_.weight_decay));
  }
  if (options_.freeze_variance_after < 0) {
    throw InvalidArgument(fmt::format("[adamw] freeze_variance_after = {} must be >= 0 (0: never)",
                                      options_.freeze_variance_after));
  }
}

void FlatAdamW::step(std::span<float> parameters, std::span<const float> gradient,
                     double learning_rate, double share) {
  if (parameters.size() != gradient.size()) {
    throw InvalidArgument(fmt::format("[adamw] {} parameters but {} gradient elements",
                                      parameters.size(), gradient.size()));
  }
  if (!(share > 0.0 && share <= 1.0)) {
    throw InvalidArgument(fmt::format("[adamw] share {} of a step: must be in (0, 1]", share));
  }
  const Coefficients c = advance(parameters.size());
  const double lr = learning_rate * share;
  const auto decay = static_cast<float>(1.0 - lr * options_.weight_decay);
  const auto step_size = static_cast<float>(lr / c.bias1);
  float* p = parameters.data();
  const float* g = gradient.data();
  float* m = m_.data();
  float* v = v_.data();
  for (std::size_t i = 0, n = parameters.size(); i < n; ++i) {
    p[i] *= decay;
    m[i] = c.keep1 * m[i] + c.take1 * g[i];
    if (c.update_v) v[i] = c.keep2 * v[i] + c.take2 * g[i] * g[i];
    p[i] -= step_size * (m[i] / (std::sqrt(v[i]) / c.bias2_sqrt + c.eps));
  }
}

void FlatAdamW::direction(std::span<float> gradient) {
  const Coefficients c = advance(gradient.size());
  const auto inv_bias1 = static_cast<float>(1.0 / c.bias1);
  float* g = gradient.data();
  float* m = m_.data();
  float* v = v_.data();
  for (std::size_t i = 0, n = gradient.size(); i < n; ++i) {
    m[i] = c.keep1 * m[i] + c.take1 * g[i];
    if (c.update_v) v[i] = c.keep2 * v[i] + c.take2 * g[i] * g[i];
    g[i] = inv_bias1 * (m[i] / (std::sqrt(v[i]) / c.bias2_sqrt + c.eps));
  }
}

FlatAdamW::Coefficients FlatAdamW::advance(std::size_t n) {
  if (m_.size() != n) {
    if (steps_ > 0) {
      throw InvalidArgument(
          fmt::format("[adamw] {} elements, but the moments have {}", n, m_.size()));
    }
    m_.assign(n, 0.0f);
    v_.assign(n, 0.0f);
  }
  const std::int64_t freeze = options_.freeze_variance_after;
  variance_frozen_ = freeze > 0 && steps_ >= freeze;
  ++steps_;
  if (!variance_frozen_) ++variance_steps_;
  // Scalars in double, as torch computes them; elements in float.
  const double b1 = options_.beta1;
  const double b2 = options_.beta2;
  Coefficients c;
  c.keep1 = static_cast<float>(b1);
  c.take1 = static_cast<float>(1.0 - b1);
  c.keep2 = static_cast<float>(b2);
  c.take2 = static_cast<float>(1.0 - b2);
  c.bias1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
  c.bias2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(variance_steps_))));
  c.eps = static_cast<float>(options_.eps);
  c.update_v = !variance_frozen_;
  return c;
}

void FlatAdamW::save(StateWriter& writer) const {
  writer.tag("adamw");
  writer.value<std::int64_t>(steps_);
  writer.value<std::int64_t>(variance_steps_);
  writer.value<std::uint8_t>(variance_frozen_ ? 1 : 0);
  writer.array<float>(m_);
  writer.array<float>(v_);
}

void FlatAdamW::load(StateReader& reader) {
  reader.expect_tag("adamw");
  steps_ = reader.value<std::int64_t>();
  variance_steps_ = reader.value<std::int64_t>();
  variance_frozen_ = reader.value<std::uint8_t>() != 0;
  m_ = reader.array<float>();
  v_ = reader.array<float>();
  if (m_.size() != v_.size()) {
    throw Error(fmt::format("[adamw] the saved moments differ in length ({} and {})", m_.size(),
                            v_.size()));
  }
}

}  // namespace sparsecomm
