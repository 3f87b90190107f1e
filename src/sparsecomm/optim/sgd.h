#pragma once
// SGD with momentum (heavy-ball or Nesterov) and weight decay on one flat
// parameter vector, applied after gradient synchronization (as the
// reference ExDyna code and PyTorch's torch.optim.SGD do):
//
//   d = share * (g + wd * p)    (share = 1 unless the update is a part of a step)
//   b = mu * b + d              (b starts at d on the first step)
//   d = nesterov ? d + mu * b : b
//   p -= lr * d
//
// With momentum 0 the buffer is unused (DGC applies momentum itself).
// Deterministic: one fixed loop order, no threads.

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecomm/optim/optimizer.h"

namespace sparsecomm {

class FlatSgd final : public FlatOptimizer {
 public:
  // InvalidArgument for momentum outside [0, 1), negative weight decay, or
  // Nesterov without momentum.
  explicit FlatSgd(SgdOptions options);

  // One step on `parameters` with the synchronized `gradient` (same length).
  // `share` < 1: this update is that share of one synchronous step, and
  // d = share * (g + wd * p) (weight decay included), so that e.g. W
  // asynchronous pushes of a parameter server, each with share 1/W, weigh
  // one synchronous step.
  std::string_view name() const override { return "sgd"; }
  void step(std::span<float> parameters, std::span<const float> gradient, double learning_rate,
            double share = 1.0) override;

  const SgdOptions& options() const { return options_; }
  void save(StateWriter& writer) const override;
  void load(StateReader& reader) override;

 private:
  SgdOptions options_;
  std::vector<float> momentum_buffer_;
  bool started_ = false;
};

}  // namespace sparsecomm
