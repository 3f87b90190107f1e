#pragma once
// Internal: the segmented ring behind allreduce() (kRing) and skip_reduce().
// Not part of the public API; see allreduce.cc for how the ring works.
//
// Chunk mapping (all indices mod n, for rank r, rotation q, first step s):
//   reduce-scatter step j (s <= j <= n-2): send chunk r-j-q to r+1,
//                                          receive chunk r-j-1-q from r-1 and add it;
//   after the reduce-scatter rank r owns chunk r+1-q (chunk c is owned by c+q-1);
//   allgather step j (0 <= j <= n-2):      send chunk r+1-q-j to r+1,
//                                          receive chunk r-q-j from r-1.
// Chunk c therefore starts its journey at rank c+q+s and accumulates the
// contributions of ranks c+q+s, ..., c+q+n-1 = owner: n-s of them.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/communicator.h"

namespace sparsecomm::detail {

// a mod n in [0, n), for n > 0 and any sign of a.
inline int ring_mod(int a, int n) {
  const int m = a % n;
  return m < 0 ? m + n : m;
}

inline int reduce_scatter_send_chunk(int rank, int step, int rotation, int n) {
  return ring_mod(rank - step - rotation, n);
}
inline int reduce_scatter_recv_chunk(int rank, int step, int rotation, int n) {
  return ring_mod(rank - step - 1 - rotation, n);
}
inline int owned_chunk(int rank, int rotation, int n) { return ring_mod(rank + 1 - rotation, n); }
inline int chunk_owner(int chunk, int rotation, int n) { return ring_mod(chunk + rotation - 1, n); }
inline int allgather_send_chunk(int rank, int step, int rotation, int n) {
  return ring_mod(rank + 1 - rotation - step, n);
}
inline int allgather_recv_chunk(int rank, int step, int rotation, int n) {
  return ring_mod(rank - rotation - step, n);
}

struct RingOptions {
  // The reduce-scatter starts at this step: 0 for a full all-reduce, s for
  // Skip-Reduce. In [0, n-1]; n-1 means no reduce-scatter at all.
  int first_step = 0;
  // Rotation q of the chunk-to-rank mapping, in [0, n).
  int rotation = 0;
  std::size_t segment_bytes = std::size_t{1} << 20;
  // The owner multiplies its chunk by this after the reduce-scatter, before
  // the allgather (floating-point data only; 1 = leave as is).
  float owner_scale = 1.0f;
  // Component named in error messages: "ring" or "skip-reduce".
  std::string_view component = "ring";
  // Float data only: fp32, or fp16 / bf16 on the wire (AllreduceOptions::wire).
  ValueEncoding wire = ValueEncoding::kFloat32;
};

// The ring all-reduce on comm; options are trusted (validated by callers).
// Fills the phase fields of `report` (not total_s). Works for any n >= 1 and
// any numel, including 0 and numel < n.
void ring_allreduce(Communicator& comm, std::span<float> data, const RingOptions& options,
                    AllreduceReport& report);
void ring_allreduce(Communicator& comm, std::span<std::int64_t> data, const RingOptions& options,
                    AllreduceReport& report);

}  // namespace sparsecomm::detail
