#pragma once
// The exchange patterns of docs/algorithms.md ("Exchange patterns"): how
// ranks combine their sparse selections into one averaged gradient.
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
//    all-reduce (with the known ranges in every case), and the part of I_r
//    that survived the global selection for Ok-Topk (whose average keeps
//    only the survivors: the rest of I_r stays in the residual). DGC masks
//    its momentum there.
// One type per pattern behind SparseExchange (make_sparse_exchange), each
// in its own file: union_allreduce.cc, shared_allreduce.cc,
// sparse_allgather.cc, sparse_allreduce.cc, ok_topk.cc; their shared steps live in
// exchange_internal.h, the decoding of received blocks in
// exchange_message.h. Each owns its scratch memory, reused across calls.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/index_codec.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

enum class ExchangePattern {
  kUnionAllreduce,   // allgather indices -> union U -> all-reduce a_r[U]
  kSparseAllgather,  // allgatherv (index, value) pairs, sum at receivers
  kSparseAllreduce,  // SparCML: recursive doubling or split + alltoallv
  kSharedIndices,    // all ranks selected the same indices: all-reduce values
  kOkTopk,           // Ok-Topk: balanced regions, sparse reduce-scatter, global top-k
};
// "union", "allgather", "sparse-allreduce", "shared", "ok-topk";
// InvalidArgument listing them otherwise.
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

// One exchange pattern: the interface every pattern implements (one type
// per pattern, each in its own .cc, each owning only its own scratch).
// Build one with make_sparse_exchange; not thread-safe, one per rank (and
// per independent vector), reused every step.
class SparseExchange {
 public:
  virtual ~SparseExchange() = default;
  SparseExchange(const SparseExchange&) = delete;
  SparseExchange& operator=(const SparseExchange&) = delete;

  ExchangePattern pattern() const { return pattern_; }
  const ExchangeOptions& options() const { return options_; }

  // See the contract at the top of this file. Checks the arguments first
  // (InvalidArgument before any message, so every rank that passes the same
  // invalid arguments throws alike), then runs the pattern.
  void exchange(Communicator& comm, const SparseSelection& selection, std::span<float> accumulated,
                std::span<float> out, ExchangeResult& result);

 protected:
  // Throws InvalidArgument on invalid options.
  SparseExchange(ExchangePattern pattern, const ExchangeOptions& options);

  // The checked selection handed to run().
  struct Input {
    std::span<const Index> selected;       // strictly ascending, below d
    std::span<const Range> known;          // as in SparseSelection::known
    std::span<const Index> known_indices;  // their positions, ascending, disjoint from selected
  };
  // The pattern itself, on checked arguments (out.size() == accumulated.size()
  // == d) and a reset `result` (no counts, zero bytes); exchange() times it.
  virtual void run(Communicator& comm, const Input& input, std::span<float> accumulated,
                   std::span<float> out, ExchangeResult& result) = 0;

 private:
  ExchangePattern pattern_;
  ExchangeOptions options_;
  UninitVector<Index> known_indices_;  // the known ranges' positions, ascending
};

// The pattern's implementation (union_allreduce.cc, shared_allreduce.cc,
// sparse_allgather.cc, sparse_allreduce.cc). InvalidArgument on invalid
// options.
std::unique_ptr<SparseExchange> make_sparse_exchange(ExchangePattern pattern,
                                                     const ExchangeOptions& options);

}  // namespace sparsecomm
