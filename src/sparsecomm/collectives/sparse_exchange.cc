#include "sparsecomm/collectives/sparse_exchange.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"

// The exchange patterns
// =====================
//
// Every pattern first reads this rank's values a_r[I] (or a_r[U]) into
// values_, encodes them (fp16/bf16 round here, at the source, and values_
// becomes the decoded value), and subtracts the decoded value from
// `accumulated`. Because a - decoded is exact in float (codec.h), the new
// residual plus what was sent is the old a_r exactly. Sums then only ever
// add decoded values in float32, so `out` is the mean of exactly what was
// transmitted, identical on every rank.
//
// Union all-reduce: allgather (count, index bytes, d) -> allgatherv the
//   (varint-encoded) index lists -> every rank merges them into the same
//   sorted union U (pairwise merges, log2 n levels) -> all-reduce a_r[U].
// Shared indices: as union, without the index exchange (U = own I_r; in
//   debug builds one allgather of (count, hash) checks that all agree).
// Known ranges (selection.known, identical on all ranks): union and shared
//   add their positions to U as one more sorted run that nobody sends;
//   sparse allgather appends every rank's values there to its block (no
//   indices); sparse all-reduce merges them into each rank's list.
// The value sum of union/shared: float32 ring all-reduce (options.dense),
//   2(n-1)/n * 4K bytes per rank. With fp16/bf16 values and n * 2 < 8
//   (n <= 3) an allgatherv of the 2-byte values moves fewer bytes
//   ((n-1) * 2K), so that is used instead, and every rank adds the decoded
//   values in rank order. (At n = 4 both move 6K; the ring measured faster.)
//   (A ring that re-rounds partial sums to 16 bits would break "out is the
//   mean of what was sent", so larger worlds sum in float32.)
// Sparse allgather: allgather (count, payload bytes, d) -> allgatherv
//   [indices][values] blocks -> every rank adds all blocks in rank order.
// Sparse all-reduce: sparse_allreduce.cc.
//
// Byte counts are this rank's payloads as the default ring algorithms of
// Communicator move them (allgatherv: sends sum(counts) - counts[r+1],
// receives sum(counts) - counts[r]); MPI may use other internal algorithms.

namespace sparsecomm {
namespace {

std::string where(const Communicator& comm) {
  return fmt::format("[exchange] rank {}: ", comm.rank());
}

void count_allgatherv(const Communicator& comm, std::span<const std::size_t> counts,
                      ExchangeResult& result) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  result.bytes_sent += total - counts[(r + 1) % n];
  result.bytes_received += total - counts[r];
}

[[maybe_unused]] std::uint64_t hash_indices(std::span<const Index> indices) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the 32-bit values
  for (const Index i : indices) {
    h ^= i;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

ExchangePattern parse_exchange_pattern(std::string_view name) {
  if (name == "union") return ExchangePattern::kUnionAllreduce;
  if (name == "allgather") return ExchangePattern::kSparseAllgather;
  if (name == "sparse-allreduce") return ExchangePattern::kSparseAllreduce;
  if (name == "shared") return ExchangePattern::kSharedIndices;
  throw InvalidArgument(
      fmt::format("[exchange] unknown exchange pattern '{}' (valid: union, allgather, "
                  "sparse-allreduce, shared)",
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

SparseExchanger::SparseExchanger(ExchangePattern pattern, ExchangeOptions options)
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
}

void SparseExchanger::exchange(Communicator& comm, const SparseSelection& selection,
                               std::span<float> accumulated, std::span<float> out,
                               ExchangeResult& result) {
  Stopwatch clock;
  const std::size_t numel = accumulated.size();
  if (out.size() != numel) {
    throw InvalidArgument(
        where(comm) + fmt::format("out has {} elements but accumulated has {}", out.size(), numel));
  }
  if (numel > std::size_t{std::numeric_limits<Index>::max()} + 1) {
    throw InvalidArgument(where(comm) +
                          fmt::format("{} elements cannot be addressed by 32-bit indices", numel));
  }
  const std::span<const Index> selected(selection.indices);
  for (std::size_t i = 0; i < selected.size(); ++i) {
    if (selected[i] >= numel || (i > 0 && selected[i] <= selected[i - 1])) {
      throw InvalidArgument(
          where(comm) +
          fmt::format(
              "the selection must be strictly ascending indices below d = {}, but index {} is {}{}",
              numel, i, selected[i], i > 0 ? fmt::format(" after {}", selected[i - 1]) : ""));
    }
  }
  const std::span<const Range> known(selection.known);
  std::size_t known_end = 0;
  for (const Range& range : known) {
    if (range.begin > range.end || range.end > numel || range.begin < known_end) {
      throw InvalidArgument(
          where(comm) +
          fmt::format("the known ranges must be ascending, non-overlapping and inside [0, {}), "
                      "but [{}, {}) follows a range ending at {}",
                      numel, range.begin, range.end, known_end));
    }
    known_end = range.end;
  }
  for (std::size_t i = 0, r = 0; i < selected.size() && r < known.size();) {
    if (known[r].end <= selected[i]) {
      ++r;
    } else if (selected[i] >= known[r].begin) {
      throw InvalidArgument(where(comm) + fmt::format("selected index {} lies in the known range "
                                                      "[{}, {}): they must be disjoint",
                                                      selected[i], known[r].begin, known[r].end));
    } else {
      ++i;
    }
  }
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
  switch (pattern_) {
    case ExchangePattern::kUnionAllreduce:
      exchange_union(comm, selected, known, false, accumulated, out, result);
      break;
    case ExchangePattern::kSharedIndices:
      exchange_union(comm, selected, known, true, accumulated, out, result);
      break;
    case ExchangePattern::kSparseAllgather:
      exchange_allgather(comm, selected, known, accumulated, out, result);
      break;
    case ExchangePattern::kSparseAllreduce:
      if (known_indices_.empty()) {
        exchange_sparse_allreduce(comm, selected, accumulated, out, result);
      } else {
        // Its partial sums are index lists: the known positions join this
        // rank's list (and travel as indices), then leave the counts again.
        with_known_.resize(selected.size() + known_indices_.size());
        std::merge(selected.begin(), selected.end(), known_indices_.begin(), known_indices_.end(),
                   with_known_.begin());
        exchange_sparse_allreduce(comm, with_known_, accumulated, out, result);
        for (std::size_t& count : result.counts) count -= known_indices_.size();
      }
      break;
  }
  result.seconds = clock.seconds();
}

// Allgathers (count, payload bytes, d) of every rank into result.counts and
// byte_counts_; every rank throws the same error when the d's differ.
void SparseExchanger::gather_headers(Communicator& comm, std::uint64_t count,
                                     std::uint64_t payload_bytes, std::size_t numel,
                                     ExchangeResult& result) {
  const auto n = static_cast<std::size_t>(comm.size());
  const std::array<std::uint64_t, 3> mine{count, payload_bytes, numel};
  headers_.resize(3 * n);
  comm.allgather(bytes_of(std::span<const std::uint64_t>(mine)),
                 writable_bytes_of(std::span<std::uint64_t>(headers_)));
  result.bytes_sent += (n - 1) * sizeof mine;
  result.bytes_received += (n - 1) * sizeof mine;
  result.counts.resize(n);
  byte_counts_.resize(n);
  for (std::size_t q = 0; q < n; ++q) {
    if (headers_[3 * q + 2] != headers_[2]) {
      throw InvalidArgument(
          where(comm) +
          fmt::format("ranks disagree on the vector length: rank 0 has d = {}, rank {} has d = {}",
                      headers_[2], q, headers_[3 * q + 2]));
    }
    result.counts[q] = static_cast<std::size_t>(headers_[3 * q]);
    byte_counts_[q] = static_cast<std::size_t>(headers_[3 * q + 1]);
  }
}

// Splits recv_bytes_ (one block of byte_counts_[q] bytes per rank: the index
// list of counts[q] indices, then counts[q] * value_width value bytes) and
// decodes every index list into all_indices_, list q at [runs_[q], runs_[q+1]).
void SparseExchanger::decode_index_blocks(Communicator& comm, std::span<const std::size_t> counts,
                                          std::size_t value_width, std::size_t numel,
                                          std::size_t extra_values) {
  const std::size_t n = counts.size();
  runs_.resize(n + 1);
  runs_[0] = 0;
  for (std::size_t q = 0; q < n; ++q) runs_[q + 1] = runs_[q] + counts[q];
  all_indices_.resize(runs_[n]);
  std::size_t offset = 0;
  for (std::size_t q = 0; q < n; ++q) {
    const std::size_t block = byte_counts_[q];
    const std::size_t value_part = (counts[q] + extra_values) * value_width;
    const std::span<Index> list(all_indices_.data() + runs_[q], counts[q]);
    if (value_part > block) {
      throw CommError(where(comm) +
                      fmt::format("rank {} sent a block of {} bytes, too small for {} values", q,
                                  block, counts[q] + extra_values));
    }
    const std::span<const std::byte> index_part(recv_bytes_.data() + offset, block - value_part);
    std::size_t used = 0;
    if (options_.encode_indices) {
      used = decode_indices(index_part, list);
    } else {
      used = list.size_bytes();
      if (used <= index_part.size() && used > 0) std::memcpy(list.data(), index_part.data(), used);
    }
    if (used != index_part.size() || (!list.empty() && list.back() >= numel)) {
      throw CommError(
          where(comm) +
          fmt::format(
              "rank {} sent an index list of {} bytes that does not hold {} indices below d = {}",
              q, index_part.size(), counts[q], numel));
    }
    offset += block;
  }
}

void SparseExchanger::append_known_run() {
  const std::size_t at = all_indices_.size();
  all_indices_.resize(at + known_indices_.size());
  std::copy(known_indices_.begin(), known_indices_.end(),
            all_indices_.begin() + static_cast<std::ptrdiff_t>(at));
  runs_.push_back(all_indices_.size());
}

// union_ = the union of the sorted runs of all_indices_ (runs_), by merging
// neighbouring runs pairwise, level by level (log2 n levels, linear each).
void SparseExchanger::union_of_runs() {
  std::size_t runs = runs_.size() - 1;
  if (runs == 0) {
    union_.clear();
    return;
  }
  int levels = 0;
  for (std::size_t r = runs; r > 1; r = (r + 1) / 2) ++levels;
  // Ping-pong between union_ and merge_scratch_ so the last level lands in union_.
  UninitVector<Index>* dst = levels % 2 == 1 ? &union_ : &merge_scratch_;
  UninitVector<Index>* other = levels % 2 == 1 ? &merge_scratch_ : &union_;
  const Index* src = all_indices_.data();
  if (levels == 0) {
    union_.assign(all_indices_.begin(),
                  all_indices_.begin() + static_cast<std::ptrdiff_t>(runs_[1]));
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

// values_ holds this rank's K decoded values and send_bytes_ their encoding;
// on return values_ holds the sum over ranks (added in rank order).
void SparseExchanger::sum_encoded_values(Communicator& comm, ExchangeResult& result) {
  const auto n = static_cast<std::size_t>(comm.size());
  const std::size_t count = values_.size();
  const std::size_t width = value_bytes(options_.values);
  byte_counts_.assign(n, count * width);
  recv_bytes_.resize(n * count * width);
  comm.allgather(std::span<const std::byte>(send_bytes_), std::span<std::byte>(recv_bytes_));
  count_allgatherv(comm, byte_counts_, result);
  other_values_.resize(count);
  for (std::size_t q = 0; q < n; ++q) {
    const std::span<const std::byte> block(recv_bytes_.data() + q * count * width, count * width);
    decode_values(block, options_.values,
                  q == 0 ? std::span<float>(values_) : std::span<float>(other_values_));
    if (q == 0) continue;
    float* __restrict sum = values_.data();
    const float* __restrict add = other_values_.data();
    for (std::size_t j = 0; j < count; ++j) sum[j] += add[j];
  }
}

void SparseExchanger::exchange_union(Communicator& comm, std::span<const Index> selected,
                                     std::span<const Range> known, bool shared,
                                     std::span<float> accumulated, std::span<float> out,
                                     ExchangeResult& result) {
  const int n = comm.size();
  const std::size_t numel = accumulated.size();
  if (shared) {
#ifndef NDEBUG
    // Debug builds check the precondition: every rank selected the same list.
    gather_headers(comm, selected.size(), hash_indices(selected), numel, result);
    for (int q = 1; q < n; ++q) {
      if (result.counts[q] != result.counts[0] || byte_counts_[q] != byte_counts_[0]) {
        throw InvalidArgument(
            where(comm) +
            fmt::format(
                "pattern 'shared' needs identical selections on all ranks, but rank {} selected {} "
                "indices (hash {:x}) and rank 0 {} (hash {:x})",
                q, result.counts[q], byte_counts_[q], result.counts[0], byte_counts_[0]));
      }
    }
#endif
    result.counts.assign(static_cast<std::size_t>(n), selected.size());
    if (known.empty()) {
      union_.assign(selected.begin(), selected.end());
    } else {
      union_.resize(selected.size() + known_indices_.size());
      std::merge(selected.begin(), selected.end(), known_indices_.begin(), known_indices_.end(),
                 union_.begin());
    }
  } else {
    std::span<const std::byte> mine = std::as_bytes(selected);
    if (options_.encode_indices) {
      send_bytes_.clear();
      encode_indices(selected, send_bytes_);
      mine = send_bytes_;
    }
    result.index_bytes_raw = sizeof(Index) * selected.size();
    result.index_bytes_encoded = mine.size();
    gather_headers(comm, selected.size(), mine.size(), numel, result);
    recv_bytes_.resize(std::accumulate(byte_counts_.begin(), byte_counts_.end(), std::size_t{0}));
    comm.allgatherv(mine, recv_bytes_, byte_counts_);
    count_allgatherv(comm, byte_counts_, result);
    decode_index_blocks(comm, result.counts, 0, numel);
    // The known ranges: one more run, which no rank sent.
    if (!known.empty()) append_known_run();
    union_of_runs();
  }
  const std::span<const Index> u(union_);
  const std::size_t count = u.size();
  values_.resize(count);
  for (std::size_t j = 0; j < count; ++j) values_[j] = accumulated[u[j]];
  send_bytes_.resize(count * value_bytes(options_.values));
  encode_values(values_, options_.values, send_bytes_);
  for (std::size_t j = 0; j < count; ++j) accumulated[u[j]] -= values_[j];

  const bool small_world_16bit = options_.values != ValueEncoding::kFloat32 &&
                                 static_cast<std::size_t>(n) * value_bytes(options_.values) < 8;
  if (small_world_16bit) {
    sum_encoded_values(comm, result);
  } else {
    AllreduceReport report;
    allreduce(comm, std::span<float>(values_), options_.dense, &report);
    result.bytes_sent += report.bytes_sent;
    result.bytes_received += report.bytes_received;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  const auto divisor = static_cast<float>(n);
  for (std::size_t j = 0; j < count; ++j) out[u[j]] = values_[j] / divisor;
  result.union_size = count;
  result.transmitted = u;
}

void SparseExchanger::exchange_allgather(Communicator& comm, std::span<const Index> selected,
                                         std::span<const Range> known, std::span<float> accumulated,
                                         std::span<float> out, ExchangeResult& result) {
  const int n = comm.size();
  const std::size_t numel = accumulated.size();
  const std::size_t count = selected.size();
  const std::size_t extra = known_indices_.size();  // values at the known positions
  const std::size_t width = value_bytes(options_.values);
  // Block: [indices][count values][extra values at the known positions].
  send_bytes_.clear();
  if (options_.encode_indices) {
    encode_indices(selected, send_bytes_);
  } else {
    send_bytes_.resize(selected.size_bytes());
    if (count > 0) std::memcpy(send_bytes_.data(), selected.data(), selected.size_bytes());
  }
  result.index_bytes_raw = sizeof(Index) * count;
  result.index_bytes_encoded = send_bytes_.size();
  const std::size_t index_part = send_bytes_.size();
  send_bytes_.resize(index_part + (count + extra) * width);
  values_.resize(count + extra);
  for (std::size_t j = 0; j < count; ++j) values_[j] = accumulated[selected[j]];
  for (std::size_t j = 0; j < extra; ++j) values_[count + j] = accumulated[known_indices_[j]];
  encode_values(values_, options_.values, std::span<std::byte>(send_bytes_).subspan(index_part));
  for (std::size_t j = 0; j < count; ++j) accumulated[selected[j]] -= values_[j];
  for (std::size_t j = 0; j < extra; ++j) accumulated[known_indices_[j]] -= values_[count + j];

  gather_headers(comm, count, send_bytes_.size(), numel, result);
  recv_bytes_.resize(std::accumulate(byte_counts_.begin(), byte_counts_.end(), std::size_t{0}));
  comm.allgatherv(std::span<const std::byte>(send_bytes_), recv_bytes_, byte_counts_);
  count_allgatherv(comm, byte_counts_, result);
  decode_index_blocks(comm, result.counts, width, numel, extra);

  std::fill(out.begin(), out.end(), 0.0f);
  std::size_t most = 0;
  for (const std::size_t c : result.counts) most = std::max(most, c + extra);
  other_values_.resize(most);
  std::size_t offset = 0;
  for (std::size_t q = 0; q < static_cast<std::size_t>(n); ++q) {
    const std::size_t q_count = result.counts[q];
    const std::size_t value_part = (q_count + extra) * width;
    const std::span<float> q_values(other_values_.data(), q_count + extra);
    offset += byte_counts_[q];
    decode_values(std::span<const std::byte>(recv_bytes_.data() + offset - value_part, value_part),
                  options_.values, q_values);
    const Index* q_indices = all_indices_.data() + runs_[q];
    for (std::size_t j = 0; j < q_count; ++j) out[q_indices[j]] += q_values[j];
    for (std::size_t j = 0; j < extra; ++j) out[known_indices_[j]] += q_values[q_count + j];
  }
  const auto r = static_cast<std::size_t>(comm.rank());
  if (!known.empty()) {
    // What this rank transmitted: its list merged with the known positions.
    with_known_.resize(count + extra);
    std::merge(selected.begin(), selected.end(), known_indices_.begin(), known_indices_.end(),
               with_known_.begin());
    append_known_run();
  }
  union_of_runs();
  const auto divisor = static_cast<float>(n);
  for (const Index i : union_) out[i] /= divisor;
  result.union_size = union_.size();
  result.transmitted =
      known.empty() ? std::span<const Index>(all_indices_.data() + runs_[r], result.counts[r])
                    : std::span<const Index>(with_known_);
}

}  // namespace sparsecomm
