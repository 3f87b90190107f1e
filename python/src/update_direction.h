#pragma once
// UpdateDirection: one rank's AdamW moments for compress="update"
// (optim/update_rule.h); the DDP hook's worker applies them to a group
// before its exchange (hook_worker.cc).

#include <span>

#include <ATen/Tensor.h>
#include <pybind11/pybind11.h>

#include "conversions.h"
#include "sparsecomm/optim/optimizer.h"
#include "sparsecomm/optim/update_rule.h"

namespace sparsecomm::python {

// One rank's AdamW moments over one flat gradient, for the hook's
// compress="update": the gradient is replaced by the direction AdamW would
// apply (without lr and weight decay), which the method then synchronizes.
class UpdateDirection {
 public:
  UpdateDirection(double beta1, double beta2, double eps)
      : rule_(options_of(beta1, beta2, eps), Compress::kUpdate) {}

  void direction(const at::Tensor& gradient) {
    const std::span<float> values = floats_of(gradient, "the gradient");
    const pybind11::gil_scoped_release release;
    apply(values);
  }
  void apply(std::span<float> gradient) { rule_.before_sync(gradient); }
  pybind11::bytes state() const { return state_of(rule_); }
  void load_state(const pybind11::bytes& state) { load_state_into(rule_, state); }

 private:
  static OptimizerOptions options_of(double beta1, double beta2, double eps) {
    OptimizerOptions options;
    options.name = "adamw";
    options.adamw.beta1 = beta1;
    options.adamw.beta2 = beta2;
    options.adamw.eps = eps;
    options.adamw.weight_decay = 0.0;  // the optimizer applies it (docs/python.md)
    return options;
  }
  UpdateRule rule_;
};

}  // namespace sparsecomm::python
