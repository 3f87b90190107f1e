#pragma once
// The sum over ranks of row-sparse gradients (core/row_sparse.h), never
// densified (docs/algorithms.md, "Row-sparse exchange").
//
// row_sparse_sum leaves every rank with the same RowSparse: the union of
// the ranks' ids, each row the sum over ranks of that row, added in rank
// order starting from 0 (so both methods, and every rank, give the same
// bits). Two methods:
//  - kAllgather: an allgather of (count, bytes, rows, width) headers, an
//    allgatherv of every rank's [ids as delta varints][rows, float32] block,
//    then every rank adds the n blocks. A rank receives the others' rows:
//    (n - 1) x a rank's rows, the lower bound of any exchange that leaves
//    every rank every contribution.
//  - kSparseAllreduce: SparCML's split at row granularity. The id space is
//    cut into n contiguous ranges, range q owned by rank q; an alltoallv
//    sends each rank's rows of range q to q, the owner adds them, and an
//    allgatherv of the reduced ranges (in range order: already the sorted
//    union) gives every rank the sum. About (n - 1) / n x (m + |U|) rows
//    received per rank (m: a rank's rows; at most 2 (n - 1) / n |U|) when
//    they spread over the ranges: fewer than the allgather's (n - 1) m
//    unless |U| > (n - 1) m, i.e. unless the ranks' rows barely overlap.
// Both check every byte they receive (ids ascending and in range, counts
// the bytes can hold) and throw CommError naming the sender otherwise.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/codec.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/row_sparse.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

enum class RowExchange { kAllgather, kSparseAllreduce };
// "allgather", "sparse-allreduce"; InvalidArgument listing them otherwise.
RowExchange parse_row_exchange(std::string_view name);
std::string_view row_exchange_name(RowExchange method);

struct RowExchangeReport {
  std::vector<std::size_t> touched;  // every rank's touched rows, in rank order
  std::size_t union_rows = 0;        // rows of the sum
  std::uint64_t bytes_sent = 0;  // this rank's, as the default ring/pairwise algorithms move them
  std::uint64_t bytes_received = 0;
};

// Collective: every rank calls with a table of the same shape, the same
// method and the same value encoding. `mine` is checked first
// (InvalidArgument before any message); ranks whose shapes differ all throw
// InvalidArgument. `sum` must not alias `mine`. The report, when given, is
// this rank's. `values` other than fp32 send the rows as fp16 or bf16
// (codec.h; the split all-reduce rounds the owners' sums again): half the
// rows' bytes; every rank adds the same rounded rows, so the sum is still
// the same bits on every rank.
void row_sparse_sum(Communicator& comm, const RowSparse& mine, RowExchange method, RowSparse& sum,
                    RowExchangeReport* report = nullptr,
                    ValueEncoding values = ValueEncoding::kFloat32);

}  // namespace sparsecomm
