#pragma once
// Backend-agnostic checks of the sparse exchange patterns (sparse_exchange.h).
// Each function runs on one rank and is called by every rank of a world with
// the same arguments, in the same order; the thread suite calls them inside
// run_thread_world, the MPI suite on mpi_world(). Non-fatal EXPECTs only and
// no early return between collective calls, so one failing rank cannot
// desynchronize the world.
//
// Every rank regenerates every rank's input and selection from a seed
// (hash of (seed, rank, index)), so each can compute the reference on its
// own: the set each rank transmits (U or its own I_r), the decoded value of
// every transmitted element (codec: rounding at the source), the expected
// mean, the expected new residual.
//  - kExact inputs are multiples of 1/8 in [-8, 8]: exact in fp16 and bf16,
//    and every sum over <= 8 ranks is exact in float, so `out` must match
//    the reference bit for bit whatever the summation order (ring, tree,
//    split, rank order). A block codec's levels (scale = max / L) are not
//    such multiples: with one, `out` gets the tolerance of kRounding.
//  - kRounding inputs are random floats over a wide range (subnormal to
//    2^100): fp16/bf16 round and saturate; `out` is checked against the
//    reference with a relative tolerance, conservation exactly.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/collective_checks.h"
#include "sparsecomm/collectives/index_codec.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::testing {

inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline std::uint64_t hash4(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return mix64(seed ^ mix64(a ^ mix64(b ^ mix64(c))));
}
inline double unit_interval(std::uint64_t h) { return static_cast<double>(h >> 11) * 0x1p-53; }

enum class SelectionKind {
  kOverlapping,  // each rank its own random set plus a random set common to all
  kDisjoint,     // every index belongs to one random rank (interleaved, like ExDyna's blocks)
  kRanges,       // rank r selects in range (r + seed) mod n of n equal ranges (MiCRO's)
  kEmptyOnSome,  // half of the ranks select nothing
  kEmptyOnAll,   // nobody selects anything
  kFull,         // every rank selects every index
  kShared,       // the same random set on every rank
};
enum class InputKind { kExact, kRounding };

struct ExchangeCase {
  std::size_t numel = 0;
  SelectionKind selection = SelectionKind::kOverlapping;
  InputKind input = InputKind::kExact;
  double density = 0.01;
  std::uint64_t seed = 1;
};

inline std::string selection_name(SelectionKind kind) {
  switch (kind) {
    case SelectionKind::kOverlapping:
      return "overlapping";
    case SelectionKind::kDisjoint:
      return "disjoint";
    case SelectionKind::kRanges:
      return "ranges";
    case SelectionKind::kEmptyOnSome:
      return "empty-on-some";
    case SelectionKind::kEmptyOnAll:
      return "empty-on-all";
    case SelectionKind::kFull:
      return "full";
    case SelectionKind::kShared:
      return "shared";
  }
  return "?";
}

inline float input_value(const ExchangeCase& c, int rank, std::size_t i) {
  const std::uint64_t h = hash4(c.seed, 1, static_cast<std::uint64_t>(rank), i);
  if (c.input == InputKind::kExact)
    return static_cast<float>(static_cast<int>(h % 129) - 64) / 8.0f;
  const auto mantissa = static_cast<std::uint32_t>(h >> 41) & 0x7FFFFFu;
  const std::uint32_t sign = (h & 1u) != 0 ? 0x80000000u : 0u;
  int exponent = static_cast<int>((h >> 8) % 50) - 30;  // 2^-30 .. 2^19: fp16 range and beyond
  if ((h >> 20) % 23 == 0)
    exponent = static_cast<int>((h >> 24) % 228) - 127;  // subnormal .. 2^100
  const auto biased = static_cast<std::uint32_t>(exponent + 127);
  return std::bit_cast<float>(sign | biased << 23 | mantissa);
}

inline bool is_selected(const ExchangeCase& c, int n, int rank, std::size_t i) {
  const auto r = static_cast<std::uint64_t>(rank);
  switch (c.selection) {
    case SelectionKind::kOverlapping:
      return unit_interval(hash4(c.seed, 2, r, i)) < c.density / 2 ||
             unit_interval(hash4(c.seed, 3, 0, i)) < c.density / 2;
    case SelectionKind::kDisjoint:
      return hash4(c.seed, 4, 0, i) % static_cast<std::uint64_t>(n) == r &&
             unit_interval(hash4(c.seed, 5, 0, i)) < c.density * n;
    case SelectionKind::kRanges: {
      // Range p = [p d / n, (p + 1) d / n); rotated, so the ranks' lists are
      // out of rank order.
      const std::uint64_t p = (r + c.seed) % static_cast<std::uint64_t>(n);
      const std::uint64_t owner = i * static_cast<std::uint64_t>(n) / c.numel;
      return owner == p && unit_interval(hash4(c.seed, 5, 0, i)) < c.density * n;
    }
    case SelectionKind::kEmptyOnSome:
      return (r + c.seed) % 2 == 1 && unit_interval(hash4(c.seed, 2, r, i)) < c.density;
    case SelectionKind::kEmptyOnAll:
      return false;
    case SelectionKind::kFull:
      return true;
    case SelectionKind::kShared:
      return unit_interval(hash4(c.seed, 3, 0, i)) < c.density;
  }
  return false;
}

inline std::vector<Index> selection_of(const ExchangeCase& c, int n, int rank) {
  std::vector<Index> indices;
  for (std::size_t i = 0; i < c.numel; ++i) {
    if (is_selected(c, n, rank, i)) indices.push_back(static_cast<Index>(i));
  }
  return indices;
}

// What a rank puts on the wire for `a` (the codec's rounding at the source)
// with a codec of fixed width.
inline float sent_value(float a, ValueEncoding encoding) {
  std::array<std::byte, 4> bytes{};
  encode_values(std::span<float>(&a, 1), encoding,
                std::span<std::byte>(bytes.data(), fixed_value_bytes(encoding)));
  return a;
}

inline std::size_t index_wire_bytes(std::span<const Index> indices, bool encode) {
  return encode ? encoded_index_bytes(indices) : sizeof(Index) * indices.size();
}

struct ExchangeReference {
  std::vector<std::vector<Index>> selections;  // every rank's I_q
  std::vector<Index> union_indices;            // U, ascending
  std::vector<float> out;                      // expected mean
  std::vector<double> magnitude;               // sum over ranks of |sent| (tolerance)
  std::vector<Index> transmitted;              // this rank's
  std::vector<float> residual;                 // this rank's new residual
  std::vector<float> sent;                     // this rank's decoded value where transmitted
};

// The decoded values rank q sends at `positions` (ascending), encoded as one
// list the way the patterns do (a block codec's scales span the list;
// round-to-nearest codecs only, which draw nothing).
inline std::vector<float> decoded_list(const ExchangeCase& c, int q,
                                       std::span<const Index> positions, ValueEncoding encoding) {
  std::vector<float> values;
  values.reserve(positions.size());
  for (const Index i : positions) values.push_back(input_value(c, q, i));
  std::vector<std::byte> bytes(encoded_value_bytes(encoding, values.size()));
  encode_values(values, encoding, bytes);
  return values;
}

inline ExchangeReference exchange_reference(const ExchangeCase& c, ExchangePattern pattern,
                                            ValueEncoding encoding, int n, int rank) {
  ExchangeReference ref;
  std::vector<char> in_union(c.numel, 0);
  for (int q = 0; q < n; ++q) {
    ref.selections.push_back(selection_of(c, n, q));
    for (const Index i : ref.selections.back()) in_union[i] = 1;
  }
  for (std::size_t i = 0; i < c.numel; ++i) {
    if (in_union[i] != 0) ref.union_indices.push_back(static_cast<Index>(i));
  }
  const bool sends_union =
      pattern == ExchangePattern::kUnionAllreduce || pattern == ExchangePattern::kSharedIndices;
  std::vector<float> sum(c.numel, 0.0f);
  ref.magnitude.assign(c.numel, 0.0);
  ref.sent.assign(c.numel, 0.0f);
  for (int q = 0; q < n; ++q) {
    const std::vector<Index>& sent =
        sends_union ? ref.union_indices : ref.selections[static_cast<std::size_t>(q)];
    const std::vector<float> decoded = decoded_list(c, q, sent, encoding);
    for (std::size_t j = 0; j < sent.size(); ++j) {
      const float v = decoded[j];
      sum[sent[j]] += v;
      ref.magnitude[sent[j]] += std::fabs(static_cast<double>(v));
      if (q == rank) ref.sent[sent[j]] = v;
    }
  }
  ref.out.resize(c.numel);
  for (std::size_t i = 0; i < c.numel; ++i) ref.out[i] = sum[i] / static_cast<float>(n);
  ref.transmitted =
      sends_union ? ref.union_indices : ref.selections[static_cast<std::size_t>(rank)];
  ref.residual.resize(c.numel);
  for (std::size_t i = 0; i < c.numel; ++i) ref.residual[i] = input_value(c, rank, i);
  for (const Index i : ref.transmitted) ref.residual[i] = ref.residual[i] - ref.sent[i];
  return ref;
}

inline std::uint64_t hash_floats(std::span<const float> values) {
  std::uint64_t h = 7;
  for (const float v : values) h = mix64(h ^ std::bit_cast<std::uint32_t>(v));
  return h;
}

// One exchange of case `c` with `exchanger`; checks everything the contract
// promises. Returns this rank's result for further checks.
inline ExchangeResult check_exchange_case(Communicator& comm, SparseExchange& exchanger,
                                          const ExchangeCase& c,
                                          std::vector<float>* out_copy = nullptr) {
  const int n = comm.size();
  const int r = comm.rank();
  const ExchangeOptions& options = exchanger.options();
  const ExchangePattern pattern = exchanger.pattern();
  const std::string what = fmt::format(
      "{} ({}) values={} encode_indices={} n={} rank={} d={} selection={} input={} density={} "
      "seed={}",
      exchange_pattern_name(pattern), sparse_allreduce_algorithm_name(options.sparse_algorithm),
      value_encoding_name(options.values), options.encode_indices, n, r, c.numel,
      selection_name(c.selection), c.input == InputKind::kExact ? "exact" : "rounding", c.density,
      c.seed);
  SparseSelection selection;
  for (const Index i : selection_of(c, n, r)) selection.indices.push_back(i);
  std::vector<float> accumulated(c.numel);
  for (std::size_t i = 0; i < c.numel; ++i) accumulated[i] = input_value(c, r, i);
  const std::vector<float> before = accumulated;
  std::vector<float> out(c.numel, 12345.0f);  // must be overwritten everywhere
  ExchangeResult result;
  exchanger.exchange(comm, selection, accumulated, out, result);
  const ExchangeReference ref = exchange_reference(c, pattern, options.values, n, r);

  // out: the mean of what was sent.
  std::size_t bad_out = 0, first_out = 0;
  for (std::size_t i = 0; i < c.numel; ++i) {
    bool ok = false;
    if (c.input == InputKind::kExact && !is_block_quantized(options.values)) {
      ok = out[i] == ref.out[i];
    } else {
      const double tolerance = 1e-5 * ref.magnitude[i] / n + 1e-40;
      ok = std::fabs(static_cast<double>(out[i]) - static_cast<double>(ref.out[i])) <= tolerance;
    }
    if (!ok && bad_out++ == 0) first_out = i;
  }
  EXPECT_EQ(bad_out, 0u) << what << ": first wrong output at " << first_out << ": got "
                         << (bad_out ? out[first_out] : 0.0f) << ", want "
                         << (bad_out ? ref.out[first_out] : 0.0f);

  // Residual: exactly a - sent where sent, untouched (bit for bit) elsewhere;
  // and conservation: sent + residual == a exactly (checked in double).
  std::vector<char> sent(c.numel, 0);
  for (const Index i : ref.transmitted) sent[i] = 1;
  std::size_t bad_residual = 0, first_residual = 0;
  for (std::size_t i = 0; i < c.numel; ++i) {
    bool ok = false;
    if (sent[i] != 0) {
      const float t = ref.sent[i];
      ok = accumulated[i] == ref.residual[i] &&
           static_cast<double>(t) + static_cast<double>(accumulated[i]) ==
               static_cast<double>(before[i]);
    } else {
      ok = std::bit_cast<std::uint32_t>(accumulated[i]) == std::bit_cast<std::uint32_t>(before[i]);
    }
    if (!ok && bad_residual++ == 0) first_residual = i;
  }
  EXPECT_EQ(bad_residual, 0u) << what << ": first wrong residual at " << first_residual
                              << ": a=" << (bad_residual ? before[first_residual] : 0.0f)
                              << " residual="
                              << (bad_residual ? accumulated[first_residual] : 0.0f);

  // The shared outcome.
  EXPECT_TRUE(std::equal(result.transmitted.begin(), result.transmitted.end(),
                         ref.transmitted.begin(), ref.transmitted.end()))
      << what << ": transmitted " << result.transmitted.size() << " indices, want "
      << ref.transmitted.size();
  std::vector<std::size_t> counts;
  for (const auto& s : ref.selections) counts.push_back(s.size());
  EXPECT_EQ(result.counts, counts) << what;
  const std::size_t union_size = pattern == ExchangePattern::kSharedIndices
                                     ? ref.selections[static_cast<std::size_t>(r)].size()
                                     : ref.union_indices.size();
  EXPECT_EQ(result.union_size, union_size) << what;
  EXPECT_GE(result.seconds, 0.0) << what;

  // Bytes: none in a world of one; every byte sent is received somewhere.
  const std::size_t own = selection.indices.size();
  if (pattern == ExchangePattern::kUnionAllreduce || pattern == ExchangePattern::kSparseAllgather) {
    EXPECT_EQ(result.index_bytes_raw, sizeof(Index) * own) << what;
    EXPECT_EQ(result.index_bytes_encoded,
              index_wire_bytes(selection.indices, options.encode_indices))
        << what;
  } else if (pattern == ExchangePattern::kSharedIndices) {
    EXPECT_EQ(result.index_bytes_raw, 0u) << what;
    EXPECT_EQ(result.index_bytes_encoded, 0u) << what;
  } else if (!options.encode_indices) {
    EXPECT_EQ(result.index_bytes_encoded, result.index_bytes_raw) << what;
  }
  if (n == 1) {
    EXPECT_EQ(result.bytes_sent, 0u) << what;
    EXPECT_EQ(result.bytes_received, 0u) << what;
  }
  if (pattern == ExchangePattern::kSparseAllgather) {
    std::uint64_t expected = 24u * static_cast<std::uint64_t>(n - 1);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const auto& s = ref.selections[static_cast<std::size_t>(q)];
      expected += index_wire_bytes(s, options.encode_indices) +
                  encoded_value_bytes(options.values, s.size());
    }
    EXPECT_EQ(result.bytes_received, expected) << what;
  } else if (pattern == ExchangePattern::kUnionAllreduce && n > 1) {
    std::uint64_t expected = 24u * static_cast<std::uint64_t>(n - 1);
    for (int q = 0; q < n; ++q) {
      if (q != r)
        expected +=
            index_wire_bytes(ref.selections[static_cast<std::size_t>(q)], options.encode_indices);
    }
    const std::size_t k = ref.union_indices.size();
    const std::size_t value_bytes = encoded_value_bytes(options.values, k);
    if (options.values != ValueEncoding::kFloat32 &&
        static_cast<std::size_t>(n) * value_bytes < 8 * k) {
      expected += static_cast<std::uint64_t>(n - 1) * value_bytes;
    } else {
      expected += ring_bytes_sent(n, (r - 1 + n) % n, k, sizeof(float), 0, 0);
    }
    EXPECT_EQ(result.bytes_received, expected) << what;
  }
  const std::array<std::uint64_t, 3> mine{result.bytes_sent, result.bytes_received,
                                          hash_floats(out)};
  std::vector<std::uint64_t> all(3 * static_cast<std::size_t>(n));
  comm.allgather(bytes_of(std::span<const std::uint64_t>(mine)),
                 writable_bytes_of(std::span<std::uint64_t>(all)));
  std::uint64_t sent_total = 0, received_total = 0;
  for (int q = 0; q < n; ++q) {
    sent_total += all[3 * static_cast<std::size_t>(q)];
    received_total += all[3 * static_cast<std::size_t>(q) + 1];
    EXPECT_EQ(all[3 * static_cast<std::size_t>(q) + 2], all[2])
        << what << ": rank " << q << " has a different result than rank 0";
  }
  EXPECT_EQ(sent_total, received_total) << what;
  if (out_copy != nullptr) *out_copy = out;
  return result;
}

// The cases of a sweep: sizes 0, below n, medium, (full sweeps) large.
inline std::vector<ExchangeCase> exchange_cases(int n, ExchangePattern pattern, bool full) {
  std::vector<std::size_t> sizes = {0, 997};
  if (n > 1) sizes.push_back(static_cast<std::size_t>(n - 1));  // d < n: empty ranges
  std::vector<SelectionKind> kinds;
  if (pattern == ExchangePattern::kSharedIndices) {
    kinds = {SelectionKind::kShared, SelectionKind::kEmptyOnAll, SelectionKind::kFull};
  } else {
    kinds = {SelectionKind::kOverlapping, SelectionKind::kDisjoint,   SelectionKind::kRanges,
             SelectionKind::kEmptyOnSome, SelectionKind::kEmptyOnAll, SelectionKind::kFull};
  }
  std::vector<ExchangeCase> cases;
  std::uint64_t seed = 11;
  for (const std::size_t numel : sizes) {
    for (const SelectionKind kind : kinds) {
      for (const InputKind input : {InputKind::kExact, InputKind::kRounding}) {
        for (const double density : {0.01, 0.3}) {
          if (kind == SelectionKind::kEmptyOnAll || kind == SelectionKind::kFull) {
            if (density != 0.01) continue;
          }
          cases.push_back({numel, kind, input, density, seed++});
        }
      }
    }
  }
  if (full) {
    // Multi-byte varint gaps, many ring segments, the dense switch.
    for (const SelectionKind kind : {kinds.front(), SelectionKind::kFull}) {
      cases.push_back({20011, kind, InputKind::kExact, 0.002, seed++});
      cases.push_back({20011, kind, InputKind::kRounding, 0.2, seed++});
    }
  }
  return cases;
}

// Every case of exchange_cases for one pattern (and sparse all-reduce
// algorithm) under every value encoding, with and without index encoding.
// One exchanger per option set serves all its cases (scratch reuse).
inline void check_exchange_sweep(Communicator& comm, ExchangePattern pattern,
                                 SparseAllreduceAlgorithm algorithm, bool full) {
  // The round-to-nearest block codecs on the patterns that send each rank's
  // values once (the sparse all-reduce refuses them).
  std::vector<ValueEncoding> encodings = {ValueEncoding::kFloat32, ValueEncoding::kFloat16,
                                          ValueEncoding::kBFloat16};
  if (pattern != ExchangePattern::kSparseAllreduce) {
    encodings.insert(encodings.end(),
                     {ValueEncoding::kInt8, ValueEncoding::kInt4, ValueEncoding::kInt2});
  }
  for (const ValueEncoding values : encodings) {
    for (const bool encode : {true, false}) {
      ExchangeOptions options;
      options.values = values;
      options.encode_indices = encode;
      options.sparse_algorithm = algorithm;
      options.dense.segment_bytes = 256;  // many segments per chunk
      const auto exchanger = make_sparse_exchange(pattern, options);
      for (const ExchangeCase& c : exchange_cases(comm.size(), pattern, full)) {
        check_exchange_case(comm, *exchanger, c);
      }
    }
  }
}

// Recursive doubling, split and auto give the same sum (exactly, for exact
// inputs) and auto moves exactly the bytes of the algorithm its rule picks.
inline void check_sparse_allreduce_algorithms_agree(Communicator& comm) {
  for (const std::size_t numel : {std::size_t{0}, std::size_t{5}, std::size_t{4000}}) {
    for (const double density : {0.002, 0.05, 0.6}) {
      const ExchangeCase c{numel, SelectionKind::kOverlapping, InputKind::kExact, density, 99};
      std::array<std::vector<float>, 3> outs;
      std::array<std::uint64_t, 3> sent{};
      const std::array<SparseAllreduceAlgorithm, 3> algorithms{
          SparseAllreduceAlgorithm::kRecursiveDoubling, SparseAllreduceAlgorithm::kSplit,
          SparseAllreduceAlgorithm::kAuto};
      std::size_t total = 0;
      for (std::size_t a = 0; a < algorithms.size(); ++a) {
        ExchangeOptions options;
        options.sparse_algorithm = algorithms[a];
        const auto exchanger = make_sparse_exchange(ExchangePattern::kSparseAllreduce, options);
        const ExchangeResult result = check_exchange_case(comm, *exchanger, c, &outs[a]);
        sent[a] = result.bytes_sent;
        total = std::accumulate(result.counts.begin(), result.counts.end(), std::size_t{0});
      }
      const std::string what = fmt::format("d={} density={} rank={}", numel, density, comm.rank());
      EXPECT_EQ(outs[0], outs[1]) << what << ": recursive doubling and split differ";
      EXPECT_EQ(outs[0], outs[2]) << what << ": recursive doubling and auto differ";
      const bool doubling = static_cast<double>(total) * ExchangeOptions{}.sparse_switch_factor <
                            static_cast<double>(numel);
      EXPECT_EQ(sent[2], doubling ? sent[0] : sent[1])
          << what << ": auto should have picked " << (doubling ? "recursive doubling" : "split");
    }
  }
}

// Several steps with one exchanger: the residual carries over and after the
// last step, n * (sum of outs) + sum of residuals == sum of all inputs.
// Exact inputs and n a power of two keep every operation exact; for other n
// out = sum / n is rounded, so a few ulps of slack are allowed there.
inline void check_error_feedback_steps(Communicator& comm, ExchangePattern pattern) {
  const int n = comm.size();
  const std::size_t numel = 300;
  ExchangeOptions options;
  options.values = ValueEncoding::kBFloat16;
  const auto exchanger = make_sparse_exchange(pattern, options);
  std::vector<float> residual(numel, 0.0f), out(numel), delivered(numel, 0.0f);
  std::vector<double> fed(numel, 0.0);
  ExchangeResult result;
  for (std::uint64_t step = 0; step < 5; ++step) {
    const ExchangeCase c{numel,
                         pattern == ExchangePattern::kSharedIndices ? SelectionKind::kShared
                                                                    : SelectionKind::kOverlapping,
                         InputKind::kExact, 0.1, 500 + step};
    for (std::size_t i = 0; i < numel; ++i) residual[i] += input_value(c, comm.rank(), i);
    for (int q = 0; q < n; ++q) {
      for (std::size_t i = 0; i < numel; ++i) fed[i] += input_value(c, q, i);
    }
    SparseSelection selection;
    for (const Index i : selection_of(c, n, comm.rank())) selection.indices.push_back(i);
    exchanger->exchange(comm, selection, residual, out, result);
    for (std::size_t i = 0; i < numel; ++i) delivered[i] += out[i] * static_cast<float>(n);
  }
  std::vector<float> residual_sum = residual;
  allreduce(comm, std::span<float>(residual_sum));
  const bool exact = (n & (n - 1)) == 0;
  const double slack = exact ? 0.0 : 1e-5 * 5 * 8 * n;  // |inputs| <= 8, 5 steps
  std::size_t bad = 0;
  for (std::size_t i = 0; i < numel; ++i) {
    const double total = static_cast<double>(delivered[i]) + static_cast<double>(residual_sum[i]);
    if (std::fabs(total - fed[i]) > slack) ++bad;
  }
  EXPECT_EQ(bad, 0u) << exchange_pattern_name(pattern) << " n=" << n << " rank=" << comm.rank()
                     << ": mass was lost or created";
}

// SparseSelection::known: ranges every rank transmits without any index on
// the wire (DEFT's whole pieces). Each rank selects a disjoint random set
// outside them (the same set on all ranks for `shared`), the known ranges are
// the same on all ranks; checked against a dense reference: out on U =
// (union of the I_q) + known, the residual (exact conservation), the
// transmitted positions, counts without the known positions, the union size
// with them, all ranks equal, and the bytes: for union and allgather exactly
// the formula with index bytes for the I_q only (no index traffic for the
// known ranges), and fewer bytes than listing the same positions as indices
// on one rank.
inline void check_known_ranges(Communicator& comm, ExchangePattern pattern,
                               SparseAllreduceAlgorithm algorithm, ValueEncoding values) {
  const int n = comm.size();
  const int r = comm.rank();
  const bool shared = pattern == ExchangePattern::kSharedIndices;
  const bool sends_union = shared || pattern == ExchangePattern::kUnionAllreduce;
  for (const std::size_t numel : {std::size_t{0}, std::size_t{5}, std::size_t{1000}}) {
    std::vector<Range> known;
    if (numel == 5) known = {{0, 2}, {2, 3}};  // adjacent ranges are fine
    if (numel == 1000) known = {{10, 60}, {200, 230}, {999, 1000}};
    std::vector<char> is_known(numel, 0);
    for (const Range& range : known) {
      for (std::size_t i = range.begin; i < range.end; ++i) is_known[i] = 1;
    }
    const ExchangeCase c{numel, shared ? SelectionKind::kShared : SelectionKind::kDisjoint,
                         InputKind::kExact, 0.05, 77};
    std::vector<std::vector<Index>> selections(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) {
      for (const Index i : selection_of(c, n, q)) {
        if (is_known[i] == 0) selections[static_cast<std::size_t>(q)].push_back(i);
      }
    }
    const std::string what = fmt::format(
        "{} ({}) values={} n={} rank={} d={}", exchange_pattern_name(pattern),
        sparse_allreduce_algorithm_name(algorithm), value_encoding_name(values), n, r, numel);
    // Reference: who sends what, the mean, the residual.
    std::vector<char> in_union = is_known;
    for (const auto& s : selections) {
      for (const Index i : s) in_union[i] = 1;
    }
    const auto sent_by = [&](int q, std::size_t i) {
      if (sends_union) return in_union[i] != 0;
      return is_known[i] != 0 || std::binary_search(selections[static_cast<std::size_t>(q)].begin(),
                                                    selections[static_cast<std::size_t>(q)].end(),
                                                    static_cast<Index>(i));
    };
    std::vector<float> expected_out(numel, 0.0f);
    std::vector<Index> expected_transmitted;
    std::size_t union_size = 0;
    for (std::size_t i = 0; i < numel; ++i) {
      float sum = 0.0f;
      for (int q = 0; q < n; ++q) {
        if (sent_by(q, i)) sum += sent_value(input_value(c, q, i), values);
      }
      expected_out[i] = sum / static_cast<float>(n);
      if (sent_by(r, i)) expected_transmitted.push_back(static_cast<Index>(i));
      union_size += in_union[i] != 0 ? 1 : 0;
    }

    ExchangeOptions options;
    options.values = values;
    options.sparse_algorithm = algorithm;
    const auto exchanger = make_sparse_exchange(pattern, options);
    SparseSelection selection;
    for (const Index i : selections[static_cast<std::size_t>(r)]) selection.indices.push_back(i);
    selection.known = known;
    std::vector<float> accumulated(numel);
    for (std::size_t i = 0; i < numel; ++i) accumulated[i] = input_value(c, r, i);
    const std::vector<float> before = accumulated;
    std::vector<float> out(numel, 12345.0f);
    ExchangeResult result;
    exchanger->exchange(comm, selection, accumulated, out, result);

    std::size_t bad_out = 0, bad_residual = 0;
    for (std::size_t i = 0; i < numel; ++i) {
      bad_out += out[i] == expected_out[i] ? 0 : 1;
      if (sent_by(r, i)) {
        const float t = sent_value(before[i], values);
        bad_residual += static_cast<double>(t) + static_cast<double>(accumulated[i]) ==
                                static_cast<double>(before[i])
                            ? 0
                            : 1;
      } else {
        bad_residual +=
            std::bit_cast<std::uint32_t>(accumulated[i]) == std::bit_cast<std::uint32_t>(before[i])
                ? 0
                : 1;
      }
    }
    EXPECT_EQ(bad_out, 0u) << what << ": outputs differ from the dense reference";
    EXPECT_EQ(bad_residual, 0u) << what << ": conservation broken";
    EXPECT_TRUE(std::equal(result.transmitted.begin(), result.transmitted.end(),
                           expected_transmitted.begin(), expected_transmitted.end()))
        << what << ": transmitted " << result.transmitted.size() << ", want "
        << expected_transmitted.size();
    std::vector<std::size_t> counts;
    for (const auto& s : selections) counts.push_back(s.size());
    EXPECT_EQ(result.counts, counts) << what << ": counts exclude the known positions";
    EXPECT_EQ(result.union_size, shared ? expected_transmitted.size() : union_size) << what;

    // Bytes: the known ranges never travel as indices.
    const std::size_t width = fixed_value_bytes(values);
    std::size_t known_count = 0;
    for (const Range& range : known) known_count += range.size();
    if (pattern == ExchangePattern::kUnionAllreduce ||
        pattern == ExchangePattern::kSparseAllgather) {
      EXPECT_EQ(result.index_bytes_raw, sizeof(Index) * selection.size()) << what;
      EXPECT_EQ(result.index_bytes_encoded, index_wire_bytes(selection.indices, true)) << what;
    }
    if (shared) {
      EXPECT_EQ(result.index_bytes_raw, 0u) << what;
    }
    if (n > 1 && pattern == ExchangePattern::kUnionAllreduce) {
      std::uint64_t expected = 24u * static_cast<std::uint64_t>(n - 1);
      for (int q = 0; q < n; ++q) {
        if (q != r) expected += index_wire_bytes(selections[static_cast<std::size_t>(q)], true);
      }
      if (values != ValueEncoding::kFloat32 && static_cast<std::size_t>(n) * width < 8) {
        expected += static_cast<std::uint64_t>(n - 1) * union_size * width;
      } else {
        expected += ring_bytes_sent(n, (r - 1 + n) % n, union_size, sizeof(float), 0, 0);
      }
      EXPECT_EQ(result.bytes_received, expected) << what;
    }
    if (n > 1 && pattern == ExchangePattern::kSparseAllgather) {
      std::uint64_t expected = 24u * static_cast<std::uint64_t>(n - 1);
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        const auto& s = selections[static_cast<std::size_t>(q)];
        expected += index_wire_bytes(s, true) + (s.size() + known_count) * width;
      }
      EXPECT_EQ(result.bytes_received, expected) << what;
    }
    // The same positions listed as indices by rank 0 cost index bytes.
    if (n > 1 && known_count > 0 && pattern == ExchangePattern::kUnionAllreduce) {
      SparseSelection listed;
      std::vector<Index> merged = selections[static_cast<std::size_t>(r)];
      if (r == 0) {
        for (std::size_t i = 0; i < numel; ++i) {
          if (is_known[i] != 0) merged.push_back(static_cast<Index>(i));
        }
        std::sort(merged.begin(), merged.end());
      }
      for (const Index i : merged) listed.indices.push_back(i);
      std::vector<float> a2(numel), out2(numel);
      for (std::size_t i = 0; i < numel; ++i) a2[i] = input_value(c, r, i);
      ExchangeResult listed_result;
      exchanger->exchange(comm, listed, a2, out2, listed_result);
      EXPECT_EQ(out2, out) << what << ": listing the known positions gives the same sum";
      if (r != 0) {
        EXPECT_GT(listed_result.bytes_received, result.bytes_received) << what;
      }
    }

    const std::array<std::uint64_t, 2> mine{hash_floats(out), result.union_size};
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(n));
    comm.allgather(bytes_of(std::span<const std::uint64_t>(mine)),
                   writable_bytes_of(std::span<std::uint64_t>(all)));
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(all[2 * static_cast<std::size_t>(q)], all[0]) << what << ": rank " << q;
      EXPECT_EQ(all[2 * static_cast<std::size_t>(q) + 1], all[1]) << what << ": rank " << q;
    }
  }
}

// Every rank passes an invalid argument, so every rank throws before any
// message (no desynchronization).
inline void check_exchange_rejects_invalid_arguments(Communicator& comm) {
  const auto exchanger = make_sparse_exchange(ExchangePattern::kUnionAllreduce, {});
  std::vector<float> a(10, 1.0f), out(10), short_out(9);
  ExchangeResult result;
  SparseSelection unsorted;
  unsorted.indices = {3, 2};
  EXPECT_THROW(exchanger->exchange(comm, unsorted, a, out, result), InvalidArgument);
  SparseSelection duplicate;
  duplicate.indices = {2, 2};
  EXPECT_THROW(exchanger->exchange(comm, duplicate, a, out, result), InvalidArgument);
  SparseSelection beyond;
  beyond.indices = {1, 10};
  EXPECT_THROW(exchanger->exchange(comm, beyond, a, out, result), InvalidArgument);
  SparseSelection fine;
  fine.indices = {1};
  EXPECT_THROW(exchanger->exchange(comm, fine, a, short_out, result), InvalidArgument);
  SparseSelection overlapping_known;
  overlapping_known.known = {{1, 4}, {3, 5}};
  EXPECT_THROW(exchanger->exchange(comm, overlapping_known, a, out, result), InvalidArgument);
  SparseSelection known_beyond;
  known_beyond.known = {{8, 11}};
  EXPECT_THROW(exchanger->exchange(comm, known_beyond, a, out, result), InvalidArgument);
  SparseSelection selected_in_known;
  selected_in_known.indices = {0, 5};
  selected_in_known.known = {{2, 3}, {4, 6}};
  EXPECT_THROW(exchanger->exchange(comm, selected_in_known, a, out, result), InvalidArgument);
  ExchangeOptions bad_factor;
  bad_factor.sparse_switch_factor = 0.0;
  EXPECT_THROW(make_sparse_exchange(ExchangePattern::kSparseAllreduce, bad_factor),
               InvalidArgument);
}

}  // namespace sparsecomm::testing
