#include "sparsecomm/perf/collective_cost.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include <fmt/format.h>

#include "sparsecomm/comm/broadcast_rule.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::perf {
namespace {

void check_world(int n) {
  if (n < 1) throw InvalidArgument(fmt::format("a world has at least 1 rank, got {}", n));
}

// A message of `bytes` on the wire: a short one pays one packet's headers
// and an acknowledgement (wire_bytes_per_message), a long one its per-byte
// share (a header per packet, an acknowledgement per few), which already
// holds its first packet's and an acknowledgement: the larger, not the sum.
double framed(const CostProfile& p, double bytes) {
  return bytes + std::max(p.wire_bytes_per_message, p.wire_overhead_per_byte * bytes);
}

// One round: send `sent`, receive `received` at the same time.
CommCost round_of(const CostProfile& p, double sent, double received) {
  return {.seconds = p.alpha_s + std::max(sent, received) * p.beta_s_per_byte,
          .rounds = 1,
          .bytes_sent = sent,
          .bytes_received = received,
          .wire_bytes_sent = framed(p, sent)};
}

CommCost reduction(const CostProfile& p, double elements) {
  return {.seconds = elements * p.gamma_s_per_element};
}

// Writing a sparse result into the dense d-element gradient: zero it, then
// add `entries` entries at their indices.
CommCost dense_decode(const CostProfile& p, double numel, double entries) {
  return {.seconds = numel * p.fill_s_per_element + entries * p.scatter_cost(numel)};
}

// Taking `count` values out of the d-element memory to send them.
CommCost pack_values(const CostProfile& p, double numel, double count) {
  return {.seconds = count * p.pack_cost(numel)};
}

// The value codec: encoding `encoded` values at the source, decoding
// `decoded` received ones (SparseSend's per-value costs).
CommCost value_codec(const SparseSend& s, double encoded, double decoded) {
  return {.seconds = encoded * s.encode_s + decoded * s.decode_s};
}

// Forming the union of n received index lists of `entries` in all:
// decoding them (when varint-encoded), then ceil(log2 n) levels of pairwise
// merges, or one copy when the lists lie in disjoint ranges.
CommCost unite_runs(const CostProfile& p, int n, const SparseSend& s, double entries) {
  const double decode = s.index_bytes < 4.0 ? entries * p.index_decode_s_per_element : 0.0;
  if (s.disjoint_ranges) return {.seconds = decode + entries * p.gamma_s_per_element};
  const double levels = n > 1 ? std::ceil(std::log2(static_cast<double>(n))) : 0.0;
  return {.seconds = decode + levels * entries * p.merge_s_per_element};
}

// Index bytes of a list of `count` entries over d positions: raw 4, or the
// varint size at the list's density when the sender encodes indices
// (s.index_bytes < 4 says it does).
double list_index_bytes(const SparseSend& s, double count) {
  if (s.index_bytes >= 4.0 || s.numel <= 0) return 4.0;
  return varint_index_bytes(std::min(1.0, count / s.numel));
}

CommCost header_allgather(const CostProfile& p, int n) {
  return ring_allgatherv(p, n, kExchangeHeaderBytes, kExchangeHeaderBytes);
}

// The value sum of union and shared (exchange_internal.cc): the values
// encoded once, then an allgather of the encoded values where it moves
// fewer bytes than the float32 ring (n E < 8 per value), every rank
// decoding the n lists and adding them; else the ring of decoded values.
CommCost value_sum(const CostProfile& p, int n, const SparseSend& s, double count) {
  if (s.value_bytes < kFloatBytes && n * s.value_bytes < 8) {
    const double block = s.value_bytes * count;
    return value_codec(s, count, n * count) + ring_allgatherv(p, n, block, block) +
           reduction(p, (n - 1) * count);
  }
  return value_codec(s, count, 0) + ring_allreduce(p, n, kFloatBytes * count);
}

}  // namespace

CommCost& CommCost::operator+=(const CommCost& other) {
  seconds += other.seconds;
  rounds += other.rounds;
  bytes_sent += other.bytes_sent;
  bytes_received += other.bytes_received;
  wire_bytes_sent += other.wire_bytes_sent;
  return *this;
}

CommCost operator+(CommCost a, const CommCost& b) { return a += b; }

CommCost operator*(CommCost cost, double count) {
  cost.seconds *= count;
  cost.rounds *= count;
  cost.bytes_sent *= count;
  cost.bytes_received *= count;
  cost.wire_bytes_sent *= count;
  return cost;
}

int largest_power_of_two(int n) {
  check_world(n);
  return static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
}

double varint_index_bytes(double density) {
  if (!(density > 0 && density <= 1)) {
    throw InvalidArgument(
        fmt::format("an index list's density must be in (0, 1], got {}", density));
  }
  // P(gap - 1 >= t) = (1 - c)^t for geometric gaps of mean 1/c.
  double bytes = 1.0;
  for (const double boundary : {0x1p7, 0x1p14, 0x1p21, 0x1p28}) {
    bytes += std::exp(boundary * std::log1p(-std::min(density, 1.0 - 1e-12)));
  }
  return bytes;
}

CommCost ring_allreduce(const CostProfile& p, int n, double bytes) {
  check_world(n);
  if (n == 1) return {};
  const double chunk = bytes / n;
  return round_of(p, chunk, chunk) * (2.0 * (n - 1)) + reduction(p, (n - 1) * chunk / kFloatBytes);
}

CommCost recursive_doubling_allreduce(const CostProfile& p, int n, double bytes) {
  check_world(n);
  const int pow2 = largest_power_of_two(n);
  const double levels = std::log2(pow2);
  CommCost cost = round_of(p, bytes, bytes) * levels + reduction(p, levels * bytes / kFloatBytes);
  if (n > pow2) cost += round_of(p, bytes, bytes) * 2.0 + reduction(p, bytes / kFloatBytes);
  return cost;
}

CommCost skip_reduce(const CostProfile& p, int n, int skip, double bytes) {
  check_world(n);
  if (skip < 0 || skip > n - 1) {
    throw InvalidArgument(fmt::format("skip must be in [0, n-1] = [0, {}], got {}", n - 1, skip));
  }
  if (n == 1) return {};
  const double chunk = bytes / n;
  const double scatter_steps = n - 1 - skip;
  return round_of(p, chunk, chunk) * (scatter_steps + (n - 1)) +
         reduction(p, scatter_steps * chunk / kFloatBytes);
}

CommCost ring_allgatherv(const CostProfile& p, int n, double mean_block, double max_block) {
  check_world(n);
  if (n == 1) return {};
  CommCost cost = round_of(p, mean_block, mean_block) * (n - 1.0);
  cost.seconds = (n - 1) * (p.alpha_s + std::max(mean_block, max_block) * p.beta_s_per_byte);
  return cost;
}

CommCost alltoallv(const CostProfile& p, int n, double bytes_per_peer) {
  check_world(n);
  return round_of(p, bytes_per_peer, bytes_per_peer) * (n - 1.0);
}

CommCost binomial_broadcast(const CostProfile& p, int n, double bytes) {
  check_world(n);
  const double levels = std::ceil(std::log2(static_cast<double>(n)));
  CommCost cost = round_of(p, bytes, bytes) * levels;
  // Every rank but the root receives the buffer once, and someone sent it:
  // (n-1)/n messages per rank.
  cost.bytes_sent = cost.bytes_received = (n - 1.0) / n * bytes;
  cost.wire_bytes_sent = (n - 1.0) / n * framed(p, bytes);
  return cost;
}

CommCost scatter_allgather_broadcast(const CostProfile& p, int n, double bytes) {
  check_world(n);
  if (n == 1) return {};
  const double block = bytes / n;
  // The root sends n-1 blocks one after another on its link; the other
  // ranks receive one each: per rank, (n-1)/n blocks each way on average.
  CommCost scatter = round_of(p, block, block) * (n - 1.0);
  scatter.bytes_sent = scatter.bytes_received = (n - 1.0) / n * block;
  scatter.wire_bytes_sent = (n - 1.0) / n * framed(p, block);
  return scatter + ring_allgatherv(p, n, block, std::ceil(block));
}

CommCost broadcast(const CostProfile& p, int n, double bytes) {
  check_world(n);
  if (broadcast_scatters(n, static_cast<std::size_t>(bytes))) {
    return scatter_allgather_broadcast(p, n, bytes);
  }
  return binomial_broadcast(p, n, bytes);
}

CommCost nonfinite_agreement(const CostProfile& p, int n) { return ring_allgatherv(p, n, 1, 1); }

CommCost union_allreduce(const CostProfile& p, int n, const SparseSend& s) {
  return header_allgather(p, n) +
         ring_allgatherv(p, n, s.index_bytes * s.mean_count, s.index_bytes * s.max_count) +
         unite_runs(p, n, s, n * s.mean_count) + pack_values(p, s.numel, s.union_count) +
         value_sum(p, n, s, s.union_count) + dense_decode(p, s.numel, s.union_count);
}

CommCost shared_allreduce(const CostProfile& p, int n, const SparseSend& s) {
  return pack_values(p, s.numel, s.mean_count) + value_sum(p, n, s, s.mean_count) +
         dense_decode(p, s.numel, s.mean_count);
}

CommCost sparse_allgather(const CostProfile& p, int n, const SparseSend& s) {
  const double entry = s.index_bytes + s.value_bytes;
  // Every rank adds all n blocks (its own too) and then divides the K
  // entries of the union by n.
  return pack_values(p, s.numel, s.mean_count) + value_codec(s, s.mean_count, n * s.mean_count) +
         header_allgather(p, n) + ring_allgatherv(p, n, entry * s.mean_count, entry * s.max_count) +
         unite_runs(p, n, s, n * s.mean_count) +
         dense_decode(p, s.numel, n * s.mean_count + s.union_count);
}

CommCost sparcml_recursive_doubling(const CostProfile& p, int n, const SparseSend& s,
                                    std::span<const double> union_of_ranks) {
  check_world(n);
  const int pow2 = largest_power_of_two(n);
  const int levels = std::bit_width(static_cast<unsigned>(pow2)) - 1;
  if (union_of_ranks.size() < static_cast<std::size_t>(levels) + 1) {
    throw InvalidArgument(
        fmt::format("the recursive-doubling cost needs the union of 1..{} ranks", pow2));
  }
  constexpr double kMessageHeader = 32.0;
  const double dense = std::ceil(s.numel / 8) + kFloatBytes * s.numel;
  // A partial sum of `entries`, own values in their encoding at the first
  // level and float32 once merged.
  auto message = [&](double entries, bool own) {
    const double sparse =
        entries * (list_index_bytes(s, entries) + (own ? s.value_bytes : kFloatBytes));
    return kMessageHeader + std::min(sparse, dense);
  };
  CommCost cost = header_allgather(p, n);
  if (n > pow2) {
    cost += round_of(p, message(s.mean_count, true), message(s.mean_count, true));
  }
  for (int level = 0; level < levels; ++level) {
    const double entries = union_of_ranks[level];
    const double bytes = message(entries, level == 0);
    cost += round_of(p, bytes, bytes) + reduction(p, entries);
  }
  if (n > pow2) {
    const double final_bytes = message(union_of_ranks[levels], false);
    cost += round_of(p, final_bytes, final_bytes);
  }
  return cost;
}

CommCost sparcml_split(const CostProfile& p, int n, const SparseSend& s) {
  check_world(n);
  if (n == 1) return {};
  constexpr double kCountPair = 8.0;
  constexpr double kRangeHeader = 32.0;
  const double own_entry = s.index_bytes + s.value_bytes;
  const double range_entries = s.union_count / n;
  const double range_bytes =
      std::min(range_entries * (list_index_bytes(s, range_entries) + kFloatBytes),
               kFloatBytes * s.numel / n);
  return header_allgather(p, n) + alltoallv(p, n, kCountPair) +
         alltoallv(p, n, own_entry * s.mean_count / n) + reduction(p, s.mean_count) +
         ring_allgatherv(p, n, kRangeHeader, kRangeHeader) +
         ring_allgatherv(p, n, range_bytes, range_bytes);
}

CommCost ok_topk_allreduce(const CostProfile& p, int n, const SparseSend& s) {
  check_world(n);
  if (n == 1) return {};
  constexpr double kPair = 8.0;
  constexpr double kCount = 8.0;
  const double per_owner = s.mean_count / n;
  return header_allgather(p, n) + ring_allreduce(p, n, kCount * 8.0 * n) + alltoallv(p, n, kCount) +
         pack_values(p, s.numel, s.mean_count) + alltoallv(p, n, kPair * per_owner) +
         reduction(p, s.mean_count) + ring_allgatherv(p, n, kCount, kCount) * 2.0 +
         ring_allgatherv(p, n, kPair * per_owner, kPair * per_owner) +
         dense_decode(p, s.numel, s.mean_count);
}

CommCost ps_bsp_step(const CostProfile& p, int workers, int servers, double numel,
                     double push_bytes) {
  if (workers < 1 || servers < 1) {
    throw InvalidArgument(
        fmt::format("a parameter server needs at least 1 worker and 1 server, got {} and {}",
                    workers, servers));
  }
  constexpr double kRequest = 40.0;
  constexpr double kGrant = 32.0;
  constexpr double kPullHeader = 8.0;
  const double model_bytes = kFloatBytes * numel;
  const double share = static_cast<double>(workers) / servers;  // shards a server's link carries
  CommCost cost = round_of(p, kRequest, 0) + round_of(p, 0, kGrant);  // BEGIN, GRANT
  cost += round_of(p, kRequest * servers, 0);                         // PULL requests
  CommCost pull = round_of(p, 0, model_bytes + kPullHeader * servers);
  pull.seconds = p.alpha_s + std::max(model_bytes, share * model_bytes) * p.beta_s_per_byte;
  CommCost push = round_of(p, push_bytes + kRequest * servers, 0);
  push.seconds = p.alpha_s + std::max(push_bytes, share * push_bytes) * p.beta_s_per_byte;
  const double shard = numel / servers;
  cost += pull + push;
  cost.seconds += workers * shard * p.gamma_s_per_element + shard * p.update_s_per_element;
  return cost;
}

}  // namespace sparsecomm::perf
