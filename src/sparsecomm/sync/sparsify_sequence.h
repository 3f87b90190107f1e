#pragma once
// The sparsify sequence: the phases of one step of a sparse scheme, in the
// one place every host caller of a scheme runs them from (the synchronous
// step SparsifyExchangeStep, the selection alone SelectionStep, the
// parameter server's worker ps/worker.h):
//
//   1. finiteness: every rank agrees that every gradient is finite
//      (agree_all_finite); a worker that pushes alone checks its own
//   2. select(g): the memory folds g in; the sparsifier selects from what
//      the memory accumulated
//   3. the caller moves the selection: an exchange, pushes to the servers,
//      or the user's own transport
//   4. the memory keeps exactly what was not sent: exchanged() after an
//      exchange (which subtracted what it transmitted as it sent it),
//      sent() when the caller moved the selection itself
//   5. observe(): the sparsifier learns the step's outcome (counts, union)
//
// The device path (python/src/device_sync.cc) runs the same phases with
// LibTorch's operators on the gradient's device, for the schemes whose
// registry entry names device options (SchemeTraits::device_options).
//
// Not thread-safe; one per rank.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sparsify/sparsifier.h"
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

// A scheme's parts (memory + sparsifier) stepped through phases 2-5.
class SparsifySequence {
 public:
  // `caller` prefixes errors ("[sync] SparsifyExchangeStep", "[ps] worker 2");
  // InvalidArgument when `parts` lacks a sparsifier or a memory.
  SparsifySequence(SchemeParts parts, std::string_view caller);

  // What select() measured: its two phases' seconds (the sparsifier's own
  // collectives are in `own`, and in selection_s) and whether the memory's
  // spike clip scaled the gradient down.
  struct SelectTimes {
    double accumulate_s = 0.0;
    double selection_s = 0.0;
    bool clipped = false;
    SelectionStats own;
  };

  // Phase 2: folds `gradient` (finite, the same length every step) into the
  // memory and selects from the accumulated vector; the selection is valid
  // until the next step. Every rank of `comm` calls it in the same step when
  // the scheme selects together (SchemeTraits::selects_together).
  const SparseSelection& select(std::span<const float> gradient, const StepContext& ctx,
                                Communicator& comm, SelectTimes* times = nullptr);
  // The last select()'s selection.
  const SparseSelection& selection() const { return selection_; }
  // The memory's accumulated vector: before phase 4 what was selected from,
  // after it what is kept.
  std::span<float> accumulated() { return parts_.memory->accumulated(); }
  // k of this step for a gradient of `numel` elements.
  std::size_t target(std::size_t numel, const StepContext& ctx) const {
    return parts_.sparsifier->target(numel, ctx);
  }

  // `selection` (the step's, or a caller's widening of it) with its known
  // ranges written out at their accumulated values: one ascending (index,
  // value) list, for a transport that carries every index. Valid until the
  // next call.
  const SparseSelection& written_out(const SparseSelection& selection);

  // Phase 4 after an exchange that subtracted what it transmitted from the
  // accumulated vector: the memory's own rule (after_exchange), then, for a
  // memory that finishes the average (EF21), `average` made the vector to
  // apply.
  void exchanged(std::span<const Index> transmitted, std::span<float> average);
  // Phase 4 when the caller moved `sent` itself: exactly it leaves the
  // accumulated vector. A memory that finishes an average is refused at
  // construction by such callers (GradientMemory::finishes_average).
  void sent(const SparseSelection& sent) { parts_.memory->take_sent(sent); }

  // Phase 5: per-rank counts (or this rank's only) and the union's size.
  void observe(std::span<const std::size_t> counts, std::size_t union_size, std::size_t target,
               const StepContext& ctx);

  // What the memory keeps between steps (error feedback: the residual;
  // DGC: its v); empty before the first step.
  std::span<const float> kept() const { return parts_.memory->accumulated(); }
  const SchemeParts& parts() const { return parts_; }
  const Sparsifier& sparsifier() const { return *parts_.sparsifier; }
  const GradientMemory& memory() const { return *parts_.memory; }

  // Layout: tag ("sparse_sync", the name checkpoints have always used),
  // scheme name, memory, sparsifier. load() throws Error when the state is
  // of another scheme.
  void save(StateWriter& writer) const;
  void load(StateReader& reader);

 private:
  SchemeParts parts_;
  std::string caller_;
  SparseSelection selection_;
  SparseSelection written_out_;
};

}  // namespace sparsecomm
