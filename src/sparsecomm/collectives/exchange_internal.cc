#include "sparsecomm/collectives/exchange_internal.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <string_view>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/hash.h"

// Byte counts are this rank's payloads as the default ring algorithms of
// Communicator move them (allgatherv: sends sum(counts) - counts[r+1],
// receives sum(counts) - counts[r]); MPI may use other internal algorithms.
//
// The value sum of union/shared: float32 ring all-reduce (options.dense),
// 2(n-1)/n * 4K bytes per rank. Where an allgather of the encoded values
// moves fewer bytes ((n-1) * E(K), E the encoded size: n * E(K) < 8K, so
// fp16/bf16 for n <= 3, int8 up to 7 ranks, int4 up to 14, int2 up to 28)
// that is used instead, and every rank adds the decoded values in rank
// order. (At n = 4 with 16-bit values both move 6K; the ring measured
// faster.) A ring that re-encodes partial sums would break "out is the
// mean of what was sent", so larger worlds sum the decoded values in
// float32.

namespace sparsecomm::detail {
namespace {

constexpr std::string_view kTag = "[exchange] ";

// wire.values holds this rank's K decoded values and wire.send their
// encoding; on return wire.values holds the sum over ranks (added in rank
// order).
void sum_encoded_values(Communicator& comm, ValueEncoding encoding, WireBuffers& wire,
                        ExchangeResult& result) {
  const auto n = static_cast<std::size_t>(comm.size());
  const std::size_t count = wire.values.size();
  const std::size_t bytes = encoded_value_bytes(encoding, count);
  wire.byte_counts.assign(n, bytes);
  wire.recv.resize(n * bytes);
  comm.allgather(std::span<const std::byte>(wire.send), std::span<std::byte>(wire.recv));
  count_allgatherv(comm, wire.byte_counts, result);
  wire.other_values.resize(count);
  for (std::size_t q = 0; q < n; ++q) {
    const std::span<const std::byte> block(wire.recv.data() + q * bytes, bytes);
    decode_values(block, encoding,
                  q == 0 ? std::span<float>(wire.values) : std::span<float>(wire.other_values));
    if (q == 0) continue;
    float* __restrict sum = wire.values.data();
    const float* __restrict add = wire.other_values.data();
    for (std::size_t j = 0; j < count; ++j) sum[j] += add[j];
  }
}

}  // namespace

std::string where(const Communicator& comm) {
  return fmt::format("[exchange] rank {}: ", comm.rank());
}

void rethrow_from(const Communicator& comm, int peer, const CommError& error) {
  std::string_view what = error.what();
  if (what.starts_with(kTag)) what.remove_prefix(kTag.size());
  throw CommError(where(comm) + fmt::format("from rank {}: {}", peer, what));
}

void decode_block_from(const Communicator& comm, int peer, std::span<const std::byte> block,
                       const BlockFormat& format, std::span<Index> indices,
                       std::span<float> values) {
  try {
    decode_block(block, format, indices, values);
  } catch (const CommError& error) {
    rethrow_from(comm, peer, error);
  }
}

std::uint64_t rounding_nonce(const Communicator& comm, ValueEncoding encoding,
                             std::span<const float> values) {
  if (!is_stochastic(encoding)) return 0;
  return hash_bytes(std::as_bytes(values), static_cast<std::uint64_t>(comm.rank()) + 1);
}

std::uint64_t index_list_hash(std::span<const Index> indices) {
  return hash_bytes(std::as_bytes(indices));
}

RingBytes ring_allgatherv_bytes(const Communicator& comm, std::span<const std::size_t> counts) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  return {.sent = total - counts[(r + 1) % n], .received = total - counts[r]};
}

void count_allgatherv(const Communicator& comm, std::span<const std::size_t> counts,
                      ExchangeResult& result) {
  const RingBytes bytes = ring_allgatherv_bytes(comm, counts);
  result.bytes_sent += bytes.sent;
  result.bytes_received += bytes.received;
}

void gather_headers(Communicator& comm, std::uint64_t count, std::uint64_t payload_bytes,
                    std::size_t numel, WireBuffers& wire, ExchangeResult& result) {
  const auto n = static_cast<std::size_t>(comm.size());
  const std::array<std::uint64_t, 3> mine{count, payload_bytes, numel};
  std::vector<std::uint64_t>& headers = wire.headers;
  headers.resize(3 * n);
  comm.allgather(bytes_of(std::span<const std::uint64_t>(mine)),
                 writable_bytes_of(std::span<std::uint64_t>(headers)));
  result.bytes_sent += (n - 1) * sizeof mine;
  result.bytes_received += (n - 1) * sizeof mine;
  result.counts.resize(n);
  wire.byte_counts.resize(n);
  for (std::size_t q = 0; q < n; ++q) {
    if (headers[3 * q + 2] != headers[2]) {
      throw InvalidArgument(
          where(comm) +
          fmt::format("ranks disagree on the vector length: rank 0 has d = {}, rank {} has d = {}",
                      headers[2], q, headers[3 * q + 2]));
    }
  }
  for (std::size_t q = 0; q < n; ++q) {
    if (headers[3 * q] > numel) {
      throw CommError(where(comm) + fmt::format("rank {} announced {} indices for d = {}", q,
                                                headers[3 * q], numel));
    }
    result.counts[q] = static_cast<std::size_t>(headers[3 * q]);
    wire.byte_counts[q] = static_cast<std::size_t>(headers[3 * q + 1]);
  }
}

void IndexRuns::decode_blocks(const Communicator& comm, std::span<const std::byte> blocks,
                              std::span<const std::size_t> block_bytes,
                              std::span<const std::size_t> counts, const BlockFormat& format,
                              std::size_t values_per_index, std::size_t extra_values) {
  const std::size_t n = counts.size();
  runs_.resize(n + 1);
  runs_[0] = 0;
  for (std::size_t q = 0; q < n; ++q) runs_[q + 1] = runs_[q] + counts[q];
  all_.resize(runs_[n]);
  std::size_t offset = 0;
  for (std::size_t q = 0; q < n; ++q) {
    const std::size_t block = block_bytes[q];
    try {
      decode_block_indices(blocks.subspan(offset, block),
                           counts[q] * values_per_index + extra_values, format,
                           std::span<Index>(all_.data() + runs_[q], counts[q]));
    } catch (const CommError& error) {
      rethrow_from(comm, static_cast<int>(q), error);
    }
    offset += block;
  }
}

void IndexRuns::append(std::span<const Index> run) {
  const std::size_t at = all_.size();
  all_.resize(at + run.size());
  std::copy(run.begin(), run.end(), all_.begin() + static_cast<std::ptrdiff_t>(at));
  runs_.push_back(all_.size());
}

bool IndexRuns::concatenate_disjoint_runs() {
  by_first_.clear();
  for (std::size_t q = 0; q + 1 < runs_.size(); ++q) {
    if (runs_[q + 1] > runs_[q]) by_first_.push_back(q);
  }
  std::sort(by_first_.begin(), by_first_.end(),
            [&](std::size_t a, std::size_t b) { return all_[runs_[a]] < all_[runs_[b]]; });
  for (std::size_t j = 1; j < by_first_.size(); ++j) {
    // Sorted runs: disjoint iff each begins after the previous one's last.
    if (all_[runs_[by_first_[j]]] <= all_[runs_[by_first_[j - 1] + 1] - 1]) return false;
  }
  union_.resize(all_.size());
  Index* write = union_.data();
  for (const std::size_t q : by_first_)
    write = std::copy(all_.data() + runs_[q], all_.data() + runs_[q + 1], write);
  return true;
}

void IndexRuns::build_union() {
  std::size_t runs = runs_.size() - 1;
  if (runs == 0) {
    union_.clear();
    return;
  }
  if (concatenate_disjoint_runs()) return;
  int levels = 0;
  for (std::size_t r = runs; r > 1; r = (r + 1) / 2) ++levels;
  // Ping-pong between union_ and merge_scratch_ so the last level lands in union_.
  UninitVector<Index>* dst = levels % 2 == 1 ? &union_ : &merge_scratch_;
  UninitVector<Index>* other = levels % 2 == 1 ? &merge_scratch_ : &union_;
  const Index* src = all_.data();
  if (levels == 0) {
    union_.assign(all_.begin(), all_.begin() + static_cast<std::ptrdiff_t>(runs_[1]));
    return;
  }
  merge_bounds_.assign(runs_.begin(), runs_.end());
  std::vector<std::size_t>* bounds = &merge_bounds_;
  std::vector<std::size_t>* next_bounds = &next_runs_;
  while (runs > 1) {
    dst->resize((*bounds)[runs]);
    next_bounds->resize((runs + 1) / 2 + 1);
    (*next_bounds)[0] = 0;
    Index* write = dst->data();
    for (std::size_t k = 0; k < runs; k += 2) {
      const Index* a = src + (*bounds)[k];
      const Index* a_end = src + (*bounds)[k + 1];
      if (k + 1 < runs) {
        const Index* b_end = src + (*bounds)[k + 2];
        write = std::set_union(a, a_end, a_end, b_end, write);
      } else {
        write = std::copy(a, a_end, write);
      }
      (*next_bounds)[k / 2 + 1] = static_cast<std::size_t>(write - dst->data());
    }
    runs = (runs + 1) / 2;
    dst->resize((*next_bounds)[runs]);
    src = dst->data();
    std::swap(dst, other);
    std::swap(bounds, next_bounds);
  }
}

void reduce_values_at(Communicator& comm, std::span<const Index> u, const ExchangeOptions& options,
                      std::span<float> accumulated, std::span<float> out, WireBuffers& wire,
                      ExchangeResult& result) {
  const int n = comm.size();
  const std::size_t count = u.size();
  wire.values.resize(count);
  for (std::size_t j = 0; j < count; ++j) wire.values[j] = accumulated[u[j]];
  wire.send.resize(encoded_value_bytes(options.values, count));
  encode_values(wire.values, options.values, wire.send,
                rounding_nonce(comm, options.values, wire.values));
  for (std::size_t j = 0; j < count; ++j) accumulated[u[j]] -= wire.values[j];

  const bool allgather_is_smaller = options.values != ValueEncoding::kFloat32 &&
                                    static_cast<std::size_t>(n) * wire.send.size() < 8 * count;
  if (allgather_is_smaller) {
    sum_encoded_values(comm, options.values, wire, result);
  } else {
    AllreduceReport report;
    allreduce(comm, std::span<float>(wire.values), options.dense, &report);
    result.bytes_sent += report.bytes_sent;
    result.bytes_received += report.bytes_received;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  const auto divisor = static_cast<float>(n);
  for (std::size_t j = 0; j < count; ++j) out[u[j]] = wire.values[j] / divisor;
  result.union_size = count;
  result.transmitted = u;
}

}  // namespace sparsecomm::detail
