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
// Row owners (the sharded tables of a parameter server co-located with the
// workers): rank q owns the rows [row_owner_begin(q), row_owner_begin(q +
// 1)) of the table, the split's ranges, and only it stores them.
//  - push_rows_to_owners is the split's first half: every rank's rows of
//    range q go to q, which adds them in rank order. (n - 1) / n x m rows
//    sent per rank when they spread over the ranges.
//  - pull_rows_from_owners fetches the rows a rank's next batch reads: the
//    ids go to their owners (varints), the rows come back. (n - 1) / n x m
//    rows received per rank.
// Every function here checks every byte it receives (ids ascending and in range, counts
// the bytes can hold) and throw CommError naming the sender otherwise.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/row_sparse.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

enum class RowExchange { kAllgather, kSparseAllreduce };
// "allgather", "sparse-allreduce"; InvalidArgument listing them otherwise.
RowExchange parse_row_exchange(std::string_view name);
std::string_view row_exchange_name(RowExchange method);

struct RowExchangeReport {
  // Every rank's touched rows, in rank order (row_sparse_sum only).
  std::vector<std::size_t> touched;
  // Rows of the result: the sum's; a push's owned rows; a pull's rows.
  std::size_t union_rows = 0;
  std::uint64_t bytes_sent = 0;  // this rank's, as the default ring/pairwise algorithms move them
  std::uint64_t bytes_received = 0;
};

// Collective: every rank calls with a table of the same shape, the same
// method and the same value encoding. `mine` is checked first
// (InvalidArgument before any message); ranks whose shapes differ all throw
// InvalidArgument. `sum` must not alias `mine`. The report, when given, is
// this rank's. `values` other than fp32 send the rows as fp16 or bf16
// (value_codec.h; the split all-reduce rounds the owners' sums again): half the
// rows' bytes; every rank adds the same rounded rows, so the sum is still
// the same bits on every rank.
void row_sparse_sum(Communicator& comm, const RowSparse& mine, RowExchange method, RowSparse& sum,
                    RowExchangeReport* report = nullptr,
                    ValueEncoding values = ValueEncoding::kFloat32);

// The first row of `owner`'s range when `ranks` ranks own a table of `rows`
// rows: near-equal contiguous ranges in rank order (allreduce.h's chunks).
std::size_t row_owner_begin(std::size_t rows, int ranks, int owner);

// Collective: every rank's `mine` (checked first, InvalidArgument before any
// message) goes to the rows' owners; `owned` gets this rank's range: the
// union of the ranks' ids in it (global ids), each row the sum over ranks
// in rank order from 0, bit for bit row_sparse_sum's rows there. Ranks
// whose table shapes differ all throw InvalidArgument. `values` as for
// row_sparse_sum: every owner adds the rounded rows.
void push_rows_to_owners(Communicator& comm, const RowSparse& mine, RowSparse& owned,
                         RowExchangeReport* report = nullptr,
                         ValueEncoding values = ValueEncoding::kFloat32);

// Collective: `out` gets the rows `ids` (strictly ascending, below `rows`;
// InvalidArgument before any message otherwise) of a rows x width table of
// which this rank stores its owned range in `shard` (row-major, exactly the
// range's rows x width floats). Each row arrives in `values` (a 16-bit
// encoding rounds it, the same for every asker, the owner included).
void pull_rows_from_owners(Communicator& comm, std::span<const Index> ids,
                           std::span<const float> shard, std::size_t rows, std::size_t width,
                           RowSparse& out, RowExchangeReport* report = nullptr,
                           ValueEncoding values = ValueEncoding::kFloat32);

}  // namespace sparsecomm
