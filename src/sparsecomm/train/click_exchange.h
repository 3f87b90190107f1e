#pragma once
// The click model's embedding tables between the ranks, one rank's side
// (internal to train/; docs/algorithms.md, "The click model"). Each step's
// table gradient is summed over the ranks: replicated tables by
// row_sparse_sum (collectives/row_exchange.h: the allgather or the split
// all-reduce, under "auto" the one the last step's figures favour) or, for
// comparison, densified and ring all-reduced ("dense"); sharded tables push
// it to the rows' owners, and pull each batch's rows from them first.
// Every method that sends is a collective: every rank calls it, in the
// same order.

#include <cstddef>
#include <string>

#include "sparsecomm/collectives/row_exchange.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/row_sparse.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/data/click_log.h"
#include "sparsecomm/train/click_model.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/train_records.h"

namespace sparsecomm {

class EmbeddingExchange {
 public:
  // config.embedding_exchange (auto, allgather, sparse-allreduce, dense or
  // sharded) and config.embedding_values choose the exchange and its value
  // format; `tables` are the rows this rank stores (every row unless
  // sharded). Keeps references to all three.
  EmbeddingExchange(Communicator& comm, const TrainConfig& config, const EmbeddingTables& tables);

  // Sharded tables: pulled() = the batch's rows from their owners. Adds the
  // pull's bytes and time to the record; returns the time.
  double pull_batch_rows(const ClickBatch& batch, EmbeddingStep& record);
  // The rows of the last pull_batch_rows(), ids ascending.
  const RowSparse& pulled() const { return pulled_; }

  // This rank's coalesced table gradient, for the caller to fill
  // (ClickModel::table_gradient) before exchange().
  RowSparse& gradient() { return mine_; }
  // Sums gradient() over the ranks into stored_sum(); fills the record's
  // exchange, touched rows (all tables and per table), union, bytes and
  // time.
  void exchange(EmbeddingStep& record);
  // Whether the sum is finite (sharded: every owner's; the same answer on
  // every rank).
  bool sum_finite() const;
  // The summed table gradient of the rows this rank stores, ids relative
  // to tables.first(): the whole sum for replicated tables, the owned
  // range's for sharded ones.
  const RowSparse& stored_sum() const { return sharded_ ? owned_ : sum_; }
  // After a "dense" step's update: gives the buffers stored_sum() borrowed
  // back to the dense comparison.
  void restore_dense_buffers();

  // The last step's figures that choose the next "auto" exchange (a
  // checkpoint's part of this object).
  void save(StateWriter& state) const;
  void load(StateReader& state);

 private:
  std::string choose_exchange() const;
  void unique_lookups(const ClickBatch& batch, UninitVector<Index>& ids) const;
  void push_to_owners(EmbeddingStep& record);
  void dense_allreduce(EmbeddingStep& record);

  Communicator& comm_;
  const TrainConfig& config_;
  const EmbeddingTables& tables_;
  // Split over the ranks (--embedding-exchange sharded) or replicated.
  const bool sharded_ = config_.embedding_exchange == "sharded";
  RowSparse mine_;  // this rank's coalesced table gradient
  RowSparse sum_;   // the sum over ranks (replicated tables)
  // Sharded tables: the batch's rows, fetched; the owned range's sum.
  UninitVector<Index> wanted_;
  RowSparse pulled_;
  RowSparse owned_;
  bool owned_finite_everywhere_ = true;
  RowExchangeReport last_;
  UninitVector<float> dense_;      // the dense comparison's buffer
  UninitVector<Index> every_row_;  // 0 .. rows - 1, for the dense comparison
};

}  // namespace sparsecomm
