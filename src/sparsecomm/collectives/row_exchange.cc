// Row-sparse sums (see row_exchange.h for the contract and the two methods).
//
// A block is [the ids, delta varints (index_codec.h)][their rows, in the value
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
#include "sparsecomm/collectives/exchange_internal.h"
#include "sparsecomm/collectives/index_codec.h"
#include "sparsecomm/collectives/value_codec.h"
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
  out.resize(at + floats * fixed_value_bytes(encoding));
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
    const std::size_t row_bytes = ids.size() * width * fixed_value_bytes(encoding);
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
                    fixed_value_bytes(encoding), mine.rows);
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

// Row q's owner range [owner_begin(q), owner_begin(q + 1)).
std::size_t owner_begin(const Communicator& comm, std::size_t rows, std::size_t q) {
  return chunk_begin(rows, comm.size(), static_cast<int>(q));
}

// Throws InvalidArgument on every rank when a peer's announced table shape
// differs from this rank's (each rank sees every peer's announcement).
void check_shape(const Communicator& comm, int peer, std::uint64_t rows, std::uint64_t width,
                 std::size_t my_rows, std::size_t my_width) {
  if (rows != my_rows || width != my_width) {
    throw InvalidArgument(where(comm) + fmt::format("ranks disagree on the table's shape: this "
                                                    "rank has {} x {}, rank {} has {} x {}",
                                                    my_rows, my_width, peer, rows, width));
  }
}

// Where each owner's ids begin in `ids` (ascending): cuts[q] .. cuts[q + 1]
// are the ids of range q.
std::vector<std::size_t> owner_cuts(const Communicator& comm, std::span<const Index> ids,
                                    std::size_t rows) {
  const auto nn = static_cast<std::size_t>(comm.size());
  std::vector<std::size_t> cuts(nn + 1, 0);
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t range_end = owner_begin(comm, rows, q + 1);
    cuts[q + 1] = static_cast<std::size_t>(
        std::partition_point(ids.begin() + static_cast<std::ptrdiff_t>(cuts[q]), ids.end(),
                             [&](Index id) { return id < range_end; }) -
        ids.begin());
  }
  return cuts;
}

// The pairwise exchange of blocks to the owners of a rows x width table:
// block q of `send` (send_counts[q] bytes, after the earlier blocks) holds
// ids[cuts[q] .. cuts[q + 1]) and `values_per_id` values per id (0: ids
// only). An alltoallv of (count, bytes, rows, width) announcements first
// (every rank sees every peer's table shape, so ranks whose shapes differ
// all throw InvalidArgument), each checked against this rank's range;
// then the blocks. Returns the received blocks (recv_counts[q] bytes from
// q) with their ids decoded into `runs`.
UninitVector<std::byte> send_to_owners(Communicator& comm, std::span<const std::byte> send,
                                       std::span<const std::size_t> send_counts,
                                       std::span<const std::size_t> cuts, std::size_t rows,
                                       std::size_t width, std::size_t values_per_id,
                                       ValueEncoding encoding, detail::IndexRuns& runs,
                                       std::vector<std::size_t>& recv_counts,
                                       RowExchangeReport& report) {
  const auto nn = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  std::vector<std::uint64_t> out(4 * nn), in(4 * nn);
  for (std::size_t q = 0; q < nn; ++q) {
    out[4 * q] = cuts[q + 1] - cuts[q];
    out[4 * q + 1] = send_counts[q];
    out[4 * q + 2] = rows;
    out[4 * q + 3] = width;
  }
  const std::vector<std::size_t> meta_counts(nn, 4 * sizeof(std::uint64_t));
  comm.alltoallv(bytes_of(std::span<const std::uint64_t>(out)), meta_counts,
                 writable_bytes_of(std::span<std::uint64_t>(in)), meta_counts);
  report.bytes_sent += (nn - 1) * 4 * sizeof(std::uint64_t);
  report.bytes_received += (nn - 1) * 4 * sizeof(std::uint64_t);
  const std::size_t lo = owner_begin(comm, rows, r);
  const std::size_t hi = owner_begin(comm, rows, r + 1);
  std::vector<std::size_t> counts(nn);
  recv_counts.resize(nn);
  for (std::size_t q = 0; q < nn; ++q) {
    check_shape(comm, static_cast<int>(q), in[4 * q + 2], in[4 * q + 3], rows, width);
    check_announced(comm, static_cast<int>(q), in[4 * q], in[4 * q + 1], values_per_id,
                    values_per_id > 0 ? fixed_value_bytes(encoding) : 0, hi - lo);
    counts[q] = static_cast<std::size_t>(in[4 * q]);
    recv_counts[q] = static_cast<std::size_t>(in[4 * q + 1]);
  }
  UninitVector<std::byte> recv(
      std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
  comm.alltoallv(send, send_counts, recv, recv_counts);
  report.bytes_sent +=
      std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0}) - send_counts[r];
  report.bytes_received += recv.size() - recv_counts[r];
  runs.decode_blocks(comm, recv, recv_counts, counts, BlockFormat{encoding, true, lo, hi},
                     values_per_id);
  return recv;
}

// Sends each rank q this rank's rows of q's range; q adds the n blocks of
// its range in rank order into `owned` (ids global, all inside the range).
void reduce_to_owners(Communicator& comm, const RowSparse& mine, ValueEncoding encoding,
                      RowSparse& owned, RowExchangeReport& report) {
  const auto nn = static_cast<std::size_t>(comm.size());
  const std::vector<std::size_t> cuts = owner_cuts(comm, mine.ids, mine.rows);
  UninitVector<std::byte> send;
  UninitVector<float> scratch;
  std::vector<std::size_t> send_counts(nn), recv_counts;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t start = send.size();
    append_block(mine, cuts[q], cuts[q + 1], encoding, send, scratch);
    send_counts[q] = send.size() - start;
  }
  detail::IndexRuns runs;
  const UninitVector<std::byte> recv =
      send_to_owners(comm, send, send_counts, cuts, mine.rows, mine.width, mine.width, encoding,
                     runs, recv_counts, report);
  runs.build_union();
  owned.reset(mine.rows, mine.width);
  add_blocks(runs, recv, recv_counts, mine.width, encoding, owned, scratch);
}

void split_rows(Communicator& comm, const RowSparse& mine, ValueEncoding encoding, RowSparse& sum,
                RowExchangeReport& report) {
  const auto nn = static_cast<std::size_t>(comm.size());
  const std::size_t width = mine.width;
  // 1-2. Each range reduced on its owner.
  RowSparse reduced;
  reduce_to_owners(comm, mine, encoding, reduced, report);
  UninitVector<std::byte> send;
  UninitVector<float> scratch;
  std::vector<std::size_t> counts(nn), recv_counts(nn);
  UninitVector<std::byte> recv;

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
    const std::size_t room = owner_begin(comm, mine.rows, q + 1) - owner_begin(comm, mine.rows, q);
    check_announced(comm, static_cast<int>(q), heads[2 * q], heads[2 * q + 1], width,
                    fixed_value_bytes(encoding), room);
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
    const BlockFormat range{encoding, true, owner_begin(comm, mine.rows, q),
                            owner_begin(comm, mine.rows, q + 1)};
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
  fixed_value_bytes(values, "a row exchange");  // before any message
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
    block_bytes = encoded_index_bytes(mine.ids) + mine.values.size() * fixed_value_bytes(values);
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

namespace sparsecomm {

std::size_t row_owner_begin(std::size_t rows, int ranks, int owner) {
  return chunk_begin(rows, ranks, owner);
}

void push_rows_to_owners(Communicator& comm, const RowSparse& mine, RowSparse& owned,
                         RowExchangeReport* report, ValueEncoding values) {
  check_row_sparse(mine, "push_rows_to_owners: this rank's gradient");
  fixed_value_bytes(values, "a row exchange");
  if (&owned == &mine) {
    throw InvalidArgument("[row-sparse] push_rows_to_owners: `owned` must not be `mine`");
  }
  RowExchangeReport local;
  RowExchangeReport& rep = report != nullptr ? *report : local;
  rep = RowExchangeReport{};
  reduce_to_owners(comm, mine, values, owned, rep);
  rep.union_rows = owned.touched();
}

void pull_rows_from_owners(Communicator& comm, std::span<const Index> ids,
                           std::span<const float> shard, std::size_t rows, std::size_t width,
                           RowSparse& out, RowExchangeReport* report, ValueEncoding values) {
  fixed_value_bytes(values, "a row exchange");
  const auto nn = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t lo = owner_begin(comm, rows, r);
  const std::size_t hi = owner_begin(comm, rows, r + 1);
  if (shard.size() != (hi - lo) * width) {
    throw InvalidArgument(where(comm) + fmt::format("pull_rows_from_owners: this rank owns rows "
                                                    "[{}, {}) of {} floats: {} floats, not {}",
                                                    lo, hi, width, (hi - lo) * width,
                                                    shard.size()));
  }
  for (std::size_t j = 0; j < ids.size(); ++j) {
    if (ids[j] >= rows || (j > 0 && ids[j] <= ids[j - 1])) {
      throw InvalidArgument(where(comm) +
                            fmt::format("pull_rows_from_owners: wanted row {} is {}; the ids must "
                                        "be strictly ascending and below the table's {} rows",
                                        j, ids[j], rows));
    }
  }
  RowExchangeReport local;
  RowExchangeReport& rep = report != nullptr ? *report : local;
  rep = RowExchangeReport{};
  const std::size_t row_bytes = width * fixed_value_bytes(values);

  // 1. Each owner learns which of its rows this rank wants (index-only blocks).
  const std::vector<std::size_t> cuts = owner_cuts(comm, ids, rows);
  UninitVector<std::byte> send;
  std::vector<std::size_t> send_counts(nn), recv_counts;
  for (std::size_t q = 0; q < nn; ++q) {
    send_counts[q] = encode_indices(ids.subspan(cuts[q], cuts[q + 1] - cuts[q]), send);
  }
  detail::IndexRuns runs;
  send_to_owners(comm, send, send_counts, cuts, rows, width, 0, values, runs, recv_counts, rep);

  // 2. The owner answers each rank with those rows, in the value encoding,
  // in the order asked (ascending): the asker knows every reply's size.
  UninitVector<std::byte> reply;
  UninitVector<float> scratch;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::span<const Index> asked = runs.run(q);
    send_counts[q] = asked.size() * row_bytes;
    scratch.resize(asked.size() * width);
    for (std::size_t j = 0; j < asked.size(); ++j) {
      std::copy_n(shard.data() + (asked[j] - lo) * width, width, scratch.data() + j * width);
    }
    const std::size_t at = reply.size();
    reply.resize(at + send_counts[q]);
    encode_values(scratch, values, std::span<std::byte>(reply).subspan(at));
    recv_counts[q] = (cuts[q + 1] - cuts[q]) * row_bytes;
  }
  UninitVector<std::byte> recv(ids.size() * row_bytes);
  comm.alltoallv(reply, send_counts, recv, recv_counts);
  rep.bytes_sent +=
      std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0}) - send_counts[r];
  rep.bytes_received += recv.size() - recv_counts[r];
  out.reset(rows, width);
  out.ids.assign(ids.begin(), ids.end());
  out.values.resize(ids.size() * width);
  decode_values(recv, values, out.values);
  rep.union_rows = ids.size();
}

}  // namespace sparsecomm
