#pragma once
// Internal to collectives/: the steps the exchange patterns share (message
// prefix, byte accounting, the header allgather, index-list unions, the
// value sum of union/shared) and the per-pattern factories behind
// make_sparse_exchange. Not part of the library's interface.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sparsecomm/collectives/exchange_message.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm::detail {

// "[exchange] rank r: ", the prefix of every message an exchange throws.
std::string where(const Communicator& comm);

// Throws `error` (from exchange_message.h) again as a CommError that names
// this rank and the sender `peer`.
[[noreturn]] void rethrow_from(const Communicator& comm, int peer, const CommError& error);

// decode_block (exchange_message.h) of a block sent by `peer`; its
// CommError again naming this rank and the sender.
void decode_block_from(const Communicator& comm, int peer, std::span<const std::byte> block,
                       const BlockFormat& format, std::span<Index> indices,
                       std::span<float> values);

// The nonce a stochastic value codec draws from (value_codec.h) for this rank's
// `values`: a hash of the rank and the values, so runs repeat bit for bit
// (and resume from checkpoints) without a counter to keep; 0 for the other
// codecs.
std::uint64_t rounding_nonce(const Communicator& comm, ValueEncoding encoding,
                             std::span<const float> values);

// Checksum of an index list, for ranks to compare (core/hash.h).
std::uint64_t index_list_hash(std::span<const Index> indices);

// The bytes this rank moves in an allgatherv of counts[q] bytes per rank q
// on the default ring: it sends sum - counts[r+1] and receives sum - counts[r].
struct RingBytes {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
};
RingBytes ring_allgatherv_bytes(const Communicator& comm, std::span<const std::size_t> counts);

// Adds ring_allgatherv_bytes(comm, counts) to result's byte counts.
void count_allgatherv(const Communicator& comm, std::span<const std::size_t> counts,
                      ExchangeResult& result);

// The buffers a pattern sends and receives through (reused across calls).
struct WireBuffers {
  UninitVector<float> values;            // this rank's decoded values, then sums
  UninitVector<float> other_values;      // another rank's decoded values
  UninitVector<std::byte> send;          // this rank's message
  UninitVector<std::byte> recv;          // every rank's blocks, back to back
  std::vector<std::size_t> byte_counts;  // bytes of each rank's block
  std::vector<std::uint64_t> headers;    // allgathered header words
};

// Allgathers (count, payload bytes, d) of every rank into result.counts and
// wire.byte_counts. Every rank throws the same InvalidArgument when the d's
// differ, the same CommError when a count exceeds d.
void gather_headers(Communicator& comm, std::uint64_t count, std::uint64_t payload_bytes,
                    std::size_t numel, WireBuffers& wire, ExchangeResult& result);

// Sorted index lists (runs), one per rank and maybe one more, and their
// union (union all-reduce, sparse allgather).
class IndexRuns {
 public:
  // Run q = the indices of block q of `blocks` (block_bytes[q] bytes each,
  // back to back): counts[q] indices, then counts[q] x values_per_index +
  // extra_values values (format.values; 0 for index-only blocks). CommError
  // naming the sender when a block is malformed.
  void decode_blocks(const Communicator& comm, std::span<const std::byte> blocks,
                     std::span<const std::size_t> block_bytes, std::span<const std::size_t> counts,
                     const BlockFormat& format, std::size_t values_per_index,
                     std::size_t extra_values = 0);
  // Appends one more sorted run.
  void append(std::span<const Index> run);
  std::span<const Index> run(std::size_t q) const {
    return {all_.data() + runs_[q], runs_[q + 1] - runs_[q]};
  }
  // union_indices() = the union of all runs. Runs whose ranges do not
  // overlap (exclusive contiguous partitions, MiCRO's) are concatenated in
  // the order of their first index; otherwise neighbouring runs are merged
  // pairwise, level by level (ceil(log2 runs) levels, linear each).
  void build_union();
  std::span<const Index> union_indices() const { return union_; }

 private:
  // True, with union_ their concatenation, when the non-empty runs' ranges
  // are disjoint.
  bool concatenate_disjoint_runs();

  UninitVector<Index> all_;  // run q at [runs_[q], runs_[q + 1])
  std::vector<std::size_t> runs_;
  UninitVector<Index> union_;
  UninitVector<Index> merge_scratch_;
  std::vector<std::size_t> merge_bounds_;
  std::vector<std::size_t> next_runs_;
  std::vector<std::size_t> by_first_;  // non-empty runs by their first index
};

// The value step of union and shared all-reduce: reads this rank's values
// at U, encodes them (accumulated[U] -= decoded), sums them over all ranks
// and writes out = sum / n at U, 0 elsewhere; sets union_size and
// transmitted (= u, which must outlive the result).
void reduce_values_at(Communicator& comm, std::span<const Index> u, const ExchangeOptions& options,
                      std::span<float> accumulated, std::span<float> out, WireBuffers& wire,
                      ExchangeResult& result);

// The patterns (one file each).
std::unique_ptr<SparseExchange> make_union_allreduce(const ExchangeOptions& options);
std::unique_ptr<SparseExchange> make_shared_allreduce(const ExchangeOptions& options);
std::unique_ptr<SparseExchange> make_sparse_allgather(const ExchangeOptions& options);
std::unique_ptr<SparseExchange> make_sparse_allreduce(const ExchangeOptions& options);
std::unique_ptr<SparseExchange> make_ok_topk(const ExchangeOptions& options);

}  // namespace sparsecomm::detail
