#pragma once
// The sparsify half of SparsifyExchangeStep (sparsify_exchange_step.h), for
// callers who move the selection over a transport of their own (the Python
// Sparsifier, docs/python.md); the phases are the sparsify sequence's
// (sparsify_sequence.h):
//
//   agree that every rank's g is finite (as SparsifyExchangeStep does)
//   a = memory.accumulate(g)
//   sparsifier.select(a) -> this rank's (indices, values)
//   a -= the selection, so the memory keeps the residual; memory.after_exchange
//   the ranks' counts (one all-gather of one number per rank) -> observe
//
// A selection is this rank's own: in an all-gather of every rank's
// selection, summed at the receivers, each rank sends exactly what
// SparsifyExchangeStep with exchange=allgather would send. Values are full
// precision and indices plain: quantizing or encoding them is the transport's
// business. DEFT's known ranges are expanded into the indices, so a selection
// is one ascending (index, value) list.
//
// The outcome the sparsifier observes takes the union as the sum of the
// counts. That is exact for the schemes whose ranks select disjoint
// coordinates (the partition schemes MiCRO and ExDyna), and they are the only
// ones that read it (Sparsifier::observe).
//
// Not thread-safe; one per rank. Every rank calls select() each step, in the
// same order as its other collectives on `comm`.

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sparsify/sparsifier.h"
#include "sparsecomm/sync/sparsify_sequence.h"

namespace sparsecomm {

class SelectionStep {
 public:
  // The exchange settings of `parts` are not used.
  explicit SelectionStep(SchemeParts parts, NonFinitePolicy policy = NonFinitePolicy::kStop);

  // Folds `gradient` (this rank's, the same length every step) into the
  // memory and selects from it; valid until the next call. When some rank's
  // gradient has NaN or inf, every rank either throws NonFiniteGradient
  // (kStop) or returns an empty selection with the memory untouched and
  // skipped() true (kSkip).
  const SparseSelection& select(std::span<const float> gradient, const StepContext& ctx,
                                Communicator& comm);
  bool skipped() const { return skipped_; }

  // The last step's per-rank counts (what the sparsifier observed).
  std::span<const std::size_t> counts() const { return counts_; }
  // What the memory kept after the last step (the residual; DGC: its v).
  std::span<const float> kept() const { return sequence_.kept(); }
  const Sparsifier& sparsifier() const { return sequence_.sparsifier(); }
  const GradientMemory& memory() const { return sequence_.memory(); }

  // The same layout as SparsifyExchangeStep's, so either can resume the other.
  void save(StateWriter& writer) const;
  void load(StateReader& reader);

 private:
  SparsifySequence sequence_;
  NonFinitePolicy policy_;
  bool skipped_ = false;
  std::vector<std::uint8_t> finite_flags_;  // per rank: 1 when its gradient was finite
  SparseSelection empty_;                   // a skipped step's selection
  std::vector<std::size_t> counts_;
};

}  // namespace sparsecomm
