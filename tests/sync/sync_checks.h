#pragma once
// Backend-agnostic checks of SparsifyExchangeStep: each function runs on one rank of
// a world and is called by every rank (same arguments, same order). The
// thread suite calls them inside run_thread_world, the MPI suite on
// mpi_world(). They use non-fatal EXPECTs only and never return early
// between collective calls, so a failure on one rank cannot desynchronize
// the world.
//
// The central check is error-feedback conservation, element by element and
// bit-exactly: for every rank and position,
//   decoded transmitted value + new residual == old residual + gradient
// where "old residual + gradient" is computed here in float the same way the
// memory does (e + g; DGC: v + (m*u + g)), and "decoded" is the value after
// the wire encoding's round trip (fp32: itself). A block-quantized value
// depends on its whole block, so there "decoded" is what the residual says
// was taken out (a - residual), and the stochastic codecs are held to one
// rounding of the residual instead of bit-exactness. The average the exchange returns is
// checked against the sum of every rank's decoded contributions: what a rank
// took out of its residual is what the others added.

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sync/sparsify_exchange_step.h"

namespace sparsecomm::testing {

struct SyncCase {
  std::string scheme;
  std::string exchange;            // pattern name
  std::string values = "fp32";     // a value_codec.h encoding
  std::vector<std::string> extra;  // more key=value options
};

std::string case_name(const SyncCase& c);
// gtest prints parameters with this.
inline void PrintTo(const SyncCase& c, std::ostream* os) { *os << case_name(c); }

inline std::string case_name(const SyncCase& c) {
  std::string name = c.scheme + "_" + c.exchange + "_" + c.values;
  for (const auto& e : c.extra) name += "_" + e;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

// Every registered scheme with every exchange pattern it allows, fp32 and
// fp16 values: the conservation sweep shared by the thread and MPI suites.
inline std::vector<SyncCase> scheme_pattern_cases() {
  struct Scheme {
    const char* name;
    bool shared;  // identical selections: the "shared" pattern is allowed
    std::vector<std::string> extra;
  };
  const Scheme schemes[] = {
      {"topk", false, {}},
      {"threshold", false, {"lambda=0.8"}},
      {"randomk", true, {}},
      {"dgc", false, {}},
      {"gaussiank", false, {}},
      {"cltk", true, {}},
      {"micro", false, {}},
      {"exdyna", false, {}},
      {"exdyna", false, {"controller=quota"}},
      {"exdyna-faithful", false, {}},
      {"deft", false, {}},
  };
  std::vector<SyncCase> cases;
  for (const Scheme& s : schemes) {
    std::vector<std::string> patterns = {"union", "allgather", "sparse-allreduce"};
    if (s.shared) patterns.emplace_back("shared");
    for (const auto& pattern : patterns) {
      for (const char* values : {"fp32", "fp16"})
        cases.push_back({s.name, pattern, values, s.extra});
    }
  }
  return cases;
}

inline SchemeOptions case_options(const SyncCase& c, const char* density = "density=0.05") {
  SchemeOptions options;
  // The dense quantizers send every coordinate and take no density.
  if (!find_scheme(c.scheme)->traits.every_coordinate) options.set(density);
  options.set("exchange=" + c.exchange);
  options.set("values=" + c.values);
  options.set("seed=17");
  // Conservation is the memories' promise for the steps the spike clip
  // leaves alone; these inputs would trip it at d = 1 (spike_clip_test.cc).
  options.set("clip_ratio=0");
  for (const auto& e : c.extra) options.set(e);
  return options;
}

// Uniform in [-1, 1): a pure function of (rank, step, i).
inline float sync_input(int rank, std::int64_t step, std::size_t i) {
  const Philox rng(static_cast<std::uint64_t>(rank) * 1000003u + static_cast<std::uint64_t>(step));
  const std::uint32_t bits = rng.block(i, 7)[0] >> 8;
  return static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f;
}

inline float wire_round_trip(float v, ValueEncoding encoding) {
  switch (encoding) {
    case ValueEncoding::kFloat16:
      return fp16_to_float(float_to_fp16(v));
    case ValueEncoding::kBFloat16:
      return bf16_to_float(float_to_bf16(v));
    default:
      return v;
  }
}

// Every rank's `mine`, in rank order (sizes may differ between ranks).
template <class T>
std::vector<std::vector<T>> gather_all(Communicator& comm, std::span<const T> mine) {
  const auto sizes = allgather_value<std::uint64_t>(comm, mine.size());
  std::vector<std::size_t> byte_counts;
  std::size_t total = 0;
  for (const auto s : sizes) {
    byte_counts.push_back(static_cast<std::size_t>(s) * sizeof(T));
    total += static_cast<std::size_t>(s);
  }
  std::vector<T> all(total);
  comm.allgatherv(bytes_of(mine), writable_bytes_of(std::span<T>(all)), byte_counts);
  std::vector<std::vector<T>> out;
  std::size_t offset = 0;
  for (const auto s : sizes) {
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(offset),
                     all.begin() + static_cast<std::ptrdiff_t>(offset + s));
    offset += static_cast<std::size_t>(s);
  }
  return out;
}

// A copy of the memory's accumulated buffer (the residual after a step).
// GradientMemory has no const accessor; this only reads.
inline std::vector<float> accumulated_copy(const SparsifyExchangeStep& sync) {
  const auto a = const_cast<GradientMemory&>(sync.memory()).accumulated();
  return {a.begin(), a.end()};
}

// DGC's u from the momentum memory's state (tag, u, v; see memory.cc).
inline std::vector<float> momentum_of(const GradientMemory& memory) {
  StateWriter writer;
  memory.save(writer);
  StateReader reader(writer.bytes());
  reader.expect_tag("memory.momentum");
  reader.value<std::uint8_t>();
  return reader.array<float>();
}

// Runs `steps` steps of the case on vectors of `numel` elements and checks
// conservation, the transmitted set, the average and the metrics.
inline void check_conservation(Communicator& comm, const SyncCase& c, std::size_t numel,
                               int steps) {
  const int n = comm.size();
  const int rank = comm.rank();
  SCOPED_TRACE(fmt::format("{} n={} rank={} d={}", case_name(c), n, rank, numel));
  SparsifyExchangeStep sync(make_scheme(c.scheme, case_options(c)));
  const std::string memory_kind(sync.memory().name());
  const ValueEncoding encoding = parse_value_encoding(c.values);
  const ExchangePattern pattern = sync.exchange_pattern();
  const bool union_like =
      pattern == ExchangePattern::kUnionAllreduce || pattern == ExchangePattern::kSharedIndices;
  float momentum = 0.9f;  // DGC's default unless the case sets it
  for (const auto& e : c.extra) {
    if (e.rfind("momentum=", 0) == 0) momentum = std::stof(e.substr(9));
  }
  std::vector<float> u_ref(numel, 0.0f);

  for (int step = 0; step < steps; ++step) {
    StepContext ctx;
    ctx.step = step;
    ctx.epoch = 0.5 * step;
    ctx.rank = rank;
    ctx.world = n;
    std::vector<float> gradient(numel);
    for (std::size_t i = 0; i < numel; ++i) gradient[i] = sync_input(rank, step, i);

    // old residual + gradient, in float, as the memory computes it.
    std::vector<float> old = accumulated_copy(sync);
    if (old.empty()) old.assign(numel, 0.0f);  // the memory is sized by its first step
    std::vector<float> a(numel);
    std::vector<float> u_new(numel);
    // Random-k's rescale: a = (d/k) g, the factor computed as the memory does.
    float rescale = 1.0f;
    if (std::find(c.extra.begin(), c.extra.end(), "rescale=true") != c.extra.end() && numel > 0) {
      rescale = static_cast<float>(static_cast<double>(numel) /
                                   static_cast<double>(target_count(0.05, numel)));
    }
    for (std::size_t i = 0; i < numel; ++i) {
      if (memory_kind == "momentum") {
        u_new[i] = momentum * u_ref[i] + gradient[i];
        a[i] = old[i] + u_new[i];
      } else if (memory_kind == "none") {
        a[i] = rescale * gradient[i];
      } else {
        a[i] = old[i] + gradient[i];
      }
    }

    const StepMetrics metrics = sync.synchronize(gradient, ctx, comm);
    const SparseSelection& selection = sync.last_selection();
    const std::vector<Index> mine(selection.indices.begin(), selection.indices.end());
    const auto transmitted_span = sync.last_exchange().transmitted;
    const std::vector<Index> transmitted(transmitted_span.begin(), transmitted_span.end());
    std::vector<float> residual = accumulated_copy(sync);
    EXPECT_EQ(residual.size(), numel);
    residual.resize(numel);

    // The selection: ascending, its values are a's.
    for (std::size_t j = 0; j < selection.size(); ++j) {
      EXPECT_TRUE(j == 0 || selection.indices[j - 1] < selection.indices[j]) << "not ascending";
      EXPECT_EQ(selection.values[j], a[selection.indices[j]])
          << "value at " << selection.indices[j];
    }

    // The known ranges (DEFT's whole pieces): the same on every rank.
    std::vector<Index> known;
    for (const Range& r : selection.known) {
      for (std::size_t i = r.begin; i < r.end; ++i) known.push_back(static_cast<Index>(i));
    }
    for (const auto& other : gather_all<Index>(comm, known)) {
      EXPECT_EQ(other, known) << "step " << step << ": ranks disagree on the known ranges";
    }

    // What this rank transmitted: its own selection, or the union of all;
    // with the known positions in both cases.
    const auto selections = gather_all<Index>(comm, mine);
    std::vector<Index> union_set = known;
    for (const auto& s : selections) union_set.insert(union_set.end(), s.begin(), s.end());
    std::sort(union_set.begin(), union_set.end());
    union_set.erase(std::unique(union_set.begin(), union_set.end()), union_set.end());
    std::vector<Index> mine_sent = mine;
    mine_sent.insert(mine_sent.end(), known.begin(), known.end());
    std::sort(mine_sent.begin(), mine_sent.end());
    EXPECT_EQ(transmitted, union_like ? union_set : mine_sent) << "step " << step;

    // Conservation, element by element.
    std::vector<char> sent(numel, 0);
    for (const Index i : transmitted) {
      if (i < numel) sent[i] = 1;
    }
    std::vector<float> contribution(numel, 0.0f);
    std::size_t mismatches = 0;
    std::string first;
    const bool block_codec = is_block_quantized(encoding);
    for (std::size_t i = 0; i < numel; ++i) {
      const float decoded = sent[i] == 0 ? 0.0f
                            : block_codec && memory_kind != "none"
                                ? a[i] - residual[i]
                                : wire_round_trip(a[i], encoding);
      contribution[i] = decoded;
      const float want = memory_kind == "none" ? 0.0f : a[i] - decoded;
      const bool within_one_rounding =
          !keeps_residual_exact(encoding) &&
          std::fabs(static_cast<double>(decoded) + residual[i] - a[i]) <=
              std::fabs(std::nextafter(residual[i], INFINITY) - residual[i]);
      const bool ok =
          (residual[i] == want && (memory_kind == "none" || decoded + residual[i] == a[i])) ||
          within_one_rounding;
      if (!ok) {
        if (mismatches == 0) {
          first = fmt::format("step {} i={} sent={} a={} decoded={} residual={} want={}", step, i,
                              sent[i] != 0, a[i], decoded, residual[i], want);
        }
        ++mismatches;
      }
    }
    EXPECT_EQ(mismatches, 0u) << "first: " << first;

    // DGC: u follows u = m*u + g and is masked where transmitted.
    if (memory_kind == "momentum") {
      for (std::size_t i = 0; i < numel; ++i) u_ref[i] = sent[i] != 0 ? 0.0f : u_new[i];
      EXPECT_EQ(momentum_of(sync.memory()), u_ref) << "step " << step;
      if (encoding == ValueEncoding::kFloat32) {
        for (const Index i : transmitted) EXPECT_EQ(residual[i], 0.0f) << "v at " << i;
      }
    }

    // The average: (1/n) * sum of every rank's decoded contribution.
    const auto contributions = gather_all<float>(comm, contribution);
    std::size_t wrong = 0;
    std::string first_wrong;
    for (std::size_t i = 0; i < numel; ++i) {
      double sum = 0.0;
      double magnitude = 0.0;
      for (const auto& r : contributions) {
        sum += r[i];
        magnitude += std::fabs(r[i]);
      }
      const double expected = sum / n;
      const double tolerance = 2e-6 * magnitude / n;
      const bool ok =
          magnitude == 0.0 ? gradient[i] == 0.0f : std::fabs(gradient[i] - expected) <= tolerance;
      if (!ok) {
        if (wrong == 0) {
          first_wrong =
              fmt::format("step {} i={} out={} expected={}", step, i, gradient[i], expected);
        }
        ++wrong;
      }
    }
    EXPECT_EQ(wrong, 0u) << "first: " << first_wrong;

    // Metrics.
    std::vector<std::size_t> counts;
    std::size_t max_count = 0;
    std::size_t total = 0;
    for (const auto& s : selections) {
      counts.push_back(s.size());
      max_count = std::max(max_count, s.size());
      total += s.size();
    }
    const std::size_t k = sync.sparsifier().target(numel, ctx);
    EXPECT_EQ(sync.last_exchange().counts, counts);
    EXPECT_EQ(metrics.step, step);
    EXPECT_EQ(metrics.numel, numel);
    EXPECT_EQ(metrics.target, k);
    EXPECT_EQ(metrics.selected, mine.size());
    EXPECT_EQ(metrics.union_size, union_set.size());
    EXPECT_DOUBLE_EQ(metrics.density_ratio,
                     k == 0 ? 0.0 : static_cast<double>(union_set.size()) / static_cast<double>(k));
    EXPECT_DOUBLE_EQ(metrics.imbalance, total == 0 ? 0.0
                                                   : static_cast<double>(n) *
                                                             static_cast<double>(max_count) /
                                                             static_cast<double>(total) -
                                                         1.0);
    double norm = 0.0;
    for (std::size_t i = 0; i < numel; ++i) norm += static_cast<double>(residual[i]) * residual[i];
    EXPECT_NEAR(metrics.residual_norm, std::sqrt(norm), 1e-9 * (1.0 + std::sqrt(norm)));
    EXPECT_FALSE(metrics.skipped_nonfinite);
    EXPECT_GE(metrics.accumulate_s, 0.0);
    EXPECT_GE(metrics.selection_s, 0.0);
    EXPECT_GE(metrics.exchange_s, 0.0);
  }
}

// Injects `bad_value` (NaN or inf) into the gradient of every rank in
// `bad_ranks` at step 1 and checks that all ranks handle it the same way:
// skip: every rank skips (gradient zeroed, memory untouched); stop: every
// rank throws NonFiniteGradient naming the bad ranks. Either way the world
// stays in step: the following step runs normally.
inline void check_nonfinite(Communicator& comm, NonFinitePolicy policy,
                            const std::vector<int>& bad_ranks, float bad_value) {
  const int rank = comm.rank();
  std::vector<int> bad;
  for (const int r : bad_ranks) {
    if (r < comm.size()) bad.push_back(r);
  }
  std::string bad_list;
  for (const int r : bad) bad_list += (bad_list.empty() ? "" : ", ") + std::to_string(r);
  SCOPED_TRACE(fmt::format("n={} rank={} bad={} value={}", comm.size(), rank, bad_list, bad_value));
  const std::size_t numel = 500;
  for (const char* scheme : {"topk", "dgc", "cltk"}) {
    SchemeOptions options;
    options.set("density=0.02");
    SparsifyExchangeStep sync(make_scheme(scheme, options), policy);
    for (int step = 0; step < 4; ++step) {
      StepContext ctx;
      ctx.step = step;
      std::vector<float> gradient(numel);
      for (std::size_t i = 0; i < numel; ++i) gradient[i] = sync_input(rank, step, i);
      const bool inject = step == 1 && std::find(bad.begin(), bad.end(), rank) != bad.end();
      if (inject) gradient[numel / 2] = bad_value;
      const std::vector<float> before = accumulated_copy(sync);
      bool threw = false;
      StepMetrics metrics;
      try {
        metrics = sync.synchronize(gradient, ctx, comm);
      } catch (const NonFiniteGradient& e) {
        threw = true;
        EXPECT_NE(std::string(e.what()).find("non-finite gradient"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("rank(s) " + bad_list + ";"), std::string::npos)
            << e.what();
      }
      const std::vector<float> after_copy = accumulated_copy(sync);
      const bool bad_step = step == 1 && !bad.empty();
      if (bad_step) {
        EXPECT_EQ(after_copy, before) << scheme << ": the memory changed on a bad step";
        if (policy == NonFinitePolicy::kStop) {
          EXPECT_TRUE(threw) << scheme;
        } else {
          EXPECT_FALSE(threw) << scheme;
          EXPECT_TRUE(metrics.skipped_nonfinite) << scheme;
          EXPECT_TRUE(
              std::all_of(gradient.begin(), gradient.end(), [](float v) { return v == 0.0f; }))
              << scheme << ": a skipped step must zero the gradient";
        }
      } else {
        EXPECT_FALSE(threw) << scheme << " step " << step;
        EXPECT_FALSE(metrics.skipped_nonfinite) << scheme << " step " << step;
        EXPECT_TRUE(std::all_of(gradient.begin(), gradient.end(),
                                [](float v) { return std::isfinite(v); }));
        EXPECT_GT(metrics.union_size, 0u) << scheme << " step " << step;
      }
    }
  }
}

// A crafted case for the metrics: hard threshold 1 with rank r holding r+1
// values of 10 at disjoint positions (0.001 elsewhere), so |I_r| = r+1,
// K = n(n+1)/2 and the imbalance is n*n / (n(n+1)/2) - 1 = (n-1)/(n+1).
// The union all-reduce sends every rank's value at all of U (10 from the
// owner, 0.001 from the others); the other patterns only the owner's.
inline void check_metrics_formulas(Communicator& comm, const std::string& exchange) {
  const int n = comm.size();
  const int rank = comm.rank();
  const std::size_t numel = 1000;
  SchemeOptions options;
  options.set("density=0.01");
  options.set("lambda=1");
  options.set("exchange=" + exchange);
  SparsifyExchangeStep sync(make_scheme("threshold", options));
  std::vector<float> gradient(numel, 0.001f);
  for (int j = 0; j <= rank; ++j) gradient[static_cast<std::size_t>(100 * rank + j)] = 10.0f;
  StepContext ctx;
  ctx.rank = rank;
  ctx.world = n;
  const StepMetrics m = sync.synchronize(gradient, ctx, comm);
  const auto expected_union = static_cast<std::size_t>(n * (n + 1) / 2);
  EXPECT_EQ(m.target, 10u);
  EXPECT_EQ(m.selected, static_cast<std::size_t>(rank + 1));
  EXPECT_EQ(m.union_size, expected_union);
  EXPECT_DOUBLE_EQ(m.density_ratio, static_cast<double>(expected_union) / 10.0);
  EXPECT_NEAR(m.imbalance, static_cast<double>(n - 1) / static_cast<double>(n + 1), 1e-12);
  // The residual keeps the small values everywhere except the sent ones.
  const bool union_like = exchange == "union";
  const std::size_t sent = union_like ? expected_union : static_cast<std::size_t>(rank + 1);
  const double kept = std::sqrt(static_cast<double>(numel - sent)) * static_cast<double>(0.001f);
  EXPECT_NEAR(m.residual_norm, kept, 1e-9);
  if (n > 1) {
    EXPECT_GT(m.bytes_sent, 0u);
    EXPECT_GT(m.bytes_received, 0u);
  }
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i <= j; ++i) {
      const float others = union_like ? static_cast<float>(n - 1) * 0.001f : 0.0f;
      EXPECT_FLOAT_EQ(gradient[static_cast<std::size_t>(100 * j + i)],
                      (10.0f + others) / static_cast<float>(n));
    }
  }
}

}  // namespace sparsecomm::testing
