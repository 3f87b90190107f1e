#pragma once
// Local steps with an outer optimizer (DiLoCo's loop; docs/algorithms.md,
// "Local steps"). Every rank takes H steps of its inner optimizer on its own
// data from the anchor x (the last synchronized parameters), then the ranks
// average the pseudo-gradient D_r = x - p_r (through any synchronization
// method: dense, or a sparsifier with error feedback on D) and an outer SGD
// step moves the anchor, which every rank's parameters then restart from:
//
//   v = mu * v + D      (v starts at D)
//   x -= outer_lr * (nesterov ? D + mu * v : v)
//   p_r = x
//
// With H = 1, outer_lr 1, no outer momentum and plain SGD inside, a round is
// one synchronous SGD step (up to the order of rounding: lr * mean(g) is
// computed as mean(lr * g)). LibTorch-free; deterministic.

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecomm/core/state_io.h"
#include "sparsecomm/optim/sgd.h"

namespace sparsecomm {

struct OuterOptions {
  std::int64_t local_steps = 0;  // H >= 1
  // The plain average by default (TrainConfig's outer step); DiLoCo's is
  // lr 0.7, momentum 0.9, Nesterov.
  double lr = 1.0;
  double momentum = 0.0;
  bool nesterov = false;
  // The one-round-delayed variant (train's --outer-overlap): a round's
  // exchange runs during the next round (apply_delayed, begin_overlapped).
  bool overlap = false;
};

class OuterLoop {
 public:
  // The anchor starts at `parameters`. InvalidArgument for H < 1, a
  // learning rate that is not positive and finite, or momentum outside [0, 1).
  OuterLoop(const OuterOptions& options, std::span<const float> parameters);

  std::int64_t local_steps() const { return options_.local_steps; }
  // Whether inner step `step` (counted from 0 over the whole run) ends a round.
  bool ends_round(std::int64_t step) const { return (step + 1) % options_.local_steps == 0; }

  // An inner step's gradient was not finite and was not applied. The round's
  // pseudo-gradient then carries a NaN, so that the method's non-finite
  // policy decides for every rank at the round's end (stop, or drop the round).
  void mark_nonfinite() { nonfinite_ = true; }

  // out = anchor - parameters (NaN in out[0] after mark_nonfinite).
  void pseudo_gradient(std::span<const float> parameters, std::span<float> out) const;
  // The round's end: the outer step with the ranks' mean pseudo-gradient
  // (skipped: the round is dropped, the anchor stays), then parameters = anchor.
  void finish_round(std::span<float> parameters, std::span<const float> mean_pseudo_gradient,
                    bool skipped);

  // The overlapped rounds (OuterOptions::overlap). A round's mean drift M
  // arrives during the next round; at that round's end the rank applies it
  // before its own drift leaves:
  //
  //   x' = outer step of x with M (skipped: x' = x)
  //   p += x' - s      (s: where this rank's round started)
  //
  // so that the round reads as started from x': the rank's own drift of
  // the previous round is replaced by the ranks' mean, exactly once.
  // InvalidArgument when no round has begun an exchange.
  void apply_delayed(std::span<float> parameters, std::span<const float> mean_pseudo_gradient,
                     bool skipped);
  // Then out = x - p (this round's drift, NaN in out[0] after
  // mark_nonfinite) goes to the exchange, and the next round starts at p
  // (s = p). The run's last round ends with finish_round instead, after
  // its own exchange, so that the ranks end on the anchor.
  void begin_overlapped(std::span<const float> parameters, std::span<float> out);

  // The last synchronized parameters: what an evaluation inside a round reads.
  std::span<const float> anchor() const { return anchor_; }

  void save(StateWriter& writer) const;
  void load(StateReader& reader);

 private:
  OuterOptions options_;
  FlatSgd outer_;
  std::vector<float> anchor_;
  std::vector<float> round_start_;  // overlap: s (empty until the first exchange begins)
  bool nonfinite_ = false;
};

}  // namespace sparsecomm
