#pragma once
// The click model's held-out evaluation, its figures (internal to train/):
// log-loss, AUC and accuracy at 0.5 over the held-out rows, each rank a
// slice, and how well trained the rows of the held-out lookups are. The
// click trainer runs the model over its slice; these count.

#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/train/click_model.h"
#include "sparsecomm/train/evaluation.h"
#include "sparsecomm/train/train_records.h"

namespace sparsecomm {

// One evaluation's counts on one rank, as integers, so that their sum over
// the ranks is the same on every backend: the predictions right at 0.5,
// the log-loss and the training loss since the last evaluation (x 1e6,
// rounded once per rank), the held-out lookups by how many steps updated
// their row, and per label a histogram of the predicted probability, from
// which the AUC is computed (equal bins; ties within a bin count half).
class ClickEvalSums {
 public:
  ClickEvalSums();

  // One held-out row: the model's logit and whether it was clicked.
  void add_prediction(double logit, bool clicked);
  // `lookups` lookups of a row that `updates` steps updated.
  void add_lookups(std::uint16_t updates, std::int64_t lookups);
  // After the last add: this rank's counts with its loss sums rounded in,
  // the training loss `train_loss_sum` over `train_loss_count` steps
  // included; sum them over the ranks in place (an all-reduce) before
  // eval() and lookups_by_updates().
  std::span<std::int64_t> finish(double train_loss_sum, std::int64_t train_loss_count);

  // Summed over the ranks: the evaluation at `point` of `count` held-out
  // rows, with its AUC (NaN without both labels).
  TrainEval eval(const EvalPoint& point, std::int64_t count) const;
  // Summed over the ranks: the held-out lookups' shares by their row's
  // updates ("0", "1-9", "10-99", "100+"); null when none were counted.
  nlohmann::json lookups_by_updates() const;

 private:
  double loss_sum_ = 0.0;  // this rank's held-out log-loss until finish()
  std::vector<std::int64_t> sums_;
};

// Adds a chunk's held-out lookups (stacked row ids; empty where this rank's
// part of the chunk has no rows) to `sums` by how many steps updated their
// row: row_updates[r] counts those of the stored row tables.first() + r.
// Replicated tables (`sharded` false: every row stored) count them here;
// sharded ones push the lookups' counts per row to the rows' owners, which
// count them: a collective, every rank calls it for every chunk.
void count_lookups_by_updates(Communicator& comm, std::span<const Index> lookups,
                              const EmbeddingTables& tables,
                              std::span<const std::uint16_t> row_updates, bool sharded,
                              ClickEvalSums& sums);

}  // namespace sparsecomm
