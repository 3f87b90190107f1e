#pragma once
// The Sparsifier: chooses which coordinates of this rank's accumulated
// gradient to transmit. docs/algorithms.md specifies every scheme.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"

namespace sparsecomm {

struct StepContext {
  std::int64_t step = 0;  // t = 0, 1, 2, ...
  double epoch = 0.0;  // fractional epoch (DGC warm-up); step-based runs pass step/steps_per_epoch
  int rank = 0;
  int world = 1;
  std::span<const LayerSpan> layers;  // name, offset, size of each tensor
  std::int64_t bucket = 0;            // pipelined synchronization: which bucket of the step
};

// What the last select() spent on its own small collectives (the partition
// schemes' histogram rounds): SparsifyExchangeStep counts their time as
// exchange time, not selection time.
struct SelectionStats {
  int collective_rounds = 0;  // collectives select() ran
  int candidate_passes = 0;   // read passes collecting candidates (same-step threshold)
  double collective_s = 0.0;  // wall time this rank spent in them
};

// The exchange's shared outcome, identical on all ranks.
struct ExchangeOutcome {
  std::span<const std::size_t> counts;  // |I_r| per rank
  std::size_t union_size = 0;           // K
  std::size_t target = 0;               // k this step
};

class Sparsifier {
 public:
  virtual ~Sparsifier() = default;
  virtual std::string_view name() const = 0;

  // This step's target count k for a vector of `numel` elements (DGC's
  // warm-up changes it over time).
  virtual std::size_t target(std::size_t numel, const StepContext& ctx) const = 0;

  // Chooses this rank's indices (strictly ascending) and their values from
  // the accumulated gradient, into `out` (cleared first). Gets the
  // communicator because some schemes need small collectives of their own;
  // whatever they derive must be identical on every rank. Every rank calls
  // select() every step, in the same order as the other collectives.
  virtual void select(std::span<const float> accumulated, const StepContext& ctx,
                      Communicator& comm, SparseSelection& out) = 0;

  // Sees the exchange's shared outcome, to adapt thresholds or partitions.
  virtual void observe(const ExchangeOutcome&, const StepContext&) {}

  // Everything needed to resume bit-exactly.
  virtual void save(StateWriter& writer) const = 0;
  virtual void load(StateReader& reader) = 0;

  // The ranges of `accumulated` the last select() streamed through, in
  // reading order (a range may be read again: DEFT's leader reads the whole
  // vector for its norms, then its pieces). Empty: no streaming pass, only
  // scattered reads (Random-k, a CLT-k follower). A selection's
  // memory-bandwidth floor is a read pass over exactly these.
  std::span<const Range> last_read() const { return last_read_; }

  // The last select()'s own collectives (zero for schemes that run none).
  const SelectionStats& last_stats() const { return stats_; }

 protected:
  // For select(): this step read exactly `range` / nothing in streaming.
  void read_only(Range range) { last_read_.assign(1, range); }
  void read_nothing() { last_read_.clear(); }
  std::vector<Range> last_read_;
  SelectionStats stats_;
};

}  // namespace sparsecomm
