// SparCML-style sparse all-reduce: the kSparseAllreduce pattern of
// SparseExchanger (see sparse_exchange.h for the shared contract).
//
// Both algorithms start from this rank's decoded values at its own I_r
// (sparse_exchange.cc's rule: the residual already keeps a_r - decoded) and
// end with the same sum on every rank, bit for bit.
//
// Recursive doubling (small data; latency ceil(log2 n) + 2 rounds):
//   p = the largest power of two <= n. Ranks r >= p first hand their list to
//   r - p and wait for the final sum at the end. The p others run log2 p
//   rounds: in round k, rank r swaps its partial sum with r ^ 2^k and merges
//   (sorted merge, duplicates added). A partial sum is a sorted
//   (index, value) list until its sparse wire size exceeds the dense one
//   (bitmap of touched positions + d values), then a dense vector; once
//   dense it stays dense. Each message is a 32-byte header (format, value
//   encoding, nnz, sizes) and then the payload. Own values travel in the
//   chosen encoding, partial sums in float32 (re-rounding them would break
//   "out is the mean of what was sent"). Float addition commutes, so both
//   partners of a round compute identical sums and every rank ends with the
//   same bits.
// Split (large data; bandwidth about 2 * nnz / n per rank and phase):
//   [0, d) is cut into n contiguous ranges (chunk_begin); range q belongs to
//   rank q. One alltoallv of (count, index bytes) per pair, one alltoallv of
//   the [indices][values] blocks, the owner adds its n blocks in rank order
//   into a dense range buffer, then one allgather of 32-byte headers and an
//   allgatherv of the reduced ranges, each sent sparse (indices + float32)
//   or dense (float32 values), whichever is smaller (flag in the header).
// kAuto: recursive doubling when (sum of counts) * sparse_switch_factor < d,
//   else split.

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

constexpr std::uint64_t kDenseFlag = 1;

std::string where(const Communicator& comm) {
  return fmt::format("[exchange] rank {}: ", comm.rank());
}

std::size_t bitmap_bytes(std::size_t numel) { return (numel + 7) / 8; }

std::size_t popcount_bytes(std::span<const std::uint8_t> bits) {
  std::size_t total = 0;
  std::size_t i = 0;
  for (; i + 8 <= bits.size(); i += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, bits.data() + i, sizeof word);
    total += static_cast<std::size_t>(std::popcount(word));
  }
  for (; i < bits.size(); ++i) total += static_cast<std::size_t>(std::popcount(bits[i]));
  return total;
}

void set_bit(std::uint8_t* bits, std::size_t i) {
  bits[i / 8] = static_cast<std::uint8_t>(bits[i / 8] | (1u << (i % 8)));
}

// Appends indices (varints or raw uint32) to out; returns the bytes appended.
std::size_t append_indices(std::span<const Index> indices, bool encode,
                           UninitVector<std::byte>& out) {
  if (encode) return encode_indices(indices, out);
  const std::size_t start = out.size();
  out.resize(start + indices.size_bytes());
  if (!indices.empty()) std::memcpy(out.data() + start, indices.data(), indices.size_bytes());
  return indices.size_bytes();
}

// Reads exactly list.size() indices from in (all of it), or throws.
void read_indices(const Communicator& comm, int peer, std::span<const std::byte> in, bool encoded,
                  std::span<Index> list) {
  std::size_t used = list.size_bytes();
  if (encoded) {
    used = decode_indices(in, list);
  } else if (used == in.size() && used > 0) {
    std::memcpy(list.data(), in.data(), used);
  }
  if (used != in.size()) {
    throw CommError(where(comm) +
                    fmt::format("rank {} sent {} index bytes that do not hold exactly {} indices",
                                peer, in.size(), list.size()));
  }
}

}  // namespace

void SparseExchanger::exchange_sparse_allreduce(Communicator& comm, std::span<const Index> selected,
                                                std::span<float> accumulated, std::span<float> out,
                                                ExchangeResult& result) {
  const std::size_t numel = accumulated.size();
  const std::size_t count = selected.size();
  gather_headers(comm, count, 0, numel, result);
  const std::size_t total =
      std::accumulate(result.counts.begin(), result.counts.end(), std::size_t{0});
  SparseAllreduceAlgorithm algorithm = options_.sparse_algorithm;
  if (algorithm == SparseAllreduceAlgorithm::kAuto) {
    algorithm =
        static_cast<double>(total) * options_.sparse_switch_factor < static_cast<double>(numel)
            ? SparseAllreduceAlgorithm::kRecursiveDoubling
            : SparseAllreduceAlgorithm::kSplit;
  }
  values_.resize(count);
  for (std::size_t j = 0; j < count; ++j) values_[j] = accumulated[selected[j]];
  send_bytes_.resize(count * value_bytes(options_.values));
  encode_values(values_, options_.values, send_bytes_);
  for (std::size_t j = 0; j < count; ++j) accumulated[selected[j]] -= values_[j];
  union_.assign(selected.begin(), selected.end());
  if (algorithm == SparseAllreduceAlgorithm::kRecursiveDoubling) {
    recursive_doubling(comm, selected, out, result);
  } else {
    split_allreduce(comm, selected, out, result);
  }
  result.transmitted = union_;
}

// --- recursive doubling ---

void SparseExchanger::densify_if_smaller(PartialSum& partial, std::size_t numel) {
  if (partial.dense) return;
  const std::size_t width = value_bytes(partial.encoding);
  const std::size_t nnz = partial.indices.size();
  const std::size_t index_bytes =
      options_.encode_indices ? encoded_index_bytes(partial.indices) : sizeof(Index) * nnz;
  if (index_bytes + nnz * width <= bitmap_bytes(numel) + numel * width) return;
  PartialSum& dense = partials_[2];
  dense.dense = true;
  dense.encoding = partial.encoding;
  dense.values.assign(numel, 0.0f);
  dense.present.assign(bitmap_bytes(numel), 0);
  for (std::size_t j = 0; j < nnz; ++j) {
    dense.values[partial.indices[j]] = partial.values[j];
    set_bit(dense.present.data(), partial.indices[j]);
  }
  std::swap(partial, dense);
}

// send_bytes_ and wire_header_out_ = the wire form of `partial`.
void SparseExchanger::serialize_partial(PartialSum& partial, std::size_t numel,
                                        ExchangeResult& result) {
  const std::size_t width = value_bytes(partial.encoding);
  send_bytes_.clear();
  std::uint64_t nnz = 0;
  std::uint64_t index_bytes = 0;
  if (partial.dense) {
    const std::size_t bits = bitmap_bytes(numel);
    send_bytes_.resize(bits + numel * width);
    if (bits > 0) std::memcpy(send_bytes_.data(), partial.present.data(), bits);
    encode_values(std::span<float>(partial.values.data(), numel), partial.encoding,
                  std::span<std::byte>(send_bytes_).subspan(bits));
    nnz = popcount_bytes(partial.present);
  } else {
    nnz = partial.indices.size();
    index_bytes = append_indices(partial.indices, options_.encode_indices, send_bytes_);
    result.index_bytes_raw += sizeof(Index) * nnz;
    result.index_bytes_encoded += index_bytes;
    send_bytes_.resize(index_bytes + nnz * width);
    encode_values(partial.values, partial.encoding,
                  std::span<std::byte>(send_bytes_).subspan(index_bytes));
  }
  const std::uint64_t flags =
      (partial.dense ? kDenseFlag : 0) | static_cast<std::uint64_t>(partial.encoding) << 8;
  wire_header_out_ = {flags, nnz, index_bytes, send_bytes_.size()};
}

// partials_[1] = the partial sum in wire_header_in_ + recv_bytes_, checked.
void SparseExchanger::deserialize_partial(Communicator& comm, int peer, std::size_t numel) {
  const auto& header = wire_header_in_;
  const std::uint64_t flags = header[0];
  const std::uint64_t encoding = flags >> 8;
  if ((flags & ~(kDenseFlag | 0xFF00ull)) != 0 ||
      encoding > static_cast<std::uint64_t>(ValueEncoding::kBFloat16)) {
    throw CommError(where(comm) +
                    fmt::format("rank {} sent a malformed header (flags {:#x})", peer, flags));
  }
  PartialSum& in = partials_[1];
  in.dense = (flags & kDenseFlag) != 0;
  in.encoding = static_cast<ValueEncoding>(encoding);
  const std::size_t width = value_bytes(in.encoding);
  const std::span<const std::byte> bytes(recv_bytes_);
  if (in.dense) {
    const std::size_t bits = bitmap_bytes(numel);
    if (bytes.size() != bits + numel * width) {
      throw CommError(where(comm) +
                      fmt::format("rank {} sent a dense partial sum of {} bytes, expected {}", peer,
                                  bytes.size(), bits + numel * width));
    }
    in.present.resize(bits);
    if (bits > 0) std::memcpy(in.present.data(), bytes.data(), bits);
    in.values.resize(numel);
    decode_values(bytes.subspan(bits), in.encoding, in.values);
    return;
  }
  const std::uint64_t nnz = header[1];
  const std::uint64_t index_bytes = header[2];
  if (nnz > numel || index_bytes > bytes.size() || bytes.size() - index_bytes != nnz * width) {
    throw CommError(
        where(comm) +
        fmt::format(
            "rank {} sent a sparse partial sum of {} bytes that cannot hold {} entries of d = {}",
            peer, bytes.size(), nnz, numel));
  }
  in.indices.resize(nnz);
  read_indices(comm, peer, bytes.subspan(0, index_bytes), options_.encode_indices, in.indices);
  if (nnz > 0 && in.indices.back() >= numel) {
    throw CommError(where(comm) + fmt::format("rank {} sent index {} for d = {}", peer,
                                              in.indices.back(), numel));
  }
  in.values.resize(nnz);
  decode_values(bytes.subspan(index_bytes), in.encoding, in.values);
}

// partials_[0] += partials_[1]; symmetric in the two operands, so two
// partners that merge each other's sums get the same bits.
void SparseExchanger::merge_partial(std::size_t numel) {
  PartialSum& mine = partials_[0];
  PartialSum& theirs = partials_[1];
  if (!mine.dense && !theirs.dense) {
    PartialSum& merged = partials_[2];
    merged.dense = false;
    const std::size_t na = mine.indices.size();
    const std::size_t nb = theirs.indices.size();
    merged.indices.resize(na + nb);
    merged.values.resize(na + nb);
    const Index* ia = mine.indices.data();
    const Index* ib = theirs.indices.data();
    const float* va = mine.values.data();
    const float* vb = theirs.values.data();
    Index* io = merged.indices.data();
    float* vo = merged.values.data();
    std::size_t a = 0, b = 0, k = 0;
    while (a < na && b < nb) {
      if (ia[a] < ib[b]) {
        io[k] = ia[a];
        vo[k++] = va[a++];
      } else if (ib[b] < ia[a]) {
        io[k] = ib[b];
        vo[k++] = vb[b++];
      } else {
        io[k] = ia[a];
        vo[k++] = va[a++] + vb[b++];
      }
    }
    for (; a < na; ++a, ++k) {
      io[k] = ia[a];
      vo[k] = va[a];
    }
    for (; b < nb; ++b, ++k) {
      io[k] = ib[b];
      vo[k] = vb[b];
    }
    merged.indices.resize(k);
    merged.values.resize(k);
    std::swap(mine, merged);
  } else if (mine.dense && theirs.dense) {
    float* __restrict dst = mine.values.data();
    const float* __restrict src = theirs.values.data();
    for (std::size_t i = 0; i < numel; ++i) dst[i] += src[i];
    for (std::size_t i = 0; i < mine.present.size(); ++i) {
      mine.present[i] = static_cast<std::uint8_t>(mine.present[i] | theirs.present[i]);
    }
  } else {
    if (!mine.dense) std::swap(mine, theirs);  // now mine is dense, theirs sparse
    for (std::size_t j = 0; j < theirs.indices.size(); ++j) {
      mine.values[theirs.indices[j]] += theirs.values[j];
      set_bit(mine.present.data(), theirs.indices[j]);
    }
  }
  mine.encoding = ValueEncoding::kFloat32;  // sums travel in full precision
  densify_if_smaller(mine, numel);
}

void SparseExchanger::recursive_doubling(Communicator& comm, std::span<const Index> selected,
                                         std::span<float> out, ExchangeResult& result) {
  const std::size_t numel = out.size();
  const int n = comm.size();
  const int r = comm.rank();
  PartialSum& own = partials_[0];
  own.dense = false;
  own.encoding = options_.values;
  own.indices.assign(selected.begin(), selected.end());
  own.values.assign(values_.begin(), values_.end());
  densify_if_smaller(own, numel);

  const std::size_t max_wire = bitmap_bytes(numel) + 9 * numel;  // dense, or 5 + 4 bytes per entry
  const auto header_bytes = [](std::array<std::uint64_t, 4>& h) {
    return writable_bytes_of(std::span<std::uint64_t>(h));
  };
  const auto check_incoming = [&](int peer) {
    if (wire_header_in_[3] > max_wire) {
      throw CommError(
          where(comm) +
          fmt::format(
              "rank {} announced a partial sum of {} bytes, more than any of d = {} can take", peer,
              wire_header_in_[3], numel));
    }
    recv_bytes_.resize(wire_header_in_[3]);
  };
  const auto send_to = [&](int peer) {
    serialize_partial(partials_[0], numel, result);
    Request header = comm.isend(header_bytes(wire_header_out_), peer, tags::kSparseAllreduceHeader);
    comm.send(send_bytes_, peer, tags::kSparseAllreducePayload);
    header.wait();
    result.bytes_sent += sizeof wire_header_out_ + send_bytes_.size();
  };
  const auto receive_from = [&](int peer) {
    comm.recv(header_bytes(wire_header_in_), peer, tags::kSparseAllreduceHeader);
    check_incoming(peer);
    comm.recv(recv_bytes_, peer, tags::kSparseAllreducePayload);
    result.bytes_received += sizeof wire_header_in_ + recv_bytes_.size();
    deserialize_partial(comm, peer, numel);
  };
  const auto swap_with = [&](int peer) {
    serialize_partial(partials_[0], numel, result);
    Request header_out =
        comm.isend(header_bytes(wire_header_out_), peer, tags::kSparseAllreduceHeader);
    comm.recv(header_bytes(wire_header_in_), peer, tags::kSparseAllreduceHeader);
    check_incoming(peer);
    Request payload_out = comm.isend(send_bytes_, peer, tags::kSparseAllreducePayload);
    comm.recv(recv_bytes_, peer, tags::kSparseAllreducePayload);
    payload_out.wait();
    header_out.wait();
    result.bytes_sent += sizeof wire_header_out_ + send_bytes_.size();
    result.bytes_received += sizeof wire_header_in_ + recv_bytes_.size();
    deserialize_partial(comm, peer, numel);
  };

  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int extra = n - p;
  if (r >= p) {
    send_to(r - p);
    receive_from(r - p);
    std::swap(partials_[0], partials_[1]);
  } else {
    if (r < extra) {
      receive_from(r + p);
      merge_partial(numel);
    }
    for (int mask = 1; mask < p; mask <<= 1) {
      swap_with(r ^ mask);
      merge_partial(numel);
    }
    if (r < extra) send_to(r + p);
  }

  const PartialSum& sum = partials_[0];
  const auto divisor = static_cast<float>(n);
  if (sum.dense) {
    for (std::size_t i = 0; i < numel; ++i) out[i] = sum.values[i] / divisor;
    result.union_size = popcount_bytes(sum.present);
  } else {
    std::fill(out.begin(), out.end(), 0.0f);
    for (std::size_t j = 0; j < sum.indices.size(); ++j)
      out[sum.indices[j]] = sum.values[j] / divisor;
    result.union_size = sum.indices.size();
  }
}

// --- split ---

void SparseExchanger::split_allreduce(Communicator& comm, std::span<const Index> selected,
                                      std::span<float> out, ExchangeResult& result) {
  const std::size_t numel = out.size();
  const int n = comm.size();
  const int r = comm.rank();
  const auto nn = static_cast<std::size_t>(n);
  const auto rr = static_cast<std::size_t>(r);
  const std::size_t width = value_bytes(options_.values);
  const bool encoded = options_.encode_indices;

  // 1. One [indices][values] block per owner, from the slices of own I_r.
  send_bytes_.clear();
  send_counts_.resize(nn);
  meta_out_.resize(2 * nn);
  std::size_t pos = 0;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t range_end = chunk_begin(numel, n, static_cast<int>(q) + 1);
    std::size_t stop = pos;
    while (stop < selected.size() && selected[stop] < range_end) ++stop;
    const std::size_t start = send_bytes_.size();
    const std::size_t index_bytes =
        append_indices(selected.subspan(pos, stop - pos), encoded, send_bytes_);
    result.index_bytes_raw += sizeof(Index) * (stop - pos);
    result.index_bytes_encoded += index_bytes;
    send_bytes_.resize(start + index_bytes + (stop - pos) * width);
    encode_values(std::span<float>(values_.data() + pos, stop - pos), options_.values,
                  std::span<std::byte>(send_bytes_).subspan(start + index_bytes));
    send_counts_[q] = send_bytes_.size() - start;
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
  recv_bytes_.resize(std::accumulate(recv_counts_.begin(), recv_counts_.end(), std::size_t{0}));
  comm.alltoallv(send_bytes_, send_counts_, recv_bytes_, recv_counts_);
  result.bytes_sent +=
      std::accumulate(send_counts_.begin(), send_counts_.end(), std::size_t{0}) - send_counts_[rr];
  result.bytes_received += recv_bytes_.size() - recv_counts_[rr];

  // 3. The owner adds the n blocks of its range, in rank order.
  PartialSum& range = partials_[0];
  PartialSum& block = partials_[1];
  range.values.assign(len, 0.0f);
  range_hit_.assign(len, 0);
  std::size_t offset = 0;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t q_count = meta_in_[2 * q];
    const std::size_t q_index_bytes = meta_in_[2 * q + 1];
    const std::span<const std::byte> bytes(recv_bytes_.data() + offset, recv_counts_[q]);
    block.indices.resize(q_count);
    read_indices(comm, static_cast<int>(q), bytes.subspan(0, q_index_bytes), encoded,
                 block.indices);
    if (q_count > 0 && (block.indices.front() < lo || block.indices.back() >= hi)) {
      throw CommError(
          where(comm) +
          fmt::format("rank {} sent indices [{}, {}] outside this rank's range [{}, {})", q,
                      block.indices.front(), block.indices.back(), lo, hi));
    }
    block.values.resize(q_count);
    decode_values(bytes.subspan(q_index_bytes), options_.values, block.values);
    for (std::size_t j = 0; j < q_count; ++j) {
      const std::size_t k = block.indices[j] - lo;
      range.values[k] += block.values[j];
      range_hit_[k] = 1;
    }
    offset += recv_counts_[q];
  }

  // 4. The reduced range, sparse (indices + float32) or dense (float32),
  // whichever is smaller; then every range to every rank.
  PartialSum& reduced = partials_[2];
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
  send_bytes_.clear();
  std::size_t index_bytes = 0;
  if (dense) {
    send_bytes_.resize(len * sizeof(float));
    if (len > 0) std::memcpy(send_bytes_.data(), range.values.data(), len * sizeof(float));
  } else {
    index_bytes = append_indices(reduced.indices, encoded, send_bytes_);
    result.index_bytes_raw += sizeof(Index) * nnz;
    result.index_bytes_encoded += index_bytes;
    send_bytes_.resize(index_bytes + nnz * sizeof(float));
    if (nnz > 0) {
      std::memcpy(send_bytes_.data() + index_bytes, reduced.values.data(), nnz * sizeof(float));
    }
  }
  const std::array<std::uint64_t, 4> mine{dense ? kDenseFlag : 0, nnz, index_bytes,
                                          send_bytes_.size()};
  headers_.resize(4 * nn);
  comm.allgather(bytes_of(std::span<const std::uint64_t>(mine)),
                 writable_bytes_of(std::span<std::uint64_t>(headers_)));
  result.bytes_sent += (nn - 1) * sizeof mine;
  result.bytes_received += (nn - 1) * sizeof mine;
  byte_counts_.resize(nn);
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t q_len =
        chunk_begin(numel, n, static_cast<int>(q) + 1) - chunk_begin(numel, n, static_cast<int>(q));
    const std::uint64_t q_flags = headers_[4 * q];
    const std::uint64_t q_nnz = headers_[4 * q + 1];
    const std::uint64_t q_index_bytes = headers_[4 * q + 2];
    const std::uint64_t q_bytes = headers_[4 * q + 3];
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
    byte_counts_[q] = q_bytes;
  }
  recv_bytes_.resize(std::accumulate(byte_counts_.begin(), byte_counts_.end(), std::size_t{0}));
  comm.allgatherv(std::span<const std::byte>(send_bytes_), recv_bytes_, byte_counts_);
  result.bytes_sent += recv_bytes_.size() - byte_counts_[(rr + 1) % nn];
  result.bytes_received += recv_bytes_.size() - byte_counts_[rr];

  // 5. Unpack every range into out, divided by n.
  const auto divisor = static_cast<float>(n);
  offset = 0;
  std::size_t union_size = 0;
  for (std::size_t q = 0; q < nn; ++q) {
    const std::size_t q_lo = chunk_begin(numel, n, static_cast<int>(q));
    const std::size_t q_len = chunk_begin(numel, n, static_cast<int>(q) + 1) - q_lo;
    const std::size_t q_nnz = headers_[4 * q + 1];
    const std::size_t q_index_bytes = headers_[4 * q + 2];
    const std::span<const std::byte> bytes(recv_bytes_.data() + offset, byte_counts_[q]);
    union_size += q_nnz;
    if (headers_[4 * q] == kDenseFlag) {
      const std::span<float> dst = out.subspan(q_lo, q_len);
      decode_values(bytes, ValueEncoding::kFloat32, dst);
      for (float& v : dst) v /= divisor;
    } else {
      std::fill(out.begin() + static_cast<std::ptrdiff_t>(q_lo),
                out.begin() + static_cast<std::ptrdiff_t>(q_lo + q_len), 0.0f);
      block.indices.resize(q_nnz);
      read_indices(comm, static_cast<int>(q), bytes.subspan(0, q_index_bytes), encoded,
                   block.indices);
      if (q_nnz > 0 && (block.indices.front() < q_lo || block.indices.back() >= q_lo + q_len)) {
        throw CommError(where(comm) + fmt::format("rank {} sent indices outside its range [{}, {})",
                                                  q, q_lo, q_lo + q_len));
      }
      block.values.resize(q_nnz);
      decode_values(bytes.subspan(q_index_bytes), ValueEncoding::kFloat32, block.values);
      for (std::size_t j = 0; j < q_nnz; ++j) out[block.indices[j]] = block.values[j] / divisor;
    }
    offset += byte_counts_[q];
  }
  result.union_size = union_size;
}

}  // namespace sparsecomm
