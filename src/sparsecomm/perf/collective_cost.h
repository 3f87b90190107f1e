#pragma once
// Alpha-beta-gamma costs of the collectives and exchange patterns that
// sparsecomm runs, as pure functions (docs/algorithms.md, "Performance
// model"). Each returns the latency-bound rounds and the time of the
// critical path, and the bytes a rank sends and receives (the mean over
// ranks where they differ, as a NIC counter summed over hosts shows). A round in which a rank sends
// s and receives r bytes costs alpha + max(s, r) beta (full-duplex links); adding e received floats
// costs e gamma. Byte counts follow the implementations in
// src/sparsecomm/collectives (the same formulas as docs/algorithms.md,
// "Collectives" and "Exchange patterns").

#include <cstddef>
#include <span>

#include "sparsecomm/perf/cost_profile.h"

namespace sparsecomm::perf {

struct CommCost {
  double seconds = 0.0;
  double rounds = 0.0;          // latency-bound steps (each costs alpha)
  double bytes_sent = 0.0;      // by this rank
  double bytes_received = 0.0;  // by this rank
  // What this rank's NIC sends: each message's payload with the profile's
  // framing (cost_profile.h), the larger of its per-message and per-byte
  // figures.
  double wire_bytes_sent = 0.0;

  CommCost& operator+=(const CommCost& other);
};
CommCost operator+(CommCost a, const CommCost& b);
// `count` times the cost (every field): repeated rounds, or an expected
// cost when a collective runs on a share of the steps.
CommCost operator*(CommCost cost, double count);

// Bytes of one 32-bit value and of the header every pattern but `shared`
// all-gathers first (count, payload bytes, d).
inline constexpr double kFloatBytes = 4.0;
inline constexpr double kExchangeHeaderBytes = 24.0;

// --- dense collectives, `bytes` the whole buffer of floats on every rank ---

// Segmented ring: 2(n-1) rounds, 2(n-1)/n bytes sent and received,
// (n-1)/n of the buffer reduced.
CommCost ring_allreduce(const CostProfile& p, int n, double bytes);

// Recursive doubling: with P the largest power of two <= n, log2 P rounds of
// the whole buffer (+2 fold-in/out rounds when n is not a power of two).
CommCost recursive_doubling_allreduce(const CostProfile& p, int n, double bytes);

// Skip-Reduce with `skip` = s (0 <= s <= n-1): the reduce-scatter runs
// n-1-s of the ring's n-1 steps, the allgather all n-1.
CommCost skip_reduce(const CostProfile& p, int n, int skip, double bytes);

// Ring allgatherv: n-1 rounds; every round one block crosses each link, so
// a round lasts as long as the largest block (`max_block` bytes); a rank
// sends and receives n-1 blocks of `mean_block` bytes.
CommCost ring_allgatherv(const CostProfile& p, int n, double mean_block, double max_block);

// Pairwise alltoallv: n-1 rounds of `bytes_per_peer`.
CommCost alltoallv(const CostProfile& p, int n, double bytes_per_peer);

// Communicator::broadcast of `bytes`: the algorithm the communicator picks
// for that size and world (comm/broadcast_rule.h), one of the two below.
CommCost broadcast(const CostProfile& p, int n, double bytes);
// Binomial tree: ceil(log2 n) rounds of the whole buffer; (n-1)/n of it
// sent and received per rank on average.
CommCost binomial_broadcast(const CostProfile& p, int n, double bytes);
// Scatter from the root (n-1 rounds of a block of bytes/n, all sent by the
// root), then a ring allgather of the blocks (n-1 rounds): 2(n-1) rounds,
// 2(n-1)/n of the buffer through the busiest link.
CommCost scatter_allgather_broadcast(const CostProfile& p, int n, double bytes);

// --- sparse exchange patterns ---

// The sparse step's non-finite agreement before it selects: an allgather of
// one byte per rank (docs/algorithms.md, "One step").
CommCost nonfinite_agreement(const CostProfile& p, int n);

// What the ranks send: the mean and largest per-rank selection, the union K
// (all counts of entries), the bytes of one index on the wire and of one
// value, and d.
struct SparseSend {
  double mean_count = 0.0;   // m_r averaged over ranks
  double max_count = 0.0;    // max_r m_r
  double union_count = 0.0;  // K
  double index_bytes = 4.0;  // per index (raw 4, varints fewer)
  double value_bytes = 4.0;  // bytes per value on the wire: wire_bits_per_value / 8
  // The value codec's host work per value: encoding at the sender,
  // decoding a received value (CostProfile::encode_cost, decode_cost).
  double encode_s = 0.0;
  double decode_s = 0.0;
  double numel = 0.0;  // d
  // The ranks' lists lie in disjoint ranges (MiCRO's contiguous
  // partitions): their union is a concatenation, no merge.
  bool disjoint_ranges = false;
};

// The sparse patterns below take the values they send out of the memory
// (CostProfile::pack_cost per value) and end by writing their result into
// the dense gradient: d zeroed elements and one scattered entry per value
// added (CostProfile::fill_s_per_element, scatter_cost). Those that gather
// index lists decode them and merge the n runs into their union
// (index_decode_s_per_element per index, merge_s_per_element per entry
// and level, ceil(log2 n) levels); lists in disjoint ranges are
// concatenated instead (one streaming copy, gamma_s_per_element per entry).
//
// union: header allgather, allgatherv of the index lists, their union
// (n m entries), K values packed and encoded, value sum of K floats (ring
// all-reduce of the decoded values; or, where n E < 8 bytes a value, an
// allgatherv of the encoded values, n K of them decoded), K entries
// written into the gradient.
CommCost union_allreduce(const CostProfile& p, int n, const SparseSend& s);

// shared: the same m indices on every rank; m values packed and encoded,
// their value sum as union's, m entries written into the gradient.
CommCost shared_allreduce(const CostProfile& p, int n, const SparseSend& s);

// allgather: m values packed and encoded, header allgather, allgatherv of
// [indices][values] blocks, their union (n m entries), then every rank
// decodes and adds the n blocks and divides the K entries of their union.
CommCost sparse_allgather(const CostProfile& p, int n, const SparseSend& s);

// SparCML recursive doubling: log2 P rounds whose message is the partial
// sum so far, sparse until it outgrows the dense form. `union_of_ranks[j]`
// is the expected union of 2^j ranks' selections (entries), j = 0..log2 P.
CommCost sparcml_recursive_doubling(const CostProfile& p, int n, const SparseSend& s,
                                    std::span<const double> union_of_ranks);

// SparCML split: alltoallv of counts and of each range's entries to its
// owner, then allgathers of the reduced ranges (sparse or dense, the smaller).
CommCost sparcml_split(const CostProfile& p, int n, const SparseSend& s);

// Ok-Topk's balanced sparse all-reduce (collectives/ok_topk.cc), raw
// indices and fp32 values (8-byte pairs): header allgather, ring all-reduce
// of the 8n-bin histogram (8-byte counts), alltoallv of the byte counts and
// of each region's pairs to its owner (m / n per peer), the owner's sum of
// m entries, two allgathers of one count each (supports, survivors), the
// allgatherv of the survivors (about m in all, m / n per owner), and m
// entries written into the gradient. Bytes per rank grow with m, not n m.
CommCost ok_topk_allreduce(const CostProfile& p, int n, const SparseSend& s);

// --- parameter server (BSP), W workers and S servers on their own hosts ---

// One worker's step: BEGIN/GRANT with the controller, a pull of the whole
// model and a push of `push_bytes` (4d dense; 8 per entry sparse), split
// over the S servers. A server's link carries W shards each way, so with
// S < W the servers' links bound the step. Includes the servers' sum and
// optimizer step over their shard.
CommCost ps_bsp_step(const CostProfile& p, int workers, int servers, double numel,
                     double push_bytes);

// --- helpers ---

// Largest power of two <= n (n >= 1).
int largest_power_of_two(int n);

// Expected bytes of one LEB128 varint index gap for a list of density c
// (gaps geometric with mean 1/c): 1 byte plus one per 7-bit boundary the
// gap crosses, averaged (docs/algorithms.md, "Wire encodings").
double varint_index_bytes(double density);

}  // namespace sparsecomm::perf
