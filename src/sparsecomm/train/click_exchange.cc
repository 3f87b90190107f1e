#include "sparsecomm/train/click_exchange.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/estimate.h"

namespace sparsecomm {

EmbeddingExchange::EmbeddingExchange(Communicator& comm, const TrainConfig& config,
                                     const EmbeddingTables& tables)
    : comm_(comm), config_(config), tables_(tables) {}

// The exchange of this step: the configured one, or under "auto" the
// one that receives fewer rows by the last step's figures (identical on
// every rank): the allgather (n - 1) m (m: the ranks' mean touched rows),
// the row-sparse all-reduce about (n - 1) / n (m + U) (U: the union), so
// the latter when U < (n - 1) m. The first step takes the allgather,
// which also wins a tie (one phase instead of two).
std::string EmbeddingExchange::choose_exchange() const {
  if (config_.embedding_exchange != "auto") return config_.embedding_exchange;
  // (sharded runs never ask: their tables are split, not replicated)
  if (last_.touched.empty()) return "allgather";
  const double mean_touched = static_cast<double>(std::accumulate(
                                  last_.touched.begin(), last_.touched.end(), std::size_t{0})) /
                              static_cast<double>(last_.touched.size());
  return static_cast<double>(last_.union_rows) < (comm_.size() - 1) * mean_touched
             ? "sparse-allreduce"
             : "allgather";
}

// wanted_ = the batch's rows (ascending), pulled_ = those rows from their
// owners.
double EmbeddingExchange::pull_batch_rows(const ClickBatch& batch, EmbeddingStep& record) {
  const Stopwatch watch;
  unique_lookups(batch, wanted_);
  const TableLayout& layout = tables_.layout();
  RowExchangeReport report;
  pull_rows_from_owners(comm_, wanted_, tables_.values(), layout.rows(), layout.width(), pulled_,
                        &report, parse_value_encoding(config_.embedding_values));
  record.bytes_sent += report.bytes_sent;
  record.bytes_received += report.bytes_received;
  const double seconds = watch.seconds();
  record.exchange_s += seconds;
  return seconds;
}

// The batch's stacked row ids, ascending, each once.
void EmbeddingExchange::unique_lookups(const ClickBatch& batch, UninitVector<Index>& ids) const {
  tables_.layout().stack(batch, ids);
  std::sort(ids.begin(), ids.end());
  ids.resize(static_cast<std::size_t>(std::unique(ids.begin(), ids.end()) - ids.begin()));
}

bool EmbeddingExchange::sum_finite() const {
  // Replicated tables: the sum is the same on every rank, so all agree
  // without a message; sharded ones agreed in push_to_owners().
  return sharded_ ? owned_finite_everywhere_ : all_finite(sum_.values);
}

void EmbeddingExchange::exchange(EmbeddingStep& record) {
  const TableLayout& tables = tables_.layout();
  record.present = true;
  record.exchange = choose_exchange();
  record.touched_rows = mine_.touched();
  record.table_touched.assign(tables.tables(), 0);
  for (std::size_t j = 0, f = 0; j < mine_.ids.size(); ++j) {
    while (mine_.ids[j] >= tables.offset(f + 1)) ++f;
    ++record.table_touched[f];
  }
  const Stopwatch watch;
  if (record.exchange == "dense") {
    dense_allreduce(record);
  } else if (sharded_) {
    push_to_owners(record);
  } else {
    row_sparse_sum(comm_, mine_, parse_row_exchange(record.exchange), sum_, &last_,
                   parse_value_encoding(config_.embedding_values));
    record.union_rows = last_.union_rows;
    record.bytes_sent = last_.bytes_sent;
    record.bytes_received = last_.bytes_received;
  }
  record.exchange_s += watch.seconds();
}

// Sharded tables: this rank's gradient rows to their owners; owned_ gets
// the sum of this rank's range (ids made relative to it). The ranks agree
// on whether every owner's sum is finite, and learn the union's size, in
// one small all-reduce.
void EmbeddingExchange::push_to_owners(EmbeddingStep& record) {
  RowExchangeReport report;
  push_rows_to_owners(comm_, mine_, owned_, &report,
                      parse_value_encoding(config_.embedding_values));
  record.bytes_sent += report.bytes_sent;
  record.bytes_received += report.bytes_received;
  std::array<std::int64_t, 2> agree{all_finite(owned_.values) ? 0 : 1,
                                    static_cast<std::int64_t>(owned_.touched())};
  allreduce(comm_, std::span<std::int64_t>(agree));
  owned_finite_everywhere_ = agree[0] == 0;
  record.union_rows = static_cast<std::size_t>(agree[1]);
  const auto first = static_cast<Index>(tables_.first());
  for (Index& id : owned_.ids) id -= first;
  owned_.rows = tables_.last() - tables_.first();
}

// The comparison: the tables' whole gradient, densified and ring
// all-reduced, applied to every row (with the same lazy optimizer, every
// row is touched). sum_ borrows the dense buffers until
// restore_dense_buffers().
void EmbeddingExchange::dense_allreduce(EmbeddingStep& record) {
  const std::size_t width = mine_.width;
  dense_.assign(mine_.rows * width, 0.0f);
  for (std::size_t j = 0; j < mine_.touched(); ++j) {
    std::copy_n(mine_.values.data() + j * width, width, dense_.data() + mine_.ids[j] * width);
  }
  AllreduceReport report;
  allreduce(comm_, std::span<float>(dense_), {}, &report);
  if (every_row_.size() != mine_.rows) {
    every_row_.resize(mine_.rows);
    std::iota(every_row_.begin(), every_row_.end(), Index{0});
  }
  sum_.reset(mine_.rows, width);
  sum_.ids.swap(every_row_);
  sum_.values.swap(dense_);
  record.union_rows = mine_.rows;
  record.bytes_sent = report.bytes_sent;
  record.bytes_received = report.bytes_received;
}

void EmbeddingExchange::restore_dense_buffers() {
  sum_.ids.swap(every_row_);
  sum_.values.swap(dense_);
}

void EmbeddingExchange::save(StateWriter& state) const {
  const std::vector<std::uint64_t> touched(last_.touched.begin(), last_.touched.end());
  state.array<std::uint64_t>(touched);
  state.value<std::uint64_t>(last_.union_rows);
}

void EmbeddingExchange::load(StateReader& state) {
  const std::vector<std::uint64_t> touched = state.array<std::uint64_t>();
  last_.touched.assign(touched.begin(), touched.end());
  last_.union_rows = state.value<std::uint64_t>();
}

}  // namespace sparsecomm
