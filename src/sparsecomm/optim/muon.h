#pragma once
// Muon (Jordan et al.; with the update scale of Moonlight, Liu et al. 2025)
// on one flat parameter vector that holds some matrices. Each matrix W
// (rows x cols, row-major at its offset: a linear layer's weight, a
// convolution's filters as out x in*kh*kw) steps on the orthogonalized
// momentum of its gradient; every other element (embedding tables, the
// output layer, biases and norms: what the caller leaves out of the
// matrices) steps with AdamW:
//
//   M = mu M + (1 - mu) G
//   U = nesterov ? (1 - mu) G + mu M : M
//   W -= lr * wd * W        (wd: AdamW's weight decay)
//   W -= lr * 0.2 * sqrt(max(rows, cols)) * NS(U)      (newton_schulz.h)
//
// The factor 0.2 sqrt(max(rows, cols)) gives the update about the RMS of
// AdamW's (0.2), so that AdamW's learning rate and weight decay carry over.
// The orthogonalized update does not scale with the gradient: a share s < 1
// of a step (a parameter server's push) scales the learning rate, as in
// FlatAdamW. Deterministic: fixed loop orders, no threads.

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecomm/optim/adamw.h"
#include "sparsecomm/optim/newton_schulz.h"
#include "sparsecomm/optim/optimizer.h"

namespace sparsecomm {

class FlatMuon final : public FlatOptimizer {
 public:
  // InvalidArgument for momentum outside [0, 1), fewer than 1 iteration,
  // no matrix, matrices that overlap, are out of order or are empty, or
  // invalid AdamW options.
  FlatMuon(MuonOptions options, AdamWOptions rest);

  std::string_view name() const override { return "muon"; }
  // InvalidArgument when a matrix ends past the vector's end or the length
  // changes after the first step.
  void step(std::span<float> parameters, std::span<const float> gradient, double learning_rate,
            double share = 1.0) override;

  const MuonOptions& options() const { return options_; }
  // Every matrix's momentum, at the matrices' offsets (zeros elsewhere).
  std::span<const float> momentum() const { return momentum_; }

  void save(StateWriter& writer) const override;
  void load(StateReader& reader) override;

 private:
  // The elements outside every matrix, as [begin, end) ranges.
  void find_rest(std::size_t numel);

  MuonOptions options_;
  FlatAdamW rest_optimizer_;
  std::vector<float> momentum_;
  std::vector<std::pair<std::size_t, std::size_t>> rest_ranges_;
  std::size_t rest_numel_ = 0;  // the length rest_ranges_ was found for
  std::vector<float> rest_parameters_, rest_gradient_, update_;
  NewtonSchulzScratch scratch_;
  std::int64_t steps_ = 0;
};

}  // namespace sparsecomm
