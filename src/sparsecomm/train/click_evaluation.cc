#include "sparsecomm/train/click_evaluation.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <numeric>

#include "sparsecomm/collectives/row_exchange.h"
#include "sparsecomm/core/row_sparse.h"

namespace sparsecomm {
namespace {

// The AUC is computed from histograms of the predicted probability with
// this many equal bins per label (ties within a bin count half).
constexpr std::size_t kAucBins = 1 << 14;
// Held-out lookups are counted by how many steps updated their row before:
// [0], [1, 10), [10, 100), [100, ...).
constexpr std::array<std::uint32_t, 3> kUpdateBounds = {1, 10, 100};
constexpr std::size_t kUpdateBuckets = kUpdateBounds.size() + 1;
// The sums: [correct, loss x 1e6, train loss x 1e6, train steps, lookups by
// their row's updates, histograms].
constexpr std::size_t kHistograms = 4 + kUpdateBuckets;

}  // namespace

ClickEvalSums::ClickEvalSums() : sums_(kHistograms + 2 * kAucBins, 0) {}

void ClickEvalSums::add_prediction(double logit, bool clicked) {
  // -log sigmoid(+-z), stable for large |z|
  const double signed_logit = clicked ? logit : -logit;
  loss_sum_ += std::max(-signed_logit, 0.0) + std::log1p(std::exp(-std::abs(logit)));
  const double p = 1.0 / (1.0 + std::exp(-logit));
  sums_[0] += (p >= 0.5) == clicked ? 1 : 0;
  const auto bin = std::min<std::size_t>(kAucBins - 1, static_cast<std::size_t>(p * kAucBins));
  sums_[kHistograms + (clicked ? kAucBins : 0) + bin] += 1;
}

void ClickEvalSums::add_lookups(std::uint16_t updates, std::int64_t lookups) {
  std::size_t bucket = 0;
  while (bucket < kUpdateBounds.size() && updates >= kUpdateBounds[bucket]) ++bucket;
  sums_[4 + bucket] += lookups;
}

std::span<std::int64_t> ClickEvalSums::finish(double train_loss_sum,
                                              std::int64_t train_loss_count) {
  sums_[1] = std::llround(loss_sum_ * 1e6);
  sums_[2] = std::llround(train_loss_sum * 1e6);
  sums_[3] = train_loss_count;
  return sums_;
}

TrainEval ClickEvalSums::eval(const EvalPoint& point, std::int64_t count) const {
  TrainEval eval = make_train_eval(point, count, {sums_[0], static_cast<double>(sums_[1]) * 1e-6},
                                   static_cast<double>(sums_[2]) * 1e-6, sums_[3]);
  const std::span<const std::int64_t> histograms(sums_.data() + kHistograms, 2 * kAucBins);
  eval.test_auc = histogram_auc(histograms.first(kAucBins), histograms.last(kAucBins));
  return eval;
}

nlohmann::json ClickEvalSums::lookups_by_updates() const {
  const double lookups = static_cast<double>(
      std::accumulate(sums_.begin() + 4, sums_.begin() + static_cast<std::ptrdiff_t>(kHistograms),
                      std::int64_t{0}));
  if (lookups > 0) {
    return {{"0", static_cast<double>(sums_[4]) / lookups},
            {"1-9", static_cast<double>(sums_[5]) / lookups},
            {"10-99", static_cast<double>(sums_[6]) / lookups},
            {"100+", static_cast<double>(sums_[7]) / lookups}};
  }
  return nullptr;
}

void count_lookups_by_updates(Communicator& comm, std::span<const Index> lookups,
                              const EmbeddingTables& tables,
                              std::span<const std::uint16_t> row_updates, bool sharded,
                              ClickEvalSums& sums) {
  if (!sharded) {
    for (const Index row : lookups) sums.add_lookups(row_updates[row], 1);
    return;
  }
  const std::vector<float> ones(lookups.size(), 1.0f);
  RowSparse per_row;
  coalesce_rows(lookups, ones, tables.layout().rows(), 1, per_row);
  RowSparse owned;
  push_rows_to_owners(comm, per_row, owned);
  for (std::size_t j = 0; j < owned.touched(); ++j) {
    sums.add_lookups(row_updates[owned.ids[j] - tables.first()], std::llround(owned.values[j]));
  }
}

}  // namespace sparsecomm
