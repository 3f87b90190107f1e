#pragma once
// The exchange patterns of ALGORITHMS.md: how ranks combine their sparse
// selections into one averaged gradient.
//
// Shared contract (error feedback made exact):
//  - `accumulated` is this rank's a_r (length d, identical d on all ranks).
//    On return it holds the NEW RESIDUAL: a_r minus exactly what this rank
//    transmitted, element by element (decoded value, so with fp16/bf16 the
//    rounding error stays in the residual). So for every element,
//    transmitted + new residual == old a_r holds bit-exactly.
//  - `out` (length d) receives the averaged result: (1/n) * sum over ranks
//    of transmitted values, 0 where nothing was transmitted.
//  - `selection` is this rank's choice (indices strictly ascending, values
//    ignored: values are read from `accumulated`). Ranks may select nothing.
//  - `selection.known`: ranges every rank transmits, identical on all ranks
//    (trusted, not checked), ascending, non-overlapping and disjoint from
//    this rank's indices (checked). Union and shared add them to U with no
//    index on the wire; sparse allgather appends their values to each
//    rank's block (no indices); sparse all-reduce sends them as part of each
//    rank's list (its partial sums are index lists). Every rank's residual
//    is a - sent there too. `counts` never include them; `union_size` does.
//  - Every rank calls with the same pattern and options, in the same order.
//  - `transmitted` in the result lists the positions this rank transmitted
//    (ascending): the union U for union all-reduce and shared-index
//    all-reduce, this rank's own I_r for sparse allgather and sparse
//    all-reduce (with the known ranges in every case). DGC masks its
//    momentum there.
// Scratch memory lives in the SparseExchanger object and is reused.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/codec.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

enum class ExchangePattern {
  kUnionAllreduce,   // allgather indices -> union U -> all-reduce a_r[U]
  kSparseAllgather,  // allgatherv (index, value) pairs, sum at receivers
  kSparseAllreduce,  // SparCML: recursive doubling or split + alltoallv
  kSharedIndices,    // all ranks selected the same indices: all-reduce values
};
// "union", "allgather", "sparse-allreduce", "shared"; InvalidArgument listing
// them otherwise.
ExchangePattern parse_exchange_pattern(std::string_view name);
std::string_view exchange_pattern_name(ExchangePattern pattern);

enum class SparseAllreduceAlgorithm { kAuto, kRecursiveDoubling, kSplit };
// "auto", "recursive-doubling", "split"; InvalidArgument listing them otherwise.
SparseAllreduceAlgorithm parse_sparse_allreduce_algorithm(std::string_view name);
std::string_view sparse_allreduce_algorithm_name(SparseAllreduceAlgorithm algorithm);

struct ExchangeOptions {
  ValueEncoding values = ValueEncoding::kFloat32;
  bool encode_indices = true;  // delta-varint indices on the wire
  AllreduceOptions dense;      // for the value all-reduce of union/shared
  SparseAllreduceAlgorithm sparse_algorithm = SparseAllreduceAlgorithm::kAuto;
  // Cost model switch for kAuto: recursive doubling when the total selected
  // count over all ranks times this factor is below d, else split.
  double sparse_switch_factor = 8.0;
};

// What the exchange did; identical on all ranks except the byte counts and
// times, which are this rank's.
struct ExchangeResult {
  std::vector<std::size_t> counts;     // |I_r| for every rank r
  std::size_t union_size = 0;          // K = |U| (the nonzeros of `out`)
  std::span<const Index> transmitted;  // valid until the next exchange call
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t index_bytes_raw = 0;      // 4 bytes per index this rank sent
  std::uint64_t index_bytes_encoded = 0;  // what they took on the wire
  double seconds = 0.0;
};

class SparseExchanger {
 public:
  SparseExchanger(ExchangePattern pattern, ExchangeOptions options);

  ExchangePattern pattern() const { return pattern_; }
  const ExchangeOptions& options() const { return options_; }

  // See the contract at the top of this file.
  void exchange(Communicator& comm, const SparseSelection& selection, std::span<float> accumulated,
                std::span<float> out, ExchangeResult& result);

 private:
  // A partial sum of the sparse all-reduce: a sorted (index, value) list or
  // a dense vector with a bitmap of the positions some rank contributed to.
  struct PartialSum {
    bool dense = false;
    ValueEncoding encoding = ValueEncoding::kFloat32;  // width on the wire
    UninitVector<Index> indices;                       // sparse only
    UninitVector<float> values;                        // sparse: one per index; dense: d
    UninitVector<std::uint8_t> present;                // dense only: ceil(d / 8) bytes
  };

  // sparse_exchange.cc
  void exchange_union(Communicator& comm, std::span<const Index> selected,
                      std::span<const Range> known, bool shared, std::span<float> accumulated,
                      std::span<float> out, ExchangeResult& result);
  void exchange_allgather(Communicator& comm, std::span<const Index> selected,
                          std::span<const Range> known, std::span<float> accumulated,
                          std::span<float> out, ExchangeResult& result);
  void gather_headers(Communicator& comm, std::uint64_t count, std::uint64_t payload_bytes,
                      std::size_t numel, ExchangeResult& result);
  // Block q holds counts[q] indices, then (counts[q] + extra_values) values.
  void decode_index_blocks(Communicator& comm, std::span<const std::size_t> counts,
                           std::size_t value_width, std::size_t numel,
                           std::size_t extra_values = 0);
  // Appends known_indices_ to all_indices_ as one more run.
  void append_known_run();
  void union_of_runs();
  void sum_encoded_values(Communicator& comm, ExchangeResult& result);
  // sparse_allreduce.cc
  void exchange_sparse_allreduce(Communicator& comm, std::span<const Index> selected,
                                 std::span<float> accumulated, std::span<float> out,
                                 ExchangeResult& result);
  void recursive_doubling(Communicator& comm, std::span<const Index> selected, std::span<float> out,
                          ExchangeResult& result);
  void split_allreduce(Communicator& comm, std::span<const Index> selected, std::span<float> out,
                       ExchangeResult& result);
  void serialize_partial(PartialSum& partial, std::size_t numel, ExchangeResult& result);
  void deserialize_partial(Communicator& comm, int peer, std::size_t numel);
  void merge_partial(std::size_t numel);
  void densify_if_smaller(PartialSum& partial, std::size_t numel);

  ExchangePattern pattern_;
  ExchangeOptions options_;
  // Scratch reused across calls (implementation-defined).
  UninitVector<Index> union_;
  UninitVector<Index> known_indices_;  // the known ranges' positions, ascending
  UninitVector<Index> with_known_;     // own indices merged with them
  UninitVector<Index> all_indices_;
  UninitVector<float> values_;
  UninitVector<std::byte> send_bytes_;
  UninitVector<std::byte> recv_bytes_;
  std::vector<std::size_t> byte_counts_;
  UninitVector<Index> merge_scratch_;
  UninitVector<float> other_values_;
  std::vector<std::size_t> runs_;
  std::vector<std::size_t> merge_bounds_;
  std::vector<std::size_t> next_runs_;
  std::vector<std::uint64_t> headers_;
  std::vector<std::size_t> send_counts_;
  std::vector<std::size_t> recv_counts_;
  std::vector<std::size_t> meta_counts_;
  std::vector<std::uint64_t> meta_out_;
  std::vector<std::uint64_t> meta_in_;
  UninitVector<std::uint8_t> range_hit_;
  std::array<std::uint64_t, 4> wire_header_out_{};
  std::array<std::uint64_t, 4> wire_header_in_{};
  std::array<PartialSum, 3> partials_;  // current, incoming, scratch
};

}  // namespace sparsecomm
