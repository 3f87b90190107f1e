#include "sparsecomm/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

LrDecay parse_lr_decay(std::string_view name) {
  if (name == "none") return LrDecay::kNone;
  if (name == "step") return LrDecay::kStep;
  if (name == "cosine") return LrDecay::kCosine;
  throw InvalidArgument(
      fmt::format("unknown learning-rate decay '{}'; valid: none, step, cosine", name));
}

std::string_view lr_decay_name(LrDecay decay) {
  switch (decay) {
    case LrDecay::kNone:
      return "none";
    case LrDecay::kStep:
      return "step";
    case LrDecay::kCosine:
      return "cosine";
  }
  return "none";
}

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  if (!(options_.base > 0.0) || !std::isfinite(options_.base)) {
    throw InvalidArgument(fmt::format("[lr] learning rate {} must be > 0", options_.base));
  }
  if (options_.warmup_steps < 0) {
    throw InvalidArgument(
        fmt::format("[lr] warm-up of {} steps must be >= 0", options_.warmup_steps));
  }
  if (!(options_.gamma > 0.0 && options_.gamma <= 1.0)) {
    throw InvalidArgument(
        fmt::format("[lr] decay factor gamma {} must lie in (0, 1]", options_.gamma));
  }
  if (!std::is_sorted(options_.milestones.begin(), options_.milestones.end())) {
    throw InvalidArgument("[lr] step-decay milestones must be in increasing order");
  }
  if (options_.decay == LrDecay::kCosine && options_.total_steps <= 0) {
    throw InvalidArgument("[lr] cosine decay needs the run's total number of steps (> 0)");
  }
  if (!(options_.min_factor >= 0.0 && options_.min_factor <= 1.0)) {
    throw InvalidArgument(
        fmt::format("[lr] min_factor {} must lie in [0, 1]", options_.min_factor));
  }
}

double LrSchedule::at(std::int64_t step) const {
  const LrScheduleOptions& o = options_;
  if (step < o.warmup_steps) {
    return o.base * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  switch (o.decay) {
    case LrDecay::kNone:
      return o.base;
    case LrDecay::kStep: {
      double lr = o.base;
      for (const std::int64_t milestone : o.milestones) {
        if (step >= milestone) lr *= o.gamma;
      }
      return lr;
    }
    case LrDecay::kCosine: {
      const double span =
          std::max<double>(1.0, static_cast<double>(o.total_steps - o.warmup_steps));
      const double progress =
          std::clamp(static_cast<double>(step - o.warmup_steps) / span, 0.0, 1.0);
      const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      return o.base * (o.min_factor + (1.0 - o.min_factor) * cosine);
    }
  }
  return o.base;
}

}  // namespace sparsecomm
