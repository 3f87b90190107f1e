#pragma once
// AdamW (Loshchilov and Hutter: Adam with decoupled weight decay) on one flat
// parameter vector, the update of torch.optim.AdamW; Adam is AdamW with
// weight decay 0. Per element, at step t (from 1):
//
//   p -= lr * wd * p
//   m  = b1 * m + (1 - b1) * g
//   v  = b2 * v + (1 - b2) * g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//
// A share s < 1 of a step moves the parameters s times as far (lr * s, in
// the weight decay too) and updates the moments as a whole step does: as in
// FlatSgd, an instance is meant to be stepped once per step of whoever owns
// it (a parameter server keeps one per worker under ASP/SSP/DSSP, each
// stepped by that worker's pushes with share 1/W). Adam's update does not
// scale with the gradient, so the share scales the learning rate instead.
//
// Frozen variance (1-bit Adam's design): with freeze_variance_after = N > 0,
// from step N + 1 on v and its bias correction stay as they were after
// step N, and the update is momentum SGD preconditioned by the frozen
// 1 / (sqrt(v) + eps): linear in the gradient, so error feedback on the
// gradient loses nothing to the optimizer's nonlinearity.
//
// direction() is the same recursion without parameters: it replaces a
// gradient by the update AdamW would make of it (without lr and weight
// decay), for the design in which every rank runs the moments on its own
// gradient and the method synchronizes that direction (update_rule.h).
//
// Deterministic: one fixed loop order, no threads.

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecomm/optim/optimizer.h"

namespace sparsecomm {

class FlatAdamW final : public FlatOptimizer {
 public:
  // InvalidArgument for betas outside [0, 1), eps <= 0 or negative weight decay.
  explicit FlatAdamW(AdamWOptions options);

  std::string_view name() const override { return "adamw"; }
  void step(std::span<float> parameters, std::span<const float> gradient, double learning_rate,
            double share = 1.0) override;

  // Advances the moments with `gradient` and overwrites it with
  // m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps).
  void direction(std::span<float> gradient);

  bool variance_frozen() const { return variance_frozen_; }

  const AdamWOptions& options() const { return options_; }
  // The moments (empty before the first step): for tests and diagnostics.
  std::span<const float> first_moment() const { return m_; }
  std::span<const float> second_moment() const { return v_; }

  void save(StateWriter& writer) const override;
  void load(StateReader& reader) override;

 private:
  struct Coefficients {
    float keep1, take1, keep2, take2;
    double bias1;
    float bias2_sqrt, eps;
    bool update_v;
  };
  // Counts one step (sizing the moments on the first) and returns its
  // coefficients; InvalidArgument when the length changes after a step.
  Coefficients advance(std::size_t n);

  AdamWOptions options_;
  std::vector<float> m_;
  std::vector<float> v_;
  std::int64_t steps_ = 0;           // t
  std::int64_t variance_steps_ = 0;  // t of v's bias correction (stops when frozen)
  bool variance_frozen_ = false;
};

}  // namespace sparsecomm
