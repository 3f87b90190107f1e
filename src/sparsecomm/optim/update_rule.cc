#include "sparsecomm/optim/update_rule.h"

#include <cmath>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/sgd.h"

namespace sparsecomm {

Compress parse_compress(std::string_view name) {
  if (name == "gradient") return Compress::kGradient;
  if (name == "update") return Compress::kUpdate;
  throw InvalidArgument(fmt::format(
      "'{}' is not what a method can compress; valid: gradient, update (AdamW's local direction)",
      name));
}

std::string_view compress_name(Compress compress) {
  return compress == Compress::kUpdate ? "update" : "gradient";
}

UpdateRule::UpdateRule(const OptimizerOptions& options, Compress compress)
    : compress_(compress), optimizer_name_(options.name) {
  if (compress_ == Compress::kGradient) {
    step_ = make_flat_optimizer(options);
    return;
  }
  if (options.name != "adamw") {
    throw InvalidArgument(fmt::format(
        "compressing the update needs --optimizer adamw (with {} the update is a linear "
        "function of the gradient: compress the gradient)",
        options.name));
  }
  if (options.adamw.freeze_variance_after > 0) {
    throw InvalidArgument(
        "a frozen variance is for compressing the gradient (then AdamW is linear in it); "
        "compressing the update keeps the moments local: drop one of the two");
  }
  local_moments_ = std::make_unique<FlatAdamW>(options.adamw);
  // The average direction, with decoupled weight decay: SGD without
  // momentum applies p -= lr * (u + wd * p), which is exactly that.
  step_ = std::make_unique<FlatSgd>(
      SgdOptions{.momentum = 0.0, .nesterov = false, .weight_decay = options.adamw.weight_decay});
}

void UpdateRule::before_sync(std::span<float> local) {
  if (!local_moments_) return;
  // A gradient that is not finite is passed on as it is, so that the
  // method's --nonfinite policy sees it; the moments are left untouched.
  for (const float x : local) {
    if (!std::isfinite(x)) return;
  }
  local_moments_->direction(local);
}

void UpdateRule::apply(std::span<float> parameters, std::span<const float> synchronized,
                       double learning_rate) {
  step_->step(parameters, synchronized, learning_rate);
}

void UpdateRule::save(StateWriter& writer) const {
  step_->save(writer);
  if (local_moments_) local_moments_->save(writer);
}

void UpdateRule::load(StateReader& reader) {
  step_->load(reader);
  if (local_moments_) local_moments_->load(reader);
}

}  // namespace sparsecomm
