// The split algorithm of the sparse all-reduce (sparse_allreduce.cc
// describes it): owners of n contiguous ranges reduce their range, then
// every reduced range goes to every rank.

#include <algorithm>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "sparsecomm/collectives/exchange_internal.h"
#include "sparsecomm/collectives/sparse_allreduce_internal.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::detail {

void SparseAllreduce::split_allreduce(Communicator& comm, std::span<const Index> selected,
                                      std::span<float> out, ExchangeResult& result) {
  const std::size_t numel = out.size();
  split_send_to_owners(comm, selected, numel, result);
  split_reduce_range(comm, numel);
  split_share_reduced(comm, numel, result);
  split_unpack(comm, out, result);
}

// 1-2. Cuts this rank's list at the owners' range boundaries and sends each
// owner its block: sizes first (checked against the range), then the blocks.
void SparseAllreduce::split_send_to_owners(Communicator& comm, std::span<const Index> selected,
                                           std::size_t numel, ExchangeResult& result) {
  const int n = comm.size();
  const int r = comm.rank();
  const auto nn = static_cast<std::size_t>(n);
  const auto rr = static_cast<std::size_t>(r);
  const std::size_t width = fixed_value_bytes(options().values);
  const bool encoded = options().encode_indices;
  // 1. One [indices][values] block per owner, from the slices of own I_r.
  wire_.send.clear();
  send_counts_.resize(nn);
  meta_out_.resize(2 * nn);
  std::size_t pos = 0;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t range_end = chunk_begin(numel, n, static_cast<int>(q) + 1);
    std::size_t stop = pos;
    while (stop < selected.size() && selected[stop] < range_end) ++stop;
    const std::size_t start = wire_.send.size();
    const std::size_t index_bytes =
        append_indices(selected.subspan(pos, stop - pos), encoded, wire_.send);
    result.index_bytes_raw += sizeof(Index) * (stop - pos);
    result.index_bytes_encoded += index_bytes;
    wire_.send.resize(start + index_bytes + (stop - pos) * width);
    encode_values(std::span<float>(wire_.values.data() + pos, stop - pos), options().values,
                  std::span<std::byte>(wire_.send).subspan(start + index_bytes));
    send_counts_[q] = wire_.send.size() - start;
    meta_out_[2 * q] = stop - pos;
    meta_out_[2 * q + 1] = index_bytes;
    pos = stop;
  }

  // 2. Sizes, then blocks, to their owners.
  meta_counts_.assign(nn, 2 * sizeof(std::uint64_t));
  meta_in_.resize(2 * nn);
  comm.alltoallv(bytes_of(std::span<const std::uint64_t>(meta_out_)), meta_counts_,
                 writable_bytes_of(std::span<std::uint64_t>(meta_in_)), meta_counts_);
  result.bytes_sent += (nn - 1) * 2 * sizeof(std::uint64_t);
  result.bytes_received += (nn - 1) * 2 * sizeof(std::uint64_t);
  const std::size_t lo = chunk_begin(numel, n, r);
  const std::size_t hi = chunk_begin(numel, n, r + 1);
  const std::size_t len = hi - lo;
  recv_counts_.resize(nn);
  for (std::size_t q = 0; q < nn; ++q) {
    const std::uint64_t q_count = meta_in_[2 * q];
    const std::uint64_t q_index_bytes = meta_in_[2 * q + 1];
    if (q_count > len || q_index_bytes > 5 * q_count) {
      throw CommError(
          where(comm) +
          fmt::format("rank {} announced {} entries ({} index bytes) for a range of {} elements", q,
                      q_count, q_index_bytes, len));
    }
    recv_counts_[q] = q_index_bytes + q_count * width;
  }
  wire_.recv.resize(std::accumulate(recv_counts_.begin(), recv_counts_.end(), std::size_t{0}));
  comm.alltoallv(wire_.send, send_counts_, wire_.recv, recv_counts_);
  result.bytes_sent +=
      std::accumulate(send_counts_.begin(), send_counts_.end(), std::size_t{0}) - send_counts_[rr];
  result.bytes_received += wire_.recv.size() - recv_counts_[rr];
}

// 3. The owner adds the n blocks of its range, in rank order, into current_
// (range_hit_ marks the positions some rank sent).
void SparseAllreduce::split_reduce_range(Communicator& comm, std::size_t numel) {
  const int n = comm.size();
  const int r = comm.rank();
  const auto nn = static_cast<std::size_t>(n);
  const bool encoded = options().encode_indices;
  const std::size_t lo = chunk_begin(numel, n, r);
  const std::size_t hi = chunk_begin(numel, n, r + 1);
  const std::size_t len = hi - lo;
  PartialSum& range = current_;
  PartialSum& block = incoming_;
  range.values.assign(len, 0.0f);
  range_hit_.assign(len, 0);
  std::size_t offset = 0;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t q_count = meta_in_[2 * q];
    // [q_index_bytes (meta_in_[2q+1], checked above) of indices][values]
    const std::span<const std::byte> bytes(wire_.recv.data() + offset, recv_counts_[q]);
    block.indices.resize(q_count);
    block.values.resize(q_count);
    decode_block_from(comm, static_cast<int>(q), bytes,
                      BlockFormat{options().values, encoded, lo, hi}, block.indices, block.values);
    for (std::size_t j = 0; j < q_count; ++j) {
      const std::size_t k = block.indices[j] - lo;
      range.values[k] += block.values[j];
      range_hit_[k] = 1;
    }
    offset += recv_counts_[q];
  }
}

// 4. The reduced range, sparse (indices + float32) or dense (float32),
// whichever is smaller; then every range to every rank.
void SparseAllreduce::split_share_reduced(Communicator& comm, std::size_t numel,
                                          ExchangeResult& result) {
  const int n = comm.size();
  const int r = comm.rank();
  const auto nn = static_cast<std::size_t>(n);
  const auto rr = static_cast<std::size_t>(r);
  const bool encoded = options().encode_indices;
  const std::size_t lo = chunk_begin(numel, n, r);
  const std::size_t len = chunk_begin(numel, n, r + 1) - lo;
  const PartialSum& range = current_;
  PartialSum& reduced = spare_;
  reduced.indices.clear();
  reduced.values.clear();
  for (std::size_t k = 0; k < len; ++k) {
    if (range_hit_[k] != 0) {
      reduced.indices.push_back(static_cast<Index>(lo + k));
      reduced.values.push_back(range.values[k]);
    }
  }
  const std::size_t nnz = reduced.indices.size();
  const std::size_t sparse_index_bytes =
      encoded ? encoded_index_bytes(reduced.indices) : sizeof(Index) * nnz;
  const bool dense = sparse_index_bytes + nnz * sizeof(float) > len * sizeof(float);
  wire_.send.clear();
  std::size_t index_bytes = 0;
  if (dense) {
    wire_.send.resize(len * sizeof(float));
    if (len > 0) std::memcpy(wire_.send.data(), range.values.data(), len * sizeof(float));
  } else {
    index_bytes = append_indices(reduced.indices, encoded, wire_.send);
    result.index_bytes_raw += sizeof(Index) * nnz;
    result.index_bytes_encoded += index_bytes;
    wire_.send.resize(index_bytes + nnz * sizeof(float));
    if (nnz > 0) {
      std::memcpy(wire_.send.data() + index_bytes, reduced.values.data(), nnz * sizeof(float));
    }
  }
  const std::array<std::uint64_t, 4> mine{dense ? kDenseFlag : 0, nnz, index_bytes,
                                          wire_.send.size()};
  wire_.headers.resize(4 * nn);
  comm.allgather(bytes_of(std::span<const std::uint64_t>(mine)),
                 writable_bytes_of(std::span<std::uint64_t>(wire_.headers)));
  result.bytes_sent += (nn - 1) * sizeof mine;
  result.bytes_received += (nn - 1) * sizeof mine;
  wire_.byte_counts.resize(nn);
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t q_len =
        chunk_begin(numel, n, static_cast<int>(q) + 1) - chunk_begin(numel, n, static_cast<int>(q));
    const std::uint64_t q_flags = wire_.headers[4 * q];
    const std::uint64_t q_nnz = wire_.headers[4 * q + 1];
    const std::uint64_t q_index_bytes = wire_.headers[4 * q + 2];
    const std::uint64_t q_bytes = wire_.headers[4 * q + 3];
    const bool ok = q_nnz <= q_len &&
                    (q_flags == kDenseFlag ? q_bytes == q_len * sizeof(float) && q_index_bytes == 0
                                           : q_flags == 0 && q_index_bytes <= 5 * q_nnz &&
                                                 q_bytes == q_index_bytes + q_nnz * sizeof(float));
    if (!ok) {
      throw CommError(
          where(comm) +
          fmt::format(
              "rank {} announced a malformed reduced range (flags {}, {} entries, {} bytes) for {} "
              "elements",
              q, q_flags, q_nnz, q_bytes, q_len));
    }
    wire_.byte_counts[q] = q_bytes;
  }
  wire_.recv.resize(
      std::accumulate(wire_.byte_counts.begin(), wire_.byte_counts.end(), std::size_t{0}));
  comm.allgatherv(std::span<const std::byte>(wire_.send), wire_.recv, wire_.byte_counts);
  result.bytes_sent += wire_.recv.size() - wire_.byte_counts[(rr + 1) % nn];
  result.bytes_received += wire_.recv.size() - wire_.byte_counts[rr];
}

// 5. Unpacks every range into out, divided by n.
void SparseAllreduce::split_unpack(Communicator& comm, std::span<float> out,
                                   ExchangeResult& result) {
  const std::size_t numel = out.size();
  const int n = comm.size();
  const auto nn = static_cast<std::size_t>(n);
  const bool encoded = options().encode_indices;
  PartialSum& block = incoming_;
  const auto divisor = static_cast<float>(n);
  std::size_t offset = 0;
  std::size_t union_size = 0;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t q_lo = chunk_begin(numel, n, static_cast<int>(q));
    const std::size_t q_len = chunk_begin(numel, n, static_cast<int>(q) + 1) - q_lo;
    const std::size_t q_nnz = wire_.headers[4 * q + 1];
    const std::span<const std::byte> bytes(wire_.recv.data() + offset, wire_.byte_counts[q]);
    union_size += q_nnz;
    if (wire_.headers[4 * q] == kDenseFlag) {
      const std::span<float> dst = out.subspan(q_lo, q_len);
      decode_values(bytes, ValueEncoding::kFloat32, dst);
      for (float& v : dst) v /= divisor;
    } else {
      std::fill(out.begin() + static_cast<std::ptrdiff_t>(q_lo),
                out.begin() + static_cast<std::ptrdiff_t>(q_lo + q_len), 0.0f);
      block.indices.resize(q_nnz);
      block.values.resize(q_nnz);
      decode_block_from(comm, static_cast<int>(q), bytes,
                        BlockFormat{ValueEncoding::kFloat32, encoded, q_lo, q_lo + q_len},
                        block.indices, block.values);
      for (std::size_t j = 0; j < q_nnz; ++j) out[block.indices[j]] = block.values[j] / divisor;
    }
    offset += wire_.byte_counts[q];
  }
  result.union_size = union_size;
}

}  // namespace sparsecomm::detail
