#include "sparsecomm/optim/outer_loop.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

const OuterOptions& checked(const OuterOptions& options) {
  if (options.local_steps < 1) {
    throw InvalidArgument(
        fmt::format("[outer] {} local steps: a round needs at least 1", options.local_steps));
  }
  if (!(options.lr > 0.0) || !std::isfinite(options.lr)) {
    throw InvalidArgument(fmt::format("[outer] outer learning rate {} must be > 0", options.lr));
  }
  if (!(options.momentum >= 0.0 && options.momentum < 1.0)) {
    throw InvalidArgument(
        fmt::format("[outer] outer momentum {} must lie in [0, 1)", options.momentum));
  }
  return options;
}

}  // namespace

OuterLoop::OuterLoop(const OuterOptions& options, std::span<const float> parameters)
    : options_(checked(options)),
      outer_(SgdOptions{.momentum = options.momentum,
                        .nesterov = options.nesterov && options.momentum > 0.0,
                        .weight_decay = 0.0}),
      anchor_(parameters.begin(), parameters.end()) {}

void OuterLoop::pseudo_gradient(std::span<const float> parameters, std::span<float> out) const {
  for (std::size_t i = 0; i < anchor_.size(); ++i) out[i] = anchor_[i] - parameters[i];
  if (nonfinite_ && !out.empty()) out[0] = std::numeric_limits<float>::quiet_NaN();
}

void OuterLoop::finish_round(std::span<float> parameters,
                             std::span<const float> mean_pseudo_gradient, bool skipped) {
  if (!skipped) outer_.step(anchor_, mean_pseudo_gradient, options_.lr);
  std::copy(anchor_.begin(), anchor_.end(), parameters.begin());
  nonfinite_ = false;
}

void OuterLoop::apply_delayed(std::span<float> parameters,
                              std::span<const float> mean_pseudo_gradient, bool skipped) {
  if (round_start_.size() != anchor_.size()) {
    throw InvalidArgument("[outer] apply_delayed: no round has begun an exchange");
  }
  if (!skipped) outer_.step(anchor_, mean_pseudo_gradient, options_.lr);
  for (std::size_t i = 0; i < anchor_.size(); ++i) parameters[i] += anchor_[i] - round_start_[i];
}

void OuterLoop::begin_overlapped(std::span<const float> parameters, std::span<float> out) {
  pseudo_gradient(parameters, out);
  round_start_.assign(parameters.begin(), parameters.end());
  nonfinite_ = false;
}

void OuterLoop::save(StateWriter& writer) const {
  writer.tag("outer-loop");
  writer.array<float>(anchor_);
  writer.value<std::uint8_t>(nonfinite_ ? 1 : 0);
  outer_.save(writer);
  if (options_.overlap) writer.array<float>(round_start_);
}

void OuterLoop::load(StateReader& reader) {
  reader.expect_tag("outer-loop");
  reader.array_into<float>(anchor_);
  nonfinite_ = reader.value<std::uint8_t>() != 0;
  outer_.load(reader);
  if (options_.overlap) {
    round_start_ = reader.array<float>();
    if (!round_start_.empty() && round_start_.size() != anchor_.size()) {
      throw Error(fmt::format("[outer] saved round start has {} elements, expected {}",
                              round_start_.size(), anchor_.size()));
    }
  }
}

}  // namespace sparsecomm
