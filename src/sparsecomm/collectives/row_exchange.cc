// Row-sparse sums (see row_exchange.h for the contract and the two methods).
//
// A block is [the ids, delta varints (codec.h)][their rows, in the value
// encoding], the layout exchange_message.h decodes and checks with `width`
// values per id. Every rank adds the decoded rows of every block, its own
// included (an allgatherv delivers it too), so a lossy encoding rounds a
// rank's own rows exactly as the others see them.

#include "sparsecomm/collectives/row_exchange.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/codec.h"
#include "sparsecomm/collectives/exchange_internal.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

std::string where(const Communicator& comm) {
  return fmt::format("[row-sparse] rank {}: ", comm.rank());
}

// Appends the block of ids [first, last) of g to out, its rows in
// `encoding` (`scratch`: room for the rows while they are rounded).
void append_block(const RowSparse& g, std::size_t first, std::size_t last, ValueEncoding encoding,
                  UninitVector<std::byte>& out, UninitVector<float>& scratch) {
  encode_indices(std::span<const Index>(g.ids).subspan(first, last - first), out);
  const std::size_t at = out.size();
  const std::size_t floats = (last - first) * g.width;
  out.resize(at + floats * value_bytes(encoding));
  scratch.assign(g.values.begin() + static_cast<std::ptrdiff_t>(first * g.width),
                 g.values.begin() + static_cast<std::ptrdiff_t>(first * g.width + floats));
  encode_values(scratch, encoding, std::span<std::byte>(out).subspan(at));
}

// Throws CommError unless `bytes` can be a block of `count` ids of `width`
// values of `value_size` bytes (each varint id takes 1 to 5 bytes) and
// count fits `room` ids.
void check_announced(const Communicator& comm, int peer, std::uint64_t count, std::uint64_t bytes,
                     std::size_t width, std::size_t value_size, std::size_t room) {
  const std::uint64_t values = count * width * value_size;
  if (count > room || bytes < values + count || bytes > values + 5 * count) {
    throw CommError(where(comm) + fmt::format("rank {} announced {} rows in {} bytes, which a "
                                              "block of {}-value rows with at most {} rows "
                                              "cannot be",
                                              peer, count, bytes, width, room));
  }
}

// sum = the union of `runs` (decoded from blocks, every block's rows at its
// end), each row the sum of the blocks' rows in block order from 0.
void add_blocks(const detail::IndexRuns& runs, std::span<const std::byte> blocks,
                std::span<const std::size_t> block_bytes, std::size_t width, ValueEncoding encoding,
                RowSparse& sum, UninitVector<float>& row_scratch) {
  const std::span<const Index> u = runs.union_indices();
  sum.ids.assign(u.begin(), u.end());
  sum.values.assign(u.size() * width, 0.0f);
  std::size_t offset = 0;
  for (std::size_t q = 0; q < block_bytes.size(); ++q) {
    const std::span<const Index> ids = runs.run(q);
    const std::size_t row_bytes = ids.size() * width * value_bytes(encoding);
    offset += block_bytes[q];
    row_scratch.resize(ids.size() * width);
    decode_values(blocks.subspan(offset - row_bytes, row_bytes), encoding, row_scratch);
    std::size_t at = 0;  // ids is a subset of u, both ascending
    for (std::size_t j = 0; j < ids.size(); ++j) {
      while (u[at] < ids[j]) ++at;
      float* __restrict to = sum.values.data() + at * width;
      const float* __restrict from = row_scratch.data() + j * width;
      for (std::size_t c = 0; c < width; ++c) to[c] += from[c];
    }
  }
}

// Adds the bytes of an allgatherv on the default ring to the report.
void count_ring_allgatherv(const Communicator& comm, std::span<const std::size_t> counts,
                           RowExchangeReport& report) {
  const detail::RingBytes bytes = detail::ring_allgatherv_bytes(comm, counts);
  report.bytes_sent += bytes.sent;
  report.bytes_received += bytes.received;
}

void allgather_rows(Communicator& comm, const RowSparse& mine, std::span<const std::uint64_t> heads,
                    ValueEncoding encoding, RowSparse& sum, RowExchangeReport& report) {
  const auto n = static_cast<std::size_t>(comm.size());
  UninitVector<std::byte> send;
  UninitVector<float> scratch;
  append_block(mine, 0, mine.touched(), encoding, send, scratch);
  // Every rank's block size: announced in the header (word 1).
  std::vector<std::size_t> byte_counts(n), counts(n);
  for (std::size_t q = 0; q < n; ++q) {
    check_announced(comm, static_cast<int>(q), heads[4 * q], heads[4 * q + 1], mine.width,
                    value_bytes(encoding), mine.rows);
    counts[q] = static_cast<std::size_t>(heads[4 * q]);
    byte_counts[q] = static_cast<std::size_t>(heads[4 * q + 1]);
  }
  UninitVector<std::byte> recv(
      std::accumulate(byte_counts.begin(), byte_counts.end(), std::size_t{0}));
  comm.allgatherv(send, recv, byte_counts);
  count_ring_allgatherv(comm, byte_counts, report);
  detail::IndexRuns runs;
  runs.decode_blocks(comm, recv, byte_counts, counts, BlockFormat{encoding, true, 0, mine.rows},
                     mine.width);
  runs.build_union();
  add_blocks(runs, recv, byte_counts, mine.width, encoding, sum, scratch);
}

void split_rows(Communicator& comm, const RowSparse& mine, ValueEncoding encoding, RowSparse& sum,
                RowExchangeReport& report) {
  const int n = comm.size();
  const auto nn = static_cast<std::size_t>(n);
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t width = mine.width;
  // 1. This rank's rows of range q, to q: (count, bytes) first, then the blocks.
  UninitVector<std::byte> send;
  UninitVector<float> scratch;
  std::vector<std::size_t> send_counts(nn), recv_counts(nn);
  std::vector<std::uint64_t> meta_out(2 * nn), meta_in(2 * nn);
  std::size_t first = 0;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t range_end = chunk_begin(mine.rows, n, static_cast<int>(q) + 1);
    const auto below =
        std::partition_point(mine.ids.begin() + static_cast<std::ptrdiff_t>(first), mine.ids.end(),
                             [&](Index id) { return id < range_end; });
    const auto last = static_cast<std::size_t>(below - mine.ids.begin());
    const std::size_t start = send.size();
    append_block(mine, first, last, encoding, send, scratch);
    send_counts[q] = send.size() - start;
    meta_out[2 * q] = last - first;
    meta_out[2 * q + 1] = send_counts[q];
    first = last;
  }
  const std::vector<std::size_t> meta_counts(nn, 2 * sizeof(std::uint64_t));
  comm.alltoallv(bytes_of(std::span<const std::uint64_t>(meta_out)), meta_counts,
                 writable_bytes_of(std::span<std::uint64_t>(meta_in)), meta_counts);
  report.bytes_sent += (nn - 1) * 2 * sizeof(std::uint64_t);
  report.bytes_received += (nn - 1) * 2 * sizeof(std::uint64_t);
  const std::size_t lo = chunk_begin(mine.rows, n, static_cast<int>(r));
  const std::size_t hi = chunk_begin(mine.rows, n, static_cast<int>(r) + 1);
  std::vector<std::size_t> counts(nn);
  for (std::size_t q = 0; q < nn; ++q) {
    check_announced(comm, static_cast<int>(q), meta_in[2 * q], meta_in[2 * q + 1], width,
                    value_bytes(encoding), hi - lo);
    counts[q] = static_cast<std::size_t>(meta_in[2 * q]);
    recv_counts[q] = static_cast<std::size_t>(meta_in[2 * q + 1]);
  }
  UninitVector<std::byte> recv(
      std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
  comm.alltoallv(send, send_counts, recv, recv_counts);
  report.bytes_sent +=
      std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0}) - send_counts[r];
  report.bytes_received += recv.size() - recv_counts[r];

  // 2. The owner adds the n blocks of its range, in rank order.
  detail::IndexRuns runs;
  runs.decode_blocks(comm, recv, recv_counts, counts, BlockFormat{encoding, true, lo, hi}, width);
  runs.build_union();
  RowSparse reduced;
  reduced.reset(mine.rows, width);
  add_blocks(runs, recv, recv_counts, width, encoding, reduced, scratch);

  // 3. Every range's sum to every rank; in range order they are the sorted union.
  send.clear();
  append_block(reduced, 0, reduced.touched(), encoding, send, scratch);
  const std::array<std::uint64_t, 2> head{reduced.touched(), send.size()};
  std::vector<std::uint64_t> heads(2 * nn);
  comm.allgather(bytes_of(std::span<const std::uint64_t>(head)),
                 writable_bytes_of(std::span<std::uint64_t>(heads)));
  report.bytes_sent += (nn - 1) * sizeof head;
  report.bytes_received += (nn - 1) * sizeof head;
  std::size_t union_rows = 0;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t room = chunk_begin(mine.rows, n, static_cast<int>(q) + 1) -
                             chunk_begin(mine.rows, n, static_cast<int>(q));
    check_announced(comm, static_cast<int>(q), heads[2 * q], heads[2 * q + 1], width,
                    value_bytes(encoding), room);
    counts[q] = static_cast<std::size_t>(heads[2 * q]);
    recv_counts[q] = static_cast<std::size_t>(heads[2 * q + 1]);
    union_rows += counts[q];
  }
  recv.resize(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
  comm.allgatherv(send, recv, recv_counts);
  count_ring_allgatherv(comm, recv_counts, report);
  sum.ids.resize(union_rows);
  sum.values.resize(union_rows * width);
  std::size_t offset = 0;
  std::size_t at = 0;
  for (std::size_t q = 0; q < nn; ++q) {
    const BlockFormat range{encoding, true, chunk_begin(mine.rows, n, static_cast<int>(q)),
                            chunk_begin(mine.rows, n, static_cast<int>(q) + 1)};
    try {
      decode_block(std::span<const std::byte>(recv).subspan(offset, recv_counts[q]), range,
                   std::span<Index>(sum.ids).subspan(at, counts[q]),
                   std::span<float>(sum.values).subspan(at * width, counts[q] * width));
    } catch (const CommError& error) {
      detail::rethrow_from(comm, static_cast<int>(q), error);
    }
    offset += recv_counts[q];
    at += counts[q];
  }
}

}  // namespace

RowExchange parse_row_exchange(std::string_view name) {
  if (name == "allgather") return RowExchange::kAllgather;
  if (name == "sparse-allreduce") return RowExchange::kSparseAllreduce;
  throw InvalidArgument(
      fmt::format("unknown row exchange '{}'; valid: allgather, sparse-allreduce", name));
}

std::string_view row_exchange_name(RowExchange method) {
  return method == RowExchange::kAllgather ? "allgather" : "sparse-allreduce";
}

void row_sparse_sum(Communicator& comm, const RowSparse& mine, RowExchange method, RowSparse& sum,
                    RowExchangeReport* report, ValueEncoding values) {
  check_row_sparse(mine, "row_sparse_sum: this rank's gradient");
  if (&sum == &mine) {
    throw InvalidArgument("[row-sparse] row_sparse_sum: `sum` must not be `mine`");
  }
  RowExchangeReport local;
  RowExchangeReport& rep = report != nullptr ? *report : local;
  rep = RowExchangeReport{};
  const auto n = static_cast<std::size_t>(comm.size());
  // (touched rows, allgather block bytes, rows, width) of every rank.
  std::uint64_t block_bytes = 0;
  if (method == RowExchange::kAllgather) {
    block_bytes = encoded_index_bytes(mine.ids) + mine.values.size() * value_bytes(values);
  }
  const std::array<std::uint64_t, 4> head{mine.touched(), block_bytes, mine.rows, mine.width};
  std::vector<std::uint64_t> heads(4 * n);
  comm.allgather(bytes_of(std::span<const std::uint64_t>(head)),
                 writable_bytes_of(std::span<std::uint64_t>(heads)));
  rep.bytes_sent += (n - 1) * sizeof head;
  rep.bytes_received += (n - 1) * sizeof head;
  for (std::size_t q = 0; q < n; ++q) {  // against rank 0's, so every rank throws alike
    if (heads[4 * q + 2] != heads[2] || heads[4 * q + 3] != heads[3]) {
      throw InvalidArgument(where(comm) +
                            fmt::format("ranks disagree on the table's shape: rank 0 has {} x {}, "
                                        "rank {} has {} x {}",
                                        heads[2], heads[3], q, heads[4 * q + 2], heads[4 * q + 3]));
    }
  }
  rep.touched.resize(n);
  for (std::size_t q = 0; q < n; ++q) {
    if (heads[4 * q] > mine.rows) {
      throw CommError(where(comm) + fmt::format("rank {} announced {} rows for a table of {}", q,
                                                heads[4 * q], mine.rows));
    }
    rep.touched[q] = static_cast<std::size_t>(heads[4 * q]);
  }
  sum.reset(mine.rows, mine.width);
  if (method == RowExchange::kAllgather) {
    allgather_rows(comm, mine, heads, values, sum, rep);
  } else {
    split_rows(comm, mine, values, sum, rep);
  }
  rep.union_rows = sum.touched();
}

}  // namespace sparsecomm
