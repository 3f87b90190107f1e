#pragma once
// Skip-Reduce: index-free pruning inside a ring all-reduce (see
// docs/algorithms.md "Skip-Reduce").
//
// With skip s (0 <= s <= n-1) every chunk starts its reduce-scatter journey
// s hops late, so it sums the contributions of only n-s ranks: a contiguous
// run of the ring ending at the chunk's final owner. The reduce-scatter takes
// n-1-s steps, the allgather is unchanged. Which ranks are dropped for which
// chunk rotates every call by an offset drawn from a counter-based RNG keyed
// by (seed, step, bucket): identical on all ranks, no message needed.
//
// Contract as for allreduce(): every rank calls with the same size and the
// same options; in place; `data` ends up identical on all ranks.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/communicator.h"

namespace sparsecomm {

struct SkipReduceOptions {
  int skip = 0;             // s, in [0, n-1]
  std::uint64_t seed = 0;   // rotation key, shared by all ranks
  std::int64_t step = 0;    // training step (rotation counter)
  std::int64_t bucket = 0;  // bucket id within the step (rotation counter)
  // Buffers with fewer elements are reduced in full (reference: 100,000).
  std::size_t min_elements = 100000;
  // A user-protected bucket: reduced in full whatever its size.
  bool protect = false;
  // Multiply each chunk's partial sum by n/(n-s) (an unbiased sum estimate).
  bool rescale = false;
  std::size_t segment_bytes = std::size_t{1} << 20;
};

// One chunk's fate: contributors are the ranks
// first_contributor, first_contributor+1, ..., (mod n), `contributors` of
// them, the last of which is the chunk's final owner.
struct SkipChunk {
  std::size_t begin = 0;
  std::size_t end = 0;
  int first_contributor = 0;
  int contributors = 0;
  int owner = 0;
  // True when `rank`'s contribution to this chunk was dropped.
  bool dropped(int rank, int world) const;
};

// The schedule of one Skip-Reduce call, identical on all ranks.
struct SkipSchedule {
  int world = 1;
  int skip = 0;                   // the skip actually applied (0 when protected)
  int rotation = 0;               // offset drawn from (seed, step, bucket)
  bool protected_buffer = false;  // reduced in full (small or user-protected)
  std::vector<SkipChunk> chunks;  // one per rank, in buffer order
};

// Computes the schedule without communicating. Throws InvalidArgument for
// skip outside [0, world-1] or world < 1.
SkipSchedule skip_reduce_schedule(int world, std::size_t numel, const SkipReduceOptions& options);

struct SkipReduceReport {
  SkipSchedule schedule;
  AllreduceReport phases;
  // Elements whose reduction skipped some ranks (0 for a protected buffer).
  std::size_t elements_subject_to_skipping = 0;
  // (n - s) / n for skipped buffers, 1 for protected ones.
  double effective_density = 1.0;
};

void skip_reduce(Communicator& comm, std::span<float> data, const SkipReduceOptions& options,
                 SkipReduceReport* report = nullptr);

}  // namespace sparsecomm
