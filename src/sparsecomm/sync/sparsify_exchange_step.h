#pragma once
// One sparsified step on one flat vector: memory (error feedback) +
// sparsifier + exchange, with the per-step metrics. The engine behind the
// sparse schemes' GradientSync (gradient_sync.h), which trainers use; its
// phases are the sparsify sequence's (sparsify_sequence.h):
//
//   check g is finite; agree on it (one tiny all-gather) -> skip or stop
//   a = memory.accumulate(g)
//   sparsifier.select(a) -> exchange (a -> residual, out = g)
//   memory.after_exchange(transmitted); sparsifier.observe(outcome)
//
// The exchange writes the average straight into the caller's gradient
// buffer (g is no longer needed once accumulated), so a step costs no copy.
//
// Not thread-safe; one per rank. Every rank calls synchronize() each step.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sparsify/sparsifier.h"
#include "sparsecomm/sync/gradient_sync_interface.h"
#include "sparsecomm/sync/sparsify_sequence.h"
#include "sparsecomm/sync/step_metrics.h"

namespace sparsecomm {

// Runs sparsify + exchange (with error feedback) on one flat gradient per
// step; owns the scheme's parts and the exchange pattern's scratch.
class SparsifyExchangeStep final : public GradientSync {
 public:
  SparsifyExchangeStep(SchemeParts parts, NonFinitePolicy policy = NonFinitePolicy::kStop);

  // The sparsifier's name (topk, exdyna, ...).
  std::string_view method() const override { return sequence_.sparsifier().name(); }
  // In: this rank's local gradient (length d, the same d every step and on
  // every rank). Out: `gradient` replaced by the averaged sparse gradient.
  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override;
  bool applies_momentum() const override { return sequence_.memory().applies_momentum(); }
  bool bucketable() const override { return !sequence_.parts().traits.spans_the_model; }

  const Sparsifier& sparsifier() const { return sequence_.sparsifier(); }
  const GradientMemory& memory() const { return sequence_.memory(); }
  // What the memory kept after the last step (error feedback: the
  // residual e; DGC: its v), length d; empty before the first step.
  std::span<const float> kept() const override { return sequence_.kept(); }
  ExchangePattern exchange_pattern() const { return exchanger_->pattern(); }
  // This rank's selection and the exchange's result of the last step that
  // was not skipped (for tests and diagnostics; valid until the next step).
  const SparseSelection& last_selection() const { return sequence_.selection(); }
  const ExchangeResult& last_exchange() const { return result_; }

  void save(StateWriter& writer) const override;
  void load(StateReader& reader) override;

 private:
  SparsifySequence sequence_;
  NonFinitePolicy policy_;
  std::unique_ptr<SparseExchange> exchanger_;
  ExchangeResult result_;
  std::vector<std::uint8_t> finite_flags_;  // per rank: 1 when its gradient was finite
};

}  // namespace sparsecomm
