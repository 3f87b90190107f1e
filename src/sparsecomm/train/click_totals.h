#pragma once
// The click model's run totals for its summary (internal to train/): the
// embedding exchange's figures summed over the steps, a fingerprint of the
// final tables, the summary's "embedding" figures they make up, and the
// process's peak resident set.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/train/click_model.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/train_records.h"

namespace sparsecomm {

// Rank 0's EmbeddingStep figures summed over the steps it logged (the
// trainer carries them through checkpoints as JSON).
struct ClickTotals {
  std::int64_t steps = 0;
  double touched = 0.0, union_rows = 0.0, bytes_sent = 0.0, bytes_received = 0.0;
  double exchange_s = 0.0, update_s = 0.0;
  std::vector<double> table_touched;
  nlohmann::json by_exchange = nlohmann::json::object();  // steps per exchange

  // Adds one step's figures.
  void add(const EmbeddingStep& step);

  nlohmann::json to_json() const;
  // What to_json() wrote; nlohmann's exceptions when a field is missing.
  void from_json(const nlohmann::json& j);
};

// The whole tables, the same however they are split over the ranks: the
// sum mod 2^64 of their rows' hashes and the sum of |values|
// (EmbeddingTables::row_hash_sum and abs_sum).
struct TableFingerprint {
  std::uint64_t hash = 0;
  double abs_sum = 0.0;
};
// Of the tables every rank stores a part of (`sharded`: the sum of the
// ranks' fingerprints in rank order, an allgather that every rank calls)
// or every rank stores whole (this rank's `tables`, no message).
TableFingerprint fingerprint_tables(Communicator& comm, const EmbeddingTables& tables,
                                    bool sharded);

// The summary's "embedding" figures: the tables' shape, the run's choices
// for them (config's embedding_exchange, _optimizer and _values), the
// bytes a ring all-reduce of them would move among `ranks`, the parameters
// one rank stores, the per-step means of `totals` and the final tables'
// fingerprint.
nlohmann::json embedding_summary(const TableLayout& tables, const TrainConfig& config, int ranks,
                                 std::size_t resident_parameters, const ClickTotals& totals,
                                 const TableFingerprint& fingerprint);

// The peak resident set of this process (VmHWM), in bytes; 0 if unknown.
std::uint64_t peak_resident_bytes();

}  // namespace sparsecomm
