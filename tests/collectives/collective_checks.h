#pragma once
// Backend-agnostic checks of the collectives: each function runs on one rank
// of a world and is called by every rank (same arguments, same order). The
// thread suite calls them inside run_thread_world, the MPI suite on
// mpi_world(). They use non-fatal EXPECTs only and never return early
// between collective calls, so a failure on one rank cannot desynchronize
// the world.
//
// Inputs are chosen so the expected result is exact in float:
//  - ring: rank r holds (r+1) * small(i) with small(i) in [-6, 6], so the
//    sum is small(i) * n(n+1)/2;
//  - Skip-Reduce: rank r holds 2^r * weight(i) with weight(i) in {1, 2, 3};
//    a sum over a set S of ranks is weight(i) * mask(S), and the mask names
//    the contributors exactly (n <= 8 keeps everything below 2^10).

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/skip_reduce.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::testing {

inline constexpr std::size_t kDefaultSegmentBytes = AllreduceOptions{}.segment_bytes;

// Element counts every ring check covers for a world of n ranks.
inline std::vector<std::size_t> ring_sizes(int n) {
  return {0, 1, static_cast<std::size_t>(n > 1 ? n - 1 : 0), 1000, 65537};
}
// Segment sizes: tiny (many segments per chunk), medium, the default.
inline std::vector<std::size_t> ring_segment_sizes() { return {64, 4096, kDefaultSegmentBytes}; }

inline std::int64_t small_value(std::size_t i) { return static_cast<std::int64_t>(i % 13) - 6; }

template <class T>
T ring_input(int rank, std::size_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>((rank + 1) * small_value(i));
  } else {
    // Large magnitudes to exercise all 64 bits.
    return static_cast<std::int64_t>(rank + 1) * small_value(i) * (std::int64_t{1} << 40);
  }
}
template <class T>
T ring_expected(int n, std::size_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(small_value(i) * n * (n + 1) / 2);
  } else {
    return small_value(i) * n * (n + 1) / 2 * (std::int64_t{1} << 40);
  }
}

// Bytes rank r sends in the ring (rotation 0, reduce-scatter from step
// `first`): reduce-scatter chunks r-j (j = first..n-2), allgather chunks
// r+1-j (j = 0..n-2).
inline std::uint64_t ring_bytes_sent(int n, int r, std::size_t numel, std::size_t elem, int first,
                                     int rotation) {
  auto len = [&](int c) {
    c = ((c % n) + n) % n;
    return chunk_begin(numel, n, c + 1) - chunk_begin(numel, n, c);
  };
  std::uint64_t total = 0;
  for (int j = first; j <= n - 2; ++j) total += len(r - j - rotation) * elem;
  for (int j = 0; j <= n - 2; ++j) total += len(r + 1 - rotation - j) * elem;
  return total;
}

// Counts mismatches of `got` against expected(i) and reports the first.
template <class T, class Expected>
void expect_all(std::span<const T> got, Expected expected, const std::string& what) {
  std::size_t bad = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != expected(i)) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": first mismatch at " << first << ": got "
                     << (bad ? got[first] : T{}) << ", want " << (bad ? expected(first) : T{});
}

// One ring all-reduce of `numel` elements; checks the sum and the report.
template <class T>
void check_ring_allreduce(Communicator& comm, std::size_t numel, std::size_t segment_bytes) {
  const int n = comm.size();
  const int r = comm.rank();
  const std::string what =
      fmt::format("ring n={} rank={} numel={} segment_bytes={}", n, r, numel, segment_bytes);
  std::vector<T> data(numel);
  for (std::size_t i = 0; i < numel; ++i) data[i] = ring_input<T>(r, i);
  AllreduceOptions options;
  options.segment_bytes = segment_bytes;
  AllreduceReport report;
  allreduce(comm, std::span<T>(data), options, &report);
  expect_all<T>(
      data, [&](std::size_t i) { return ring_expected<T>(n, i); }, what);

  const int steps = n > 1 ? n - 1 : 0;
  EXPECT_EQ(report.reduce_scatter_steps, steps) << what;
  EXPECT_EQ(report.allgather_steps, steps) << what;
  const std::uint64_t sent = n > 1 ? ring_bytes_sent(n, r, numel, sizeof(T), 0, 0) : 0;
  EXPECT_EQ(report.bytes_sent, sent) << what;
  // Rank r receives exactly what rank r-1 sends.
  const std::uint64_t received =
      n > 1 ? ring_bytes_sent(n, (r - 1 + n) % n, numel, sizeof(T), 0, 0) : 0;
  EXPECT_EQ(report.bytes_received, received) << what;
  EXPECT_GE(report.total_s, report.reduce_scatter_s + report.allgather_s - 1e-9) << what;
}

// One recursive-doubling all-reduce of `numel` elements: the exact sum on
// every rank, and log2(p) (+2 when folding) exchanges' bytes in the report.
template <class T>
void check_recursive_doubling(Communicator& comm, std::size_t numel) {
  const int n = comm.size();
  const int r = comm.rank();
  const std::string what = fmt::format("recursive doubling n={} rank={} numel={}", n, r, numel);
  std::vector<T> data(numel);
  for (std::size_t i = 0; i < numel; ++i) data[i] = ring_input<T>(r, i);
  AllreduceOptions options;
  options.algorithm = AllreduceAlgorithm::kRecursiveDoubling;
  AllreduceReport report;
  allreduce(comm, std::span<T>(data), options, &report);
  expect_all<T>(
      data, [&](std::size_t i) { return ring_expected<T>(n, i); }, what);
  if (n == 1) {
    EXPECT_EQ(report.bytes_sent, 0u) << what;
    return;
  }
  int p = 1;
  int rounds = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++rounds;
  }
  const int folded = n - p;
  const std::uint64_t buffer = numel * sizeof(T);
  // Folded even ranks: one send, one receive; the rest: one per round, plus
  // the fold-in receive and the fold-out send on folded odd ranks.
  const bool sits_out = r < 2 * folded && r % 2 == 0;
  const std::uint64_t exchanges = sits_out ? 1 : static_cast<std::uint64_t>(rounds);
  const std::uint64_t extra = r < 2 * folded && !sits_out ? 1 : 0;
  EXPECT_EQ(report.bytes_sent, (exchanges + extra) * buffer) << what;
  EXPECT_EQ(report.bytes_received, (exchanges + extra) * buffer) << what;
}

inline void check_recursive_doubling_sweep(Communicator& comm) {
  for (const std::size_t numel :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{513}, std::size_t{70001}}) {
    check_recursive_doubling<float>(comm, numel);
    check_recursive_doubling<std::int64_t>(comm, numel);
  }
}

// The full sweep of sizes and segment sizes for both element types.
inline void check_ring_sweep(Communicator& comm) {
  for (const std::size_t numel : ring_sizes(comm.size())) {
    for (const std::size_t segment : ring_segment_sizes()) {
      check_ring_allreduce<float>(comm, numel, segment);
      check_ring_allreduce<std::int64_t>(comm, numel, segment);
    }
  }
  // Segments smaller than an element, or not a multiple of it, round to
  // whole elements (at least one).
  check_ring_allreduce<float>(comm, 100, 1);
  check_ring_allreduce<std::int64_t>(comm, 100, 12);
}

// Ring and native all-reduce give identical results (integer-valued floats
// are exact, so any summation order agrees).
inline void check_ring_matches_native(Communicator& comm, std::size_t numel) {
  std::vector<float> ring(numel);
  for (std::size_t i = 0; i < numel; ++i) ring[i] = ring_input<float>(comm.rank(), i);
  std::vector<float> native = ring;
  allreduce(comm, std::span<float>(ring));
  AllreduceOptions options;
  options.algorithm = AllreduceAlgorithm::kNative;
  allreduce(comm, std::span<float>(native), options);
  EXPECT_EQ(ring, native) << "rank " << comm.rank() << " numel " << numel;

  std::vector<std::int64_t> ring64(numel);
  for (std::size_t i = 0; i < numel; ++i) ring64[i] = ring_input<std::int64_t>(comm.rank(), i);
  std::vector<std::int64_t> native64 = ring64;
  allreduce(comm, std::span<std::int64_t>(ring64));
  allreduce(comm, std::span<std::int64_t>(native64), options);
  EXPECT_EQ(ring64, native64) << "rank " << comm.rank() << " numel " << numel;
}

// A checksum of a float buffer's bits, for comparing results across ranks.
inline std::uint64_t checksum(std::span<const float> values) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const std::byte b : std::as_bytes(values)) {
    h = (h ^ static_cast<std::uint64_t>(b)) * 1099511628211ull;
  }
  return h;
}

// The ring with fp16 or bf16 on the wire: half the fp32 ring's bytes, the
// same bits on every rank, each result a 16-bit value (the owner's rounding
// of its chunk), and within the roundings of its n-1 partial sums and that
// one of the exact sum; a world of one sends nothing and rounds nothing. Integer data, another
// algorithm and another codec are refused.
inline void check_half_wire_ring(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (const ValueEncoding wire : {ValueEncoding::kFloat16, ValueEncoding::kBFloat16}) {
    // 2^-11 and 2^-8: the relative rounding of fp16 and bf16.
    const double unit = wire == ValueEncoding::kFloat16 ? 0x1p-11 : 0x1p-8;
    for (const std::size_t numel :
         {std::size_t{0}, std::size_t{3}, std::size_t{1000}, std::size_t{70001}}) {
      for (const std::size_t segment : {std::size_t{64}, std::size_t{1} << 20}) {
        const std::string what = fmt::format("{} n={} rank={} numel={} segment={}",
                                             value_encoding_name(wire), n, r, numel, segment);
        std::vector<float> data(numel);
        double exact_bound = 0.0;
        for (std::size_t i = 0; i < numel; ++i) {
          data[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(r)) *
                    (1.0f + static_cast<float>(i % 7));
        }
        AllreduceOptions options;
        options.segment_bytes = segment;
        options.wire = wire;
        AllreduceReport report;
        std::vector<float> result = data;
        allreduce(comm, std::span<float>(result), options, &report);
        if (n == 1) {  // nothing travels, nothing is rounded
          EXPECT_EQ(result, data) << what;
          continue;
        }
        for (std::size_t i = 0; i < numel; ++i) {
          // The exact sum and the sum of magnitudes, from every rank's input.
          double sum = 0.0;
          double magnitude = 0.0;
          for (int q = 0; q < n; ++q) {
            const double v =
                std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(q)) *
                (1.0f + static_cast<float>(i % 7));
            sum += v;
            magnitude += std::fabs(v);
          }
          exact_bound = std::max(exact_bound, std::fabs(result[i] - sum) / (magnitude * n * unit));
          const float rounded = wire == ValueEncoding::kFloat16
                                    ? fp16_to_float(float_to_fp16(result[i]))
                                    : bf16_to_float(float_to_bf16(result[i]));
          ASSERT_EQ(rounded, result[i]) << what << " element " << i << " is not 16-bit";
        }
        // Every rounding costs at most half a unit of a partial sum's
        // magnitude: n of them, well within one unit each.
        EXPECT_LE(exact_bound, 1.0) << what;
        const std::vector<std::uint64_t> sums =
            allgather_value(comm, checksum(std::span<const float>(result)));
        for (const std::uint64_t s : sums) EXPECT_EQ(s, sums.front()) << what;
        const std::uint64_t fp32_sent = n > 1 ? ring_bytes_sent(n, r, numel, 4, 0, 0) : 0;
        EXPECT_EQ(report.bytes_sent, fp32_sent / 2) << what;
      }
    }
  }
  std::vector<std::int64_t> integers(10, 1);
  AllreduceOptions half;
  half.wire = ValueEncoding::kFloat16;
  EXPECT_THROW(allreduce(comm, std::span<std::int64_t>(integers), half), InvalidArgument);
  std::vector<float> values(10, 1.0f);
  half.algorithm = AllreduceAlgorithm::kRecursiveDoubling;
  EXPECT_THROW(allreduce(comm, std::span<float>(values), half), InvalidArgument);
  AllreduceOptions int8;
  int8.wire = ValueEncoding::kInt8;
  EXPECT_THROW(allreduce(comm, std::span<float>(values), int8), InvalidArgument);
}

inline float skip_weight(std::size_t i) { return static_cast<float>(i % 3 + 1); }

struct SkipCase {
  std::size_t numel = 1000;
  int skip = 0;
  std::uint64_t seed = 7;
  std::int64_t step = 0;
  std::int64_t bucket = 0;
  bool rescale = false;
  bool protect = false;
  std::size_t min_elements = 0;  // 0: every test size is subject to skipping
  std::size_t segment_bytes = kDefaultSegmentBytes;
};

// One Skip-Reduce call: every chunk holds exactly the sum over the
// schedule's contributors (decoded from the 2^rank inputs), the schedule is
// well formed and identical on all ranks, the result is identical on all
// ranks, and the report is consistent.
inline void check_skip_reduce(Communicator& comm, const SkipCase& c) {
  const int n = comm.size();
  const int r = comm.rank();
  const std::string what = fmt::format(
      "skip-reduce n={} rank={} numel={} skip={} step={} rescale={} protect={} "
      "min_elements={} segment_bytes={}",
      n, r, c.numel, c.skip, c.step, c.rescale, c.protect, c.min_elements, c.segment_bytes);
  SkipReduceOptions options;
  options.skip = c.skip;
  options.seed = c.seed;
  options.step = c.step;
  options.bucket = c.bucket;
  options.rescale = c.rescale;
  options.protect = c.protect;
  options.min_elements = c.min_elements;
  options.segment_bytes = c.segment_bytes;

  std::vector<float> data(c.numel);
  for (std::size_t i = 0; i < c.numel; ++i) data[i] = std::ldexp(skip_weight(i), r);
  SkipReduceReport report;
  skip_reduce(comm, std::span<float>(data), options, &report);
  const SkipSchedule& s = report.schedule;

  // The schedule: what was asked for, and the same as computed offline.
  const bool protect = c.protect || c.numel < c.min_elements;
  const int applied = protect ? 0 : c.skip;
  EXPECT_EQ(s.world, n) << what;
  EXPECT_EQ(s.skip, applied) << what;
  EXPECT_EQ(s.protected_buffer, protect) << what;
  EXPECT_GE(s.rotation, 0) << what;
  EXPECT_LT(s.rotation, n) << what;
  const SkipSchedule offline = skip_reduce_schedule(n, c.numel, options);
  EXPECT_EQ(offline.rotation, s.rotation) << what;
  EXPECT_EQ(offline.skip, s.skip) << what;
  EXPECT_EQ(s.chunks.size(), static_cast<std::size_t>(n)) << what;

  // Every rank agrees on the schedule and on the result.
  struct Fingerprint {
    int skip;
    int rotation;
    int protected_buffer;
    int owners;  // owner of chunk c in base n, for small n
    std::uint64_t result;
  };
  Fingerprint mine{s.skip, s.rotation, s.protected_buffer ? 1 : 0, 0, checksum(data)};
  for (const SkipChunk& chunk : s.chunks) mine.owners = mine.owners * n + chunk.owner;
  const std::vector<Fingerprint> all = allgather_value(comm, mine);
  for (int q = 0; q < n; ++q) {
    const Fingerprint& other = all[static_cast<std::size_t>(q)];
    EXPECT_EQ(other.skip, mine.skip) << what << " vs rank " << q;
    EXPECT_EQ(other.rotation, mine.rotation) << what << " vs rank " << q;
    EXPECT_EQ(other.protected_buffer, mine.protected_buffer) << what << " vs rank " << q;
    EXPECT_EQ(other.owners, mine.owners) << what << " vs rank " << q;
    EXPECT_EQ(other.result, mine.result) << what << " vs rank " << q;
  }

  std::vector<int> owned(static_cast<std::size_t>(n), 0);
  std::size_t expected_begin = 0;
  const float scale =
      c.rescale && applied > 0 ? static_cast<float>(n) / static_cast<float>(n - applied) : 1.0f;
  for (int ci = 0; ci < static_cast<int>(s.chunks.size()); ++ci) {
    const SkipChunk& chunk = s.chunks[static_cast<std::size_t>(ci)];
    const std::string where = what + fmt::format(" chunk {}", ci);
    EXPECT_EQ(chunk.begin, expected_begin) << where;
    EXPECT_EQ(chunk.end, chunk_begin(c.numel, n, ci + 1)) << where;
    expected_begin = chunk.end;
    EXPECT_EQ(chunk.contributors, n - applied) << where;
    // The contributors are a contiguous run ending at the owner.
    EXPECT_EQ(chunk.owner, (chunk.first_contributor + chunk.contributors - 1) % n) << where;
    if (chunk.owner >= 0 && chunk.owner < n) ++owned[static_cast<std::size_t>(chunk.owner)];

    int mask = 0;
    int dropped = 0;
    for (int q = 0; q < n; ++q) {
      if (!chunk.dropped(q, n)) {
        mask |= 1 << q;
      } else {
        ++dropped;
      }
    }
    EXPECT_EQ(dropped, applied) << where;
    EXPECT_FALSE(chunk.dropped(chunk.owner, n)) << where;
    // The data: weight(i) * mask, times the rescale factor.
    const std::span<const float> got(data.data() + chunk.begin, chunk.end - chunk.begin);
    if (scale == 1.0f) {
      expect_all<float>(
          got,
          [&](std::size_t k) { return skip_weight(chunk.begin + k) * static_cast<float>(mask); },
          where);
    } else {
      std::size_t bad = 0;
      for (std::size_t k = 0; k < got.size(); ++k) {
        const float want = skip_weight(chunk.begin + k) * static_cast<float>(mask) * scale;
        if (std::fabs(got[k] - want) > 1e-5f * std::fabs(want)) ++bad;
      }
      EXPECT_EQ(bad, 0u) << where << " (rescaled by " << scale << ")";
    }
  }
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(owned[static_cast<std::size_t>(q)], 1)
        << what << ": rank " << q << " owns " << owned[static_cast<std::size_t>(q)] << " chunks";
  }

  // The report.
  const bool skipped = applied > 0;
  EXPECT_EQ(report.elements_subject_to_skipping, skipped ? c.numel : 0u) << what;
  EXPECT_DOUBLE_EQ(report.effective_density, skipped ? static_cast<double>(n - applied) / n : 1.0)
      << what;
  const int rs_steps = n > 1 ? n - 1 - applied : 0;
  EXPECT_EQ(report.phases.reduce_scatter_steps, rs_steps) << what;
  EXPECT_EQ(report.phases.allgather_steps, n > 1 ? n - 1 : 0) << what;
  const std::uint64_t sent =
      n > 1 ? ring_bytes_sent(n, r, c.numel, sizeof(float), applied, s.rotation) : 0;
  EXPECT_EQ(report.phases.bytes_sent, sent) << what;
}

// Skip-Reduce for every skip in [0, n-1], over several steps (rotations),
// sizes including numel < n and 0, and a multi-segment case.
inline void check_skip_reduce_sweep(Communicator& comm) {
  const int n = comm.size();
  for (int skip = 0; skip < n; ++skip) {
    for (std::int64_t step = 0; step < 3; ++step) {
      for (const std::size_t numel :
           {std::size_t{0}, static_cast<std::size_t>(n > 1 ? n - 1 : 0), std::size_t{1000}}) {
        SkipCase c;
        c.numel = numel;
        c.skip = skip;
        c.step = step;
        check_skip_reduce(comm, c);
      }
      SkipCase segmented;
      segmented.numel = 4099;
      segmented.skip = skip;
      segmented.step = step;
      segmented.bucket = 3;
      segmented.segment_bytes = 64;
      check_skip_reduce(comm, segmented);
    }
    SkipCase large;  // segments above the thread backend's eager limit
    large.numel = 65537;
    large.skip = skip;
    large.step = 5;
    check_skip_reduce(comm, large);
    SkipCase rescaled;
    rescaled.skip = skip;
    rescaled.rescale = true;
    rescaled.step = 11;
    check_skip_reduce(comm, rescaled);
  }
}

// Protection: a buffer below min_elements, or a protected bucket, is summed
// in full and reported as protected, whatever the skip.
inline void check_skip_reduce_protection(Communicator& comm) {
  const int n = comm.size();
  const int skip = n - 1;
  SkipCase small;
  small.numel = 999;
  small.min_elements = 1000;
  small.skip = skip;
  check_skip_reduce(comm, small);
  SkipCase at_threshold = small;  // numel == min_elements is not protected
  at_threshold.numel = 1000;
  check_skip_reduce(comm, at_threshold);
  SkipCase user;
  user.numel = 5000;
  user.min_elements = 10;
  user.skip = skip;
  user.protect = true;
  user.rescale = true;  // no effect on a protected buffer
  check_skip_reduce(comm, user);
}

// Invalid arguments are rejected on every rank before any message is sent.
inline void check_invalid_arguments(Communicator& comm) {
  const int n = comm.size();
  std::vector<float> data(100, 1.0f);
  AllreduceOptions zero_segments;
  zero_segments.segment_bytes = 0;
  EXPECT_THROW(allreduce(comm, std::span<float>(data), zero_segments), InvalidArgument);
  SkipReduceOptions options;
  options.skip = n;
  EXPECT_THROW(skip_reduce(comm, std::span<float>(data), options), InvalidArgument);
  options.skip = -1;
  EXPECT_THROW(skip_reduce(comm, std::span<float>(data), options), InvalidArgument);
  options.skip = 0;
  options.segment_bytes = 0;
  EXPECT_THROW(skip_reduce(comm, std::span<float>(data), options), InvalidArgument);
  // The world is still usable.
  check_ring_allreduce<float>(comm, 10, 64);
}

}  // namespace sparsecomm::testing
