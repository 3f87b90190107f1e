#include "sparsecomm/collectives/sparse_exchange.h"

#include <algorithm>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "sparsecomm/collectives/exchange_internal.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"

// The exchange patterns
// =====================
//
// Every pattern first reads this rank's values a_r[I] (or a_r[U]), encodes
// them (fp16/bf16 round here, at the source, and the buffer then holds the
// decoded value), and subtracts the decoded value from `accumulated`.
// Because a - decoded is exact in float (value_codec.h), the new residual plus
// what was sent is the old a_r exactly. Sums then only ever add decoded
// values in float32, so `out` is the mean of exactly what was transmitted,
// identical on every rank.
//
// Union all-reduce (union_allreduce.cc): allgather (count, index bytes, d)
//   -> allgatherv the (varint-encoded) index lists -> every rank merges
//   them into the same sorted union U (pairwise merges, log2 n levels) ->
//   all-reduce a_r[U].
// Shared indices (shared_allreduce.cc): as union, without the index
//   exchange (U = own I_r; in debug builds one allgather of (count, hash)
//   checks that all agree).
// Known ranges (selection.known, identical on all ranks): union and shared
//   add their positions to U as one more sorted run that nobody sends;
//   sparse allgather appends every rank's values there to its block (no
//   indices); sparse all-reduce merges them into each rank's list.
// The value sum of union/shared: exchange_internal.cc.
// Sparse allgather (sparse_allgather.cc): allgather (count, payload bytes,
//   d) -> allgatherv [indices][values] blocks -> every rank adds all blocks
//   in rank order.
// Sparse all-reduce: sparse_allreduce.cc.
//
// This file: the names, the argument checks every pattern shares
// (SparseExchange::exchange) and the factory.

namespace sparsecomm {
ExchangePattern parse_exchange_pattern(std::string_view name) {
  if (name == "union") return ExchangePattern::kUnionAllreduce;
  if (name == "allgather") return ExchangePattern::kSparseAllgather;
  if (name == "sparse-allreduce") return ExchangePattern::kSparseAllreduce;
  if (name == "shared") return ExchangePattern::kSharedIndices;
  if (name == "ok-topk") return ExchangePattern::kOkTopk;
  throw InvalidArgument(
      fmt::format("[exchange] unknown exchange pattern '{}' (valid: union, allgather, "
                  "sparse-allreduce, shared, ok-topk)",
                  name));
}

std::string_view exchange_pattern_name(ExchangePattern pattern) {
  switch (pattern) {
    case ExchangePattern::kUnionAllreduce:
      return "union";
    case ExchangePattern::kSparseAllgather:
      return "allgather";
    case ExchangePattern::kSparseAllreduce:
      return "sparse-allreduce";
    case ExchangePattern::kSharedIndices:
      return "shared";
    case ExchangePattern::kOkTopk:
      return "ok-topk";
  }
  return "unknown";
}

SparseAllreduceAlgorithm parse_sparse_allreduce_algorithm(std::string_view name) {
  if (name == "auto") return SparseAllreduceAlgorithm::kAuto;
  if (name == "recursive-doubling") return SparseAllreduceAlgorithm::kRecursiveDoubling;
  if (name == "split") return SparseAllreduceAlgorithm::kSplit;
  throw InvalidArgument(
      fmt::format("[exchange] unknown sparse all-reduce algorithm '{}' (valid: auto, "
                  "recursive-doubling, split)",
                  name));
}

std::string_view sparse_allreduce_algorithm_name(SparseAllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case SparseAllreduceAlgorithm::kAuto:
      return "auto";
    case SparseAllreduceAlgorithm::kRecursiveDoubling:
      return "recursive-doubling";
    case SparseAllreduceAlgorithm::kSplit:
      return "split";
  }
  return "unknown";
}

SparseExchange::SparseExchange(ExchangePattern pattern, const ExchangeOptions& options)
    : pattern_(pattern), options_(options) {
  if (!(options_.sparse_switch_factor > 0.0) ||
      options_.sparse_switch_factor == std::numeric_limits<double>::infinity()) {
    throw InvalidArgument(
        fmt::format("[exchange] sparse_switch_factor must be a positive finite number, got {}",
                    options_.sparse_switch_factor));
  }
  if (options_.dense.segment_bytes == 0) {
    throw InvalidArgument("[exchange] dense.segment_bytes must be > 0");
  }
  if (pattern_ == ExchangePattern::kSparseAllreduce && is_block_quantized(options_.values)) {
    throw InvalidArgument(fmt::format(
        "[exchange] the sparse all-reduce re-encodes slices of its values, and {} values (blocks "
        "of {} with one scale each) do not survive that: use exchange=allgather or "
        "exchange=union with them, or values=fp32, fp16 or bf16",
        value_encoding_name(options_.values), kQuantizationBlock));
  }
}

void SparseExchange::exchange(Communicator& comm, const SparseSelection& selection,
                              std::span<float> accumulated, std::span<float> out,
                              ExchangeResult& result) {
  Stopwatch clock;
  const std::size_t numel = accumulated.size();
  if (out.size() != numel) {
    throw InvalidArgument(
        detail::where(comm) +
        fmt::format("out has {} elements but accumulated has {}", out.size(), numel));
  }
  if (numel > std::size_t{std::numeric_limits<Index>::max()} + 1) {
    throw InvalidArgument(detail::where(comm) +
                          fmt::format("{} elements cannot be addressed by 32-bit indices", numel));
  }
  try {
    selection.check(numel);  // allocates nothing unless it throws
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::where(comm) + e.what());
  }
  const std::span<const Index> selected(selection.indices);
  const std::span<const Range> known(selection.known);
  known_indices_.clear();
  for (const Range& range : known) {
    for (std::size_t i = range.begin; i < range.end; ++i) {
      known_indices_.push_back(static_cast<Index>(i));
    }
  }
  result.counts.clear();
  result.union_size = 0;
  result.transmitted = {};
  result.bytes_sent = 0;
  result.bytes_received = 0;
  result.index_bytes_raw = 0;
  result.index_bytes_encoded = 0;
  run(comm, Input{selected, known, known_indices_}, accumulated, out, result);
  result.seconds = clock.seconds();
}

std::unique_ptr<SparseExchange> make_sparse_exchange(ExchangePattern pattern,
                                                     const ExchangeOptions& options) {
  switch (pattern) {
    case ExchangePattern::kUnionAllreduce:
      return detail::make_union_allreduce(options);
    case ExchangePattern::kSharedIndices:
      return detail::make_shared_allreduce(options);
    case ExchangePattern::kSparseAllgather:
      return detail::make_sparse_allgather(options);
    case ExchangePattern::kSparseAllreduce:
      return detail::make_sparse_allreduce(options);
    case ExchangePattern::kOkTopk:
      return detail::make_ok_topk(options);
  }
  throw InvalidArgument(
      fmt::format("[exchange] unknown exchange pattern {}", static_cast<int>(pattern)));
}

}  // namespace sparsecomm
