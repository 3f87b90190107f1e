// SparCML-style sparse all-reduce: the kSparseAllreduce pattern (see
// sparse_exchange.h for the shared contract).
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
#include <memory>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/exchange_internal.h"
#include "sparsecomm/collectives/sparse_allreduce_internal.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::detail {
namespace {

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

}  // namespace

std::size_t append_indices(std::span<const Index> indices, bool encode,
                           UninitVector<std::byte>& out) {
  if (encode) return encode_indices(indices, out);
  const std::size_t start = out.size();
  out.resize(start + indices.size_bytes());
  if (!indices.empty()) std::memcpy(out.data() + start, indices.data(), indices.size_bytes());
  return indices.size_bytes();
}

void SparseAllreduce::run(Communicator& comm, const Input& input, std::span<float> accumulated,
                          std::span<float> out, ExchangeResult& result) {
  if (input.known_indices.empty()) {
    exchange_list(comm, input.selected, accumulated, out, result);
    return;
  }
  // Its partial sums are index lists: the known positions join this rank's
  // list (and travel as indices), then leave the counts again.
  const std::span<const Index> selected = input.selected;
  const std::span<const Index> known = input.known_indices;
  with_known_.resize(selected.size() + known.size());
  std::merge(selected.begin(), selected.end(), known.begin(), known.end(), with_known_.begin());
  exchange_list(comm, with_known_, accumulated, out, result);
  for (std::size_t& count : result.counts) count -= known.size();
}

void SparseAllreduce::exchange_list(Communicator& comm, std::span<const Index> selected,
                                    std::span<float> accumulated, std::span<float> out,
                                    ExchangeResult& result) {
  const std::size_t numel = accumulated.size();
  const std::size_t count = selected.size();
  gather_headers(comm, count, 0, numel, wire_, result);
  const std::size_t total =
      std::accumulate(result.counts.begin(), result.counts.end(), std::size_t{0});
  SparseAllreduceAlgorithm algorithm = options().sparse_algorithm;
  if (algorithm == SparseAllreduceAlgorithm::kAuto) {
    algorithm =
        static_cast<double>(total) * options().sparse_switch_factor < static_cast<double>(numel)
            ? SparseAllreduceAlgorithm::kRecursiveDoubling
            : SparseAllreduceAlgorithm::kSplit;
  }
  wire_.values.resize(count);
  for (std::size_t j = 0; j < count; ++j) wire_.values[j] = accumulated[selected[j]];
  wire_.send.resize(count * fixed_value_bytes(options().values));
  encode_values(wire_.values, options().values, wire_.send);
  for (std::size_t j = 0; j < count; ++j) accumulated[selected[j]] -= wire_.values[j];
  transmitted_.assign(selected.begin(), selected.end());
  if (algorithm == SparseAllreduceAlgorithm::kRecursiveDoubling) {
    recursive_doubling(comm, selected, out, result);
  } else {
    split_allreduce(comm, selected, out, result);
  }
  result.transmitted = transmitted_;
}

// --- recursive doubling ---

void SparseAllreduce::densify_if_smaller(PartialSum& partial, std::size_t numel) {
  if (partial.dense) return;
  const std::size_t width = fixed_value_bytes(partial.encoding);
  const std::size_t nnz = partial.indices.size();
  const std::size_t index_bytes =
      options().encode_indices ? encoded_index_bytes(partial.indices) : sizeof(Index) * nnz;
  if (index_bytes + nnz * width <= bitmap_bytes(numel) + numel * width) return;
  PartialSum& dense = spare_;
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

// wire_.send and wire_header_out_ = the wire form of `partial`.
void SparseAllreduce::serialize_partial(PartialSum& partial, std::size_t numel,
                                        ExchangeResult& result) {
  const std::size_t width = fixed_value_bytes(partial.encoding);
  wire_.send.clear();
  std::uint64_t nnz = 0;
  std::uint64_t index_bytes = 0;
  if (partial.dense) {
    const std::size_t bits = bitmap_bytes(numel);
    wire_.send.resize(bits + numel * width);
    if (bits > 0) std::memcpy(wire_.send.data(), partial.present.data(), bits);
    encode_values(std::span<float>(partial.values.data(), numel), partial.encoding,
                  std::span<std::byte>(wire_.send).subspan(bits));
    nnz = popcount_bytes(partial.present);
  } else {
    nnz = partial.indices.size();
    index_bytes = append_indices(partial.indices, options().encode_indices, wire_.send);
    result.index_bytes_raw += sizeof(Index) * nnz;
    result.index_bytes_encoded += index_bytes;
    wire_.send.resize(index_bytes + nnz * width);
    encode_values(partial.values, partial.encoding,
                  std::span<std::byte>(wire_.send).subspan(index_bytes));
  }
  const std::uint64_t flags =
      (partial.dense ? kDenseFlag : 0) | static_cast<std::uint64_t>(partial.encoding) << 8;
  wire_header_out_ = {flags, nnz, index_bytes, wire_.send.size()};
}

// incoming_ = the partial sum in wire_header_in_ + wire_.recv, checked.
void SparseAllreduce::deserialize_partial(Communicator& comm, int peer, std::size_t numel) {
  const auto& header = wire_header_in_;
  const std::uint64_t flags = header[0];
  const std::uint64_t encoding = flags >> 8;
  if ((flags & ~(kDenseFlag | 0xFF00ull)) != 0 ||
      encoding > static_cast<std::uint64_t>(ValueEncoding::kBFloat16)) {
    throw CommError(where(comm) +
                    fmt::format("rank {} sent a malformed header (flags {:#x})", peer, flags));
  }
  PartialSum& in = incoming_;
  in.dense = (flags & kDenseFlag) != 0;
  in.encoding = static_cast<ValueEncoding>(encoding);
  const std::size_t width = fixed_value_bytes(in.encoding);
  const std::span<const std::byte> bytes(wire_.recv);
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
  in.values.resize(nnz);
  decode_block_from(comm, peer, bytes, BlockFormat{in.encoding, options().encode_indices, 0, numel},
                    in.indices, in.values);
}

// current_ += incoming_; symmetric in the two operands, so two
// partners that merge each other's sums get the same bits.
void SparseAllreduce::merge_partial(std::size_t numel) {
  PartialSum& mine = current_;
  PartialSum& theirs = incoming_;
  if (!mine.dense && !theirs.dense) {
    PartialSum& merged = spare_;
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

void SparseAllreduce::recursive_doubling(Communicator& comm, std::span<const Index> selected,
                                         std::span<float> out, ExchangeResult& result) {
  const std::size_t numel = out.size();
  const int n = comm.size();
  const int r = comm.rank();
  PartialSum& own = current_;
  own.dense = false;
  own.encoding = options().values;
  own.indices.assign(selected.begin(), selected.end());
  own.values.assign(wire_.values.begin(), wire_.values.end());
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
    wire_.recv.resize(wire_header_in_[3]);
  };
  const auto send_to = [&](int peer) {
    serialize_partial(current_, numel, result);
    Request header = comm.isend(header_bytes(wire_header_out_), peer, tags::kSparseAllreduceHeader);
    comm.send(wire_.send, peer, tags::kSparseAllreducePayload);
    header.wait();
    result.bytes_sent += sizeof wire_header_out_ + wire_.send.size();
  };
  const auto receive_from = [&](int peer) {
    comm.recv(header_bytes(wire_header_in_), peer, tags::kSparseAllreduceHeader);
    check_incoming(peer);
    comm.recv(wire_.recv, peer, tags::kSparseAllreducePayload);
    result.bytes_received += sizeof wire_header_in_ + wire_.recv.size();
    deserialize_partial(comm, peer, numel);
  };
  const auto swap_with = [&](int peer) {
    serialize_partial(current_, numel, result);
    Request header_out =
        comm.isend(header_bytes(wire_header_out_), peer, tags::kSparseAllreduceHeader);
    comm.recv(header_bytes(wire_header_in_), peer, tags::kSparseAllreduceHeader);
    check_incoming(peer);
    Request payload_out = comm.isend(wire_.send, peer, tags::kSparseAllreducePayload);
    comm.recv(wire_.recv, peer, tags::kSparseAllreducePayload);
    payload_out.wait();
    header_out.wait();
    result.bytes_sent += sizeof wire_header_out_ + wire_.send.size();
    result.bytes_received += sizeof wire_header_in_ + wire_.recv.size();
    deserialize_partial(comm, peer, numel);
  };

  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int extra = n - p;
  if (r >= p) {
    send_to(r - p);
    receive_from(r - p);
    std::swap(current_, incoming_);
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

  const PartialSum& sum = current_;
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

std::unique_ptr<SparseExchange> make_sparse_allreduce(const ExchangeOptions& options) {
  return std::make_unique<SparseAllreduce>(options);
}

}  // namespace sparsecomm::detail
