#pragma once
// Same-step density control for the partition schemes (MiCRO, ExDyna): the
// global threshold of step t is chosen from step t's own candidates on every
// rank, so the global count K lands within one histogram bin of k at every
// step instead of only on average (docs/algorithms.md, "Density control
// (MiCRO and ExDyna)").
//
// Per step, on every rank, in the same order:
//   1. the scheme collects its candidates: every element of its own
//      partition with |a| >= candidate_floor() (one read pass);
//   2. choose() runs rounds of all-reduced histograms of the candidates'
//      magnitudes (512 bins + an "above" count, 4 KiB), each round narrowing
//      the crossing of k to one bin of the last, until an edge of that bin
//      misses k by at most tolerance * k (usually after the first round).
//      The first round carries the scheme's own integers (per-block counts)
//      along. If all ranks together hold fewer than k candidates, the floor
//      was too high: `rescan` collects them again at a lower floor (a second
//      read pass, counted in stats().candidate_passes), so K never falls
//      short;
//   3. the candidates are compacted in place to the selection |a| >= the
//      chosen threshold. When the crossing bin is a single float value (exact
//      ties), exactly k - above of the tied elements are kept, rank by rank
//      in rank order and by index inside a rank (one small all-gather);
//   4. the next floor is set below this step's threshold so that, on this
//      step's histogram, `margin` x k elements would have passed it. The
//      margin grows after a rescan and relaxes back otherwise.
//
// Everything derived (threshold, floor, margin) is a function of all-reduced
// integers and of the options: identical on every rank.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"

namespace sparsecomm {

struct StepThresholdOptions {
  // false: one global threshold, from histograms all-reduced over the ranks
  // (K = the sum of the ranks' counts lands on k). true: each rank its own
  // threshold from its own histogram (no collective), so that it selects
  // exactly its quota; the caller passes the quota as k. Every other rule
  // (floor, rescan, refinement, ties) is the same, on this rank's counts.
  bool per_rank = false;
  // With one global threshold: no rank selects more than
  // ceil(cap x k / n) (0: no cap). Each rank's histogram is truncated at the
  // cap from the top before the all-reduce, so the summed counts are
  // sum_r min(count_r, cap): the threshold found is where the capped counts
  // reach k, a rank above the cap keeps its own top `cap`, and the others
  // keep everything above the threshold (water-filling). K stays on k and
  // the imbalance stays below cap - 1.
  double cap = 0.0;
  int mantissa_bits = 7;     // first-round bins: 2^mantissa_bits per binade (0.54% wide at 7)
  double tolerance = 0.01;   // refine while the nearer bin edge misses k by more than this x k
  int max_rounds = 6;        // histogram rounds per candidate pass (the last one picks an edge)
  double margin = 2.0;       // the next floor passes margin x k of this step's candidates
  double max_margin = 16.0;  // the margin's ceiling after repeated rescans
};

// What the last choose() did (identical on every rank except collective_s).
struct StepThresholdStats {
  int rounds = 0;               // collectives: histogram rounds, a tie all-gather, step 0's
  int candidate_passes = 0;     // read passes collecting candidates (1 unless the floor was high)
  std::int64_t candidates = 0;  // all ranks' candidates in the last pass
  std::int64_t selected = 0;    // all ranks' selections: K, known before the exchange
  double collective_s = 0.0;    // wall time this rank spent in the rounds' collectives
};

class StepThreshold {
 public:
  explicit StepThreshold(const StepThresholdOptions& options);

  bool started() const { return started_; }
  // Step 0 only: a coarse histogram (2 bins per binade) of every rank's own
  // elements, `values` restricted to `own`, one all-reduce: the first floor
  // lies at most a factor of sqrt(2) below where 2k elements pass.
  void start(std::span<const float> values, std::span<const Range> own, std::size_t k,
             Communicator& comm);

  float candidate_floor() const { return floor_; }

  // Collects this rank's candidates again at `floor` (< the floor in use):
  // clears `candidates` and appends every own element with |a| >= floor,
  // ascending.
  using Rescan = std::function<void(float floor, SparseSelection& candidates)>;

  // `candidates`: this rank's elements >= candidate_floor(), ascending
  // indices; on return, compacted in place to this rank's selection.
  // `k`: the global target (per_rank: this rank's quota). `shared`: the
  // scheme's integers, summed over ranks in place along with the first round
  // (per_rank: in one all-reduce of their own). k == 0 selects nothing.
  // Returns the threshold (+inf when nothing may be selected).
  float choose(SparseSelection& candidates, std::size_t k, std::span<std::int64_t> shared,
               Communicator& comm, const Rescan& rescan);

  const StepThresholdStats& stats() const { return stats_; }

  void save(StateWriter& writer) const;
  void load(StateReader& reader);

 private:
  // payload_ = this rank's counts of the round (capped at rank_cap_), then,
  // with_uncapped, the same counts before the cap.
  void count_round(const SparseSelection& candidates, std::uint32_t lo, int shift,
                   bool with_uncapped);
  // Sums `payload` over the ranks (recursive doubling), counted in stats_.
  void all_reduce(std::span<std::int64_t> payload, Communicator& comm);
  void keep_ties(SparseSelection& candidates, std::uint32_t tie_bits, std::int64_t take,
                 Communicator& comm);
  void keep_largest(SparseSelection& candidates, std::size_t count);
  // Compacts `candidates` in place, order kept, to the elements whose
  // magnitude bits exceed `level` and the first `at_level` equal to it.
  static void keep_above_and_first_at(SparseSelection& candidates, std::uint32_t level,
                                      std::size_t at_level);
  void steer_floor(float threshold, std::size_t k, bool rescanned);

  StepThresholdOptions options_;
  int fine_shift_ = 16;  // 23 - mantissa_bits
  bool started_ = false;
  float floor_ = 0.0f;
  double margin_ = 2.0;
  StepThresholdStats stats_;
  // The first round of the last candidate pass (global counts, before any
  // cap), kept to place the next floor.
  std::vector<std::int64_t> first_round_;
  std::uint32_t first_round_lo_ = 0;
  StepThresholdStats started_stats_;   // start()'s collective, reported by the next choose()
  std::int64_t rank_cap_ = 0;          // this step's per-rank cap (0: none)
  std::vector<std::int64_t> payload_;  // scratch
  std::vector<float> magnitudes_;      // scratch of keep_largest()
};

}  // namespace sparsecomm
