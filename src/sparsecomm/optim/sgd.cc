#include "sparsecomm/optim/sgd.h"

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

FlatSgd::FlatSgd(SgdOptions options) : options_(options) {
  if (!(options_.momentum >= 0.0 && options_.momentum < 1.0)) {
    throw InvalidArgument(fmt::format("[sgd] momentum {} must lie in [0, 1)", options_.momentum));
  }
  if (!(options_.weight_decay >= 0.0)) {
    throw InvalidArgument(fmt::format("[sgd] weight decay {} must be >= 0", options_.weight_decay));
  }
  if (options_.nesterov && options_.momentum == 0.0) {
    throw InvalidArgument("[sgd] Nesterov momentum needs momentum > 0");
  }
}

void FlatSgd::step(std::span<float> parameters, std::span<const float> gradient,
                   double learning_rate, double share) {
  if (parameters.size() != gradient.size()) {
    throw InvalidArgument(fmt::format("[sgd] {} parameters but {} gradient elements",
                                      parameters.size(), gradient.size()));
  }
  const float lr = static_cast<float>(learning_rate);
  if (!(share > 0.0 && share <= 1.0)) {
    throw InvalidArgument(fmt::format("[sgd] share {} of a step: must be in (0, 1]", share));
  }
  const float wd = static_cast<float>(options_.weight_decay);
  const float c = static_cast<float>(share);
  const float mu = static_cast<float>(options_.momentum);
  const std::size_t n = parameters.size();
  float* p = parameters.data();
  const float* g = gradient.data();
  if (mu == 0.0f) {
    for (std::size_t i = 0; i < n; ++i) p[i] -= lr * (c * (g[i] + wd * p[i]));
    return;
  }
  if (momentum_buffer_.size() != n) momentum_buffer_.assign(n, 0.0f);
  float* b = momentum_buffer_.data();
  const bool first = !started_;
  started_ = true;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = c * (g[i] + wd * p[i]);
    b[i] = first ? d : mu * b[i] + d;
    p[i] -= lr * (options_.nesterov ? d + mu * b[i] : b[i]);
  }
}

void FlatSgd::save(StateWriter& writer) const {
  writer.tag("sgd");
  writer.value<std::uint8_t>(started_ ? 1 : 0);
  writer.array<float>(momentum_buffer_);
}

void FlatSgd::load(StateReader& reader) {
  reader.expect_tag("sgd");
  started_ = reader.value<std::uint8_t>() != 0;
  momentum_buffer_ = reader.array<float>();
}

}  // namespace sparsecomm
