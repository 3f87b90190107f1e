#pragma once
// One sparsified step on one flat vector: memory (error feedback) +
// sparsifier + exchange, with the per-step metrics. The engine behind the
// sparse schemes' GradientSync (gradient_sync.h), which trainers use.
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
#include "sparsecomm/sync/step_metrics.h"

namespace sparsecomm {

enum class NonFinitePolicy {
  kSkip,  // every rank skips the step: gradient zeroed, memories untouched
  kStop,  // every rank throws NonFiniteGradient naming the ranks
};
// "skip" or "stop"; InvalidArgument otherwise.
NonFinitePolicy parse_nonfinite_policy(std::string_view name);

// Thrown on every rank (policy kStop) when some rank's gradient had NaN/inf.
class NonFiniteGradient : public Error {
 public:
  using Error::Error;
};

// Whether every rank's gradient is finite, the same answer on every rank (one
// all-gather of one byte per rank into `finite_flags`). When some rank's is
// not: policy kStop throws NonFiniteGradient on every rank, naming the ranks;
// kSkip returns false.
bool agree_all_finite(std::span<const float> gradient, const StepContext& ctx, Communicator& comm,
                      NonFinitePolicy policy, std::vector<std::uint8_t>& finite_flags);
// The first phase of a step for methods that keep state across steps:
// sets `metrics.step` and `metrics.numel`, then agree_all_finite, timed
// into `metrics.agreement_s`. When some rank's
// gradient is not finite (policy kSkip) the gradient is zeroed, the
// metrics say the step was skipped (its exchange time is the agreement)
// and it returns false: the method must leave its state as it was.
bool begin_finite_step(std::span<float> gradient, const StepContext& ctx, Communicator& comm,
                       NonFinitePolicy policy, std::vector<std::uint8_t>& finite_flags,
                       StepMetrics& metrics);

// A scheme's state (memory + sparsifier) in the layout checkpoints use;
// SparsifyExchangeStep and SelectionStep (selection_step.h) share it.
void save_scheme_state(const SchemeParts& parts, StateWriter& writer);
// Throws Error when the state is of another scheme.
void load_scheme_state(SchemeParts& parts, StateReader& reader);

// Runs sparsify + exchange (with error feedback) on one flat gradient per
// step; owns the scheme's parts and the exchange pattern's scratch.
class SparsifyExchangeStep final : public GradientSync {
 public:
  SparsifyExchangeStep(SchemeParts parts, NonFinitePolicy policy = NonFinitePolicy::kStop);

  // The sparsifier's name (topk, exdyna, ...).
  std::string_view method() const override { return parts_.sparsifier->name(); }
  // In: this rank's local gradient (length d, the same d every step and on
  // every rank). Out: `gradient` replaced by the averaged sparse gradient.
  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override;
  bool applies_momentum() const override { return parts_.memory->applies_momentum(); }
  bool bucketable() const override { return !parts_.traits.spans_the_model; }

  const Sparsifier& sparsifier() const { return *parts_.sparsifier; }
  const GradientMemory& memory() const { return *parts_.memory; }
  // What the memory kept after the last step (error feedback: the
  // residual e; DGC: its v), length d; empty before the first step.
  std::span<const float> kept() const override { return parts_.memory->accumulated(); }
  ExchangePattern exchange_pattern() const { return exchanger_->pattern(); }
  // This rank's selection and the exchange's result of the last step that
  // was not skipped (for tests and diagnostics; valid until the next step).
  const SparseSelection& last_selection() const { return selection_; }
  const ExchangeResult& last_exchange() const { return result_; }

  void save(StateWriter& writer) const override;
  void load(StateReader& reader) override;

 private:
  SchemeParts parts_;
  NonFinitePolicy policy_;
  std::unique_ptr<SparseExchange> exchanger_;
  SparseSelection selection_;
  ExchangeResult result_;
  std::vector<std::uint8_t> finite_flags_;  // per rank: 1 when its gradient was finite
};

}  // namespace sparsecomm
