#pragma once
// Optimizers that update only the touched rows of an embedding table (lazy
// updates) from a row-sparse gradient (core/row_sparse.h); the table is a
// rows x width float buffer, row-major. Nothing here is the size of the
// table except the table itself and, with momentum, its momentum buffer.
//
// RowSgd, for each touched row j (g = gradient_scale * the row's gradient):
//   d = g + wd * p_j
//   b_j = mu * b_j + d    (b_j starts at d on the row's first touch)
//   p_j -= lr * (mu > 0 ? b_j : d)
// RowAdagrad, row-wise as recommendation models use it (one accumulator per
// row, not per element):
//   d = g + wd * p_j
//   G_j += mean over the row of d^2
//   p_j -= lr * d / (sqrt(G_j) + eps)
//
// Lazy: an untouched row neither decays nor moves, and keeps its momentum
// and accumulator for its next touch, where a dense optimizer would apply
// weight decay and the momentum of earlier steps to every row every step.
// With momentum 0 and weight decay 0, lazy SGD is dense SGD (a zero
// gradient row does not move), bit for bit. Deterministic: one loop order.

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecomm/core/row_sparse.h"
#include "sparsecomm/core/state_io.h"

namespace sparsecomm {

struct RowSgdOptions {
  double momentum = 0.0;
  double weight_decay = 0.0;
};

class RowSgd {
 public:
  // InvalidArgument for momentum outside [0, 1) or negative weight decay.
  explicit RowSgd(RowSgdOptions options);

  // One step on `table` (gradient.rows x gradient.width floats) with the
  // checked row-sparse gradient, each row scaled by gradient_scale (1/n
  // turns a sum over n ranks into their mean).
  void step(std::span<float> table, const RowSparse& gradient, double learning_rate,
            double gradient_scale = 1.0);

  void save(StateWriter& writer) const;
  void load(StateReader& reader);

 private:
  RowSgdOptions options_;
  std::vector<float> momentum_;        // rows x width, allocated on the first step with momentum
  std::vector<std::uint8_t> started_;  // per row: momentum_ holds its buffer
};

struct RowAdagradOptions {
  double eps = 1e-8;
  double initial_accumulator = 0.0;
  double weight_decay = 0.0;
};

class RowAdagrad {
 public:
  // InvalidArgument for eps <= 0, a negative initial accumulator or weight decay.
  explicit RowAdagrad(RowAdagradOptions options);

  // As RowSgd::step.
  void step(std::span<float> table, const RowSparse& gradient, double learning_rate,
            double gradient_scale = 1.0);

  // G_j of every row (empty before the first step).
  std::span<const float> accumulators() const { return accumulators_; }

  void save(StateWriter& writer) const;
  void load(StateReader& reader);

 private:
  RowAdagradOptions options_;
  std::vector<float> accumulators_;  // one per row
  std::vector<float> scaled_;        // one row's d, reused across steps
};

}  // namespace sparsecomm
