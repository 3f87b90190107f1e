// The performance model against closed forms: the collectives' byte counts
// and times, the varint size law, the union law and its fit, the step
// model's terms, and the profile's JSON (docs/algorithms.md, "Performance
// model").

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "error_message.h"
#include "scratch_dir.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/perf/collective_cost.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/perf/measured_scaling.h"
#include "sparsecomm/perf/scheme_scaling.h"
#include "sparsecomm/perf/step_model.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sync/demo.h"

namespace sparsecomm::perf {
namespace {

using testing::error_message;
using testing::ScratchDir;

// Round numbers, so the closed forms below are easy to read.
CostProfile unit_profile() {
  CostProfile p;
  p.alpha_s = 1e-5;
  p.beta_s_per_byte = 1e-9;
  p.gamma_s_per_element = 1e-10;
  p.accumulate_s_per_element = 2e-10;
  p.update_s_per_element = 3e-10;
  p.select_s_per_element = {{"default", 5e-10}};
  return p;
}

// Tensor shapes for the methods priced from them (PowerSGD): a 1000 x 4000
// matrix; the rest of a scenario's d is taken as sent whole.
const std::vector<LayerSpan>& a_matrix() {
  static const std::vector<LayerSpan> tensors = {{"w", 0, 4'000'000, 1000}};
  return tensors;
}

TEST(CollectiveCost, RingAllreduceMovesTwiceTheBufferTimesNMinusOneOverN) {
  const CostProfile p = unit_profile();
  const double bytes = 4e6;
  for (int n : {2, 3, 4, 8, 64, 4096}) {
    const CommCost c = ring_allreduce(p, n, bytes);
    const double moved = 2.0 * (n - 1) / n * bytes;
    EXPECT_NEAR(c.bytes_sent, moved, 1e-6 * moved) << n;
    EXPECT_NEAR(c.bytes_received, moved, 1e-6 * moved) << n;
    EXPECT_DOUBLE_EQ(c.rounds, 2.0 * (n - 1));
    const double expected = 2.0 * (n - 1) * p.alpha_s + moved * p.beta_s_per_byte +
                            (n - 1.0) / n * bytes / 4 * p.gamma_s_per_element;
    EXPECT_NEAR(c.seconds, expected, 1e-9 * expected) << n;
  }
  EXPECT_EQ(ring_allreduce(p, 1, bytes).seconds, 0.0);
}

TEST(CollectiveCost, SkipReduceCarriesNMinusOneMinusSOfTheRingsReduceScatter) {
  const CostProfile p = unit_profile();
  const double bytes = 8e6;
  for (int n : {2, 4, 7, 16}) {
    const double allgather = (n - 1.0) / n * bytes;
    for (int s = 0; s < n; ++s) {
      const CommCost c = skip_reduce(p, n, s, bytes);
      const double scatter = c.bytes_sent - allgather;
      EXPECT_NEAR(scatter / allgather, double(n - 1 - s) / (n - 1), 1e-9) << n << " " << s;
      EXPECT_DOUBLE_EQ(c.rounds, (n - 1.0 - s) + (n - 1.0));
    }
    EXPECT_DOUBLE_EQ(skip_reduce(p, n, 0, bytes).seconds, ring_allreduce(p, n, bytes).seconds);
  }
  EXPECT_EQ(error_message<InvalidArgument>([&] { skip_reduce(p, 4, 4, bytes); }),
            "skip must be in [0, n-1] = [0, 3], got 4");
}

TEST(CollectiveCost, RecursiveDoublingTakesLog2PRoundsPlusTwoOffPowersOfTwo) {
  const CostProfile p = unit_profile();
  EXPECT_DOUBLE_EQ(recursive_doubling_allreduce(p, 1, 4096).rounds, 0.0);
  EXPECT_DOUBLE_EQ(recursive_doubling_allreduce(p, 8, 4096).rounds, 3.0);
  EXPECT_DOUBLE_EQ(recursive_doubling_allreduce(p, 6, 4096).rounds, 4.0);  // 2 + fold in/out
  EXPECT_DOUBLE_EQ(recursive_doubling_allreduce(p, 8, 4096).bytes_sent, 3.0 * 4096);
  EXPECT_EQ(largest_power_of_two(4095), 2048);
}

TEST(CollectiveCost, AnAllgathervRoundLastsAsLongAsItsLargestBlock) {
  const CostProfile p = unit_profile();
  const CommCost even = ring_allgatherv(p, 8, 1e5, 1e5);
  const CommCost skewed = ring_allgatherv(p, 8, 1e5, 3e5);
  EXPECT_DOUBLE_EQ(even.bytes_sent, skewed.bytes_sent);  // the same bytes in all
  EXPECT_NEAR(even.seconds, 7 * (p.alpha_s + 1e5 * p.beta_s_per_byte), 1e-15);
  EXPECT_NEAR(skewed.seconds, 7 * (p.alpha_s + 3e5 * p.beta_s_per_byte), 1e-15);
}

// A broadcast takes the algorithm Communicator::broadcast takes: a binomial
// tree (log2 n rounds of the whole buffer) for small blocks, a scatter and
// ring allgather (2(n-1) rounds of 1/n of it) from 16 KiB blocks on.
TEST(CollectiveCost, ABroadcastScattersAndAllgathersOnceItsBlocksAreLarge) {
  const CostProfile p = unit_profile();
  const double small = 8 * 16384.0 - 8;
  const CommCost tree = binomial_broadcast(p, 8, small);
  EXPECT_DOUBLE_EQ(tree.rounds, 3);
  EXPECT_NEAR(tree.seconds, 3 * (p.alpha_s + small * p.beta_s_per_byte), 1e-15);
  EXPECT_DOUBLE_EQ(broadcast(p, 8, small).seconds, tree.seconds);

  const double large = 8 * 16384.0 * 10;
  const CommCost scatter = broadcast(p, 8, large);
  EXPECT_DOUBLE_EQ(scatter.rounds, 14);
  EXPECT_NEAR(scatter.seconds, 14 * (p.alpha_s + large / 8 * p.beta_s_per_byte), 1e-15);
  // The root's n-1 blocks, then n-1 blocks per rank in the ring.
  EXPECT_NEAR(scatter.bytes_sent, 7.0 / 8 * large / 8 + 7.0 / 8 * large, 1e-6);
  EXPECT_DOUBLE_EQ(scatter.bytes_received, scatter.bytes_sent);
  // Predicted seconds of the unit profile, not a clock: 14 short rounds
  // against 3 of the whole buffer.
  EXPECT_LT(scatter.seconds, binomial_broadcast(p, 8, large).seconds);
  // Two ranks send the buffer once either way; one rank sends nothing.
  EXPECT_DOUBLE_EQ(broadcast(p, 2, large).seconds, p.alpha_s + large * p.beta_s_per_byte);
  EXPECT_DOUBLE_EQ(broadcast(p, 1, large).seconds, 0.0);
}

TEST(CollectiveCost, VarintIndicesFollowTheGeometricGapLaw) {
  // 1 byte plus P(gap - 1 >= 128) = (1 - c)^128 for the second byte, ...
  EXPECT_NEAR(varint_index_bytes(0.01), 1 + std::pow(0.99, 128) + std::pow(0.99, 16384), 1e-12);
  EXPECT_NEAR(varint_index_bytes(0.001), 1.88, 0.01);  // "~2 bytes at 0.1%" (algorithms.md)
  EXPECT_NEAR(varint_index_bytes(1.0), 1.0, 1e-9);
  EXPECT_GT(varint_index_bytes(1e-6), 2.9);
  EXPECT_THROW(varint_index_bytes(0.0), InvalidArgument);
  EXPECT_THROW(varint_index_bytes(1.5), InvalidArgument);
}

TEST(CollectiveCost, SparseAllgatherGrowsWithNAndTheUnionPatternDoesNot) {
  const CostProfile p = unit_profile();
  const double d = 1e8, k = 1e6;
  auto per_rank = [&](int n, bool partitioned) {
    SparseSend s{.index_bytes = 1.3, .value_bytes = 4, .numel = d};
    s.mean_count = s.max_count = partitioned ? k / n : k;
    s.union_count = k;
    return partitioned ? union_allreduce(p, n, s) : sparse_allgather(p, n, s);
  };
  // Allgather: each rank receives n - 1 blocks of k entries.
  EXPECT_NEAR(per_rank(16, false).bytes_received, 15 * (24 + k * 5.3), 1.0);
  // Union: the index blocks of k/n and a ring all-reduce of 4k bytes.
  const double union_bytes = 15 * (24 + 1.3 * k / 16) + 2.0 * 15 / 16 * 4 * k;
  EXPECT_NEAR(per_rank(16, true).bytes_sent, union_bytes, 1.0);
  EXPECT_GT(per_rank(64, false).bytes_sent / per_rank(8, false).bytes_sent, 8.0);
  EXPECT_LT(per_rank(64, true).bytes_sent / per_rank(8, true).bytes_sent, 1.2);
}

TEST(CollectiveCost, DecodingZeroesTheGradientAndScattersEveryEntryPastTheCache) {
  const CostProfile plain = unit_profile();  // no fill cost; every entry at gamma
  CostProfile p = plain;
  p.fill_s_per_element = 2e-10;
  p.scatter_s_per_element = 5e-9;
  p.cache_bytes = 1e6;  // 250,000 floats
  const double k = 1e4;
  for (const double d : {1e5, 1e8}) {  // in the cache, then far beyond it
    const double extra_per_entry = 4 * d > p.cache_bytes ? 5e-9 - 1e-10 : 0.0;
    SparseSend s{.index_bytes = 4, .value_bytes = 4, .numel = d};
    s.mean_count = s.max_count = k;
    s.union_count = 3 * k;
    // Allgather: the n blocks, then the division of the union's entries.
    EXPECT_NEAR(sparse_allgather(p, 8, s).seconds - sparse_allgather(plain, 8, s).seconds,
                d * 2e-10 + (8 * k + 3 * k) * extra_per_entry, 1e-12)
        << d;
    EXPECT_NEAR(union_allreduce(p, 8, s).seconds - union_allreduce(plain, 8, s).seconds,
                d * 2e-10 + 3 * k * extra_per_entry, 1e-12)
        << d;
    EXPECT_NEAR(shared_allreduce(p, 8, s).seconds - shared_allreduce(plain, 8, s).seconds,
                d * 2e-10 + k * extra_per_entry, 1e-12)
        << d;
  }
  // A profile that does not know its cache takes every gradient to fit.
  CostProfile unknown = p;
  unknown.cache_bytes = 0;
  EXPECT_DOUBLE_EQ(unknown.scatter_cost(1e12), unknown.gamma_s_per_element);
}

TEST(CollectiveCost, SendersPackTheirValuesAndGatheredListsAreDecodedAndMerged) {
  const CostProfile plain = unit_profile();  // none of these costs
  CostProfile p = plain;
  p.pack_s_per_element = 6e-9;
  p.index_decode_s_per_element = 2e-9;
  p.merge_s_per_element = 3e-9;
  p.cache_bytes = 1e6;  // 250,000 floats
  const double m = 1e4;
  for (const double d : {1e5, 1e8}) {  // in the cache (2 gamma a value), then beyond it
    const double pack = 4 * d > p.cache_bytes ? 6e-9 : 2e-10;
    for (const double index_bytes : {4.0, 1.3}) {  // raw, then varint: decoded
      SCOPED_TRACE(fmt::format("d {} index bytes {}", d, index_bytes));
      SparseSend s{.index_bytes = index_bytes, .value_bytes = 4, .numel = d};
      s.mean_count = s.max_count = m;
      s.union_count = 3 * m;
      const double decode = index_bytes < 4 ? 2e-9 : 0.0;
      // 8 ranks: 8 m entries in, 3 levels of merging.
      const double unite = 8 * m * (decode + 3 * 3e-9);
      EXPECT_NEAR(sparse_allgather(p, 8, s).seconds - sparse_allgather(plain, 8, s).seconds,
                  m * pack + unite, 1e-12);
      EXPECT_NEAR(union_allreduce(p, 8, s).seconds - union_allreduce(plain, 8, s).seconds,
                  3 * m * pack + unite, 1e-12);
      EXPECT_NEAR(shared_allreduce(p, 8, s).seconds - shared_allreduce(plain, 8, s).seconds,
                  m * pack, 1e-12);
      // 5 ranks merge in 3 levels too; 1 rank has nothing to merge.
      EXPECT_NEAR(sparse_allgather(p, 5, s).seconds - sparse_allgather(plain, 5, s).seconds,
                  m * pack + 5 * m * (decode + 3 * 3e-9), 1e-12);
      EXPECT_NEAR(sparse_allgather(p, 1, s).seconds - sparse_allgather(plain, 1, s).seconds,
                  m * pack + m * decode, 1e-12);
    }
  }
}

TEST(CollectiveCost, ListsInDisjointRangesAreConcatenatedNotMerged) {
  CostProfile p = unit_profile();
  p.merge_s_per_element = 3e-9;
  p.gamma_s_per_element = 5e-10;
  SparseSend s{.mean_count = 1e4,
               .max_count = 1e4,
               .union_count = 8e4,
               .index_bytes = 4,
               .value_bytes = 4,
               .numel = 1e7};
  SparseSend ranges = s;
  ranges.disjoint_ranges = true;
  // 8 ranks, 8 m entries: 3 merge levels against one copy.
  const double entries = 8 * 1e4;
  EXPECT_NEAR(union_allreduce(p, 8, s).seconds - union_allreduce(p, 8, ranges).seconds,
              entries * (3 * 3e-9 - 5e-10), 1e-12);
  EXPECT_DOUBLE_EQ(union_allreduce(p, 8, s).bytes_sent, union_allreduce(p, 8, ranges).bytes_sent);
}

TEST(CollectiveCost, SparcmlSplitSendsRangesDenseOnceTheyAreFull) {
  const CostProfile p = unit_profile();
  SparseSend s{.mean_count = 1e5,
               .max_count = 1e5,
               .union_count = 1e6,
               .index_bytes = 4,
               .value_bytes = 4,
               .numel = 1e6};
  // K = d: every reduced range is sent dense (4 d / n bytes each).
  const CommCost c = sparcml_split(p, 4, s);
  const double expected = 3 * 24 + 3 * 8 + 3 * 8 * 1e5 / 4 + 3 * 32 + 3 * 4e6 / 4;
  EXPECT_NEAR(c.bytes_sent, expected, 1.0);
}

// The model's bytes for Ok-Topk are the implementation's: 8 thread ranks,
// each selecting 2,000 random indices of 100,000, measured against
// ok_topk_allreduce (the survivors' count is m up to the owners' rounding,
// so within 1%); and they grow with m, not n m.
TEST(CollectiveCost, OkTopksBytesAreTheImplementationsAndGrowWithTheSelectionNotTheWorld) {
  constexpr int kRanks = 8;
  constexpr std::size_t kNumel = 100000;
  constexpr std::size_t kCount = 2000;
  std::vector<double> sent(kRanks, 0.0);
  run_thread_world(
      kRanks,
      [&](Communicator& comm) {
        const Philox rng(5);
        std::vector<Index> chosen;
        for (std::uint64_t j = 0; chosen.size() < kCount; ++j) {
          chosen.push_back(
              static_cast<Index>(rng.below(kNumel, static_cast<std::uint64_t>(comm.rank()), j)));
          std::sort(chosen.begin(), chosen.end());
          chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
        }
        SparseSelection selection;
        selection.indices.assign(chosen.begin(), chosen.end());
        std::vector<float> residual(kNumel, 1.0f);
        std::vector<float> out(kNumel);
        ExchangeResult result;
        make_sparse_exchange(ExchangePattern::kOkTopk, {})
            ->exchange(comm, selection, residual, out, result);
        sent[static_cast<std::size_t>(comm.rank())] = static_cast<double>(result.bytes_sent);
      },
      std::chrono::milliseconds(20000));
  const double measured = std::accumulate(sent.begin(), sent.end(), 0.0) / kRanks;
  const CostProfile p = unit_profile();
  const SparseSend s{.mean_count = kCount,
                     .max_count = kCount,
                     .union_count = kRanks * kCount,
                     .index_bytes = 4,
                     .value_bytes = 4,
                     .numel = kNumel};
  EXPECT_NEAR(ok_topk_allreduce(p, kRanks, s).bytes_sent, measured, 0.01 * measured);
  // Per rank: 176 (n - 1) bytes of counts (the 24-byte headers, the
  // histogram's ring all-reduce of 64 n bytes, three words to each peer)
  // and 16 m (n - 1) / n of pairs, whatever n is.
  const auto expected = [&](double n) { return 176 * (n - 1) + 16.0 * kCount * (n - 1) / n; };
  for (const int n : {8, 64, 4096})
    EXPECT_NEAR(ok_topk_allreduce(p, n, s).bytes_sent, expected(n), 1e-6 * expected(n)) << n;
  EXPECT_EQ(ok_topk_allreduce(p, 1, s).bytes_sent, 0.0);
}

TEST(CollectiveCost, TheParameterServersLinksBoundTheStepWhenServersAreFewer) {
  const CostProfile p = unit_profile();
  const double d = 1e7;
  const CommCost one = ps_bsp_step(p, 8, 1, d, 4 * d);
  const CommCost eight = ps_bsp_step(p, 8, 8, d, 4 * d);
  // A worker moves the same bytes; one server's link carries 8 shards each way.
  EXPECT_DOUBLE_EQ(one.bytes_received - 8, eight.bytes_received - 64);
  const double transfer_one = 2 * 8 * 4 * d * p.beta_s_per_byte;
  const double transfer_eight = 2 * 4 * d * p.beta_s_per_byte;
  const double server_work =
      (8 * d - d) * p.gamma_s_per_element + (d - d / 8) * p.update_s_per_element;
  EXPECT_NEAR(one.seconds - eight.seconds, transfer_one - transfer_eight + server_work, 1e-6);
  EXPECT_THROW(ps_bsp_step(p, 4, 0, d, 4 * d), InvalidArgument);
}

TEST(UnionLaw, OneRankIsOneSelectionAndTheUnionSaturates) {
  const UnionLaw law{.shared = 0.3, .pool = 5.0};
  EXPECT_DOUBLE_EQ(law.ratio(1), 1.0);
  EXPECT_NEAR(law.ratio(2), 0.3 + 5.0 * (1 - std::pow(1 - 0.7 / 5, 2)), 1e-12);
  EXPECT_NEAR(law.ratio(1e6), 5.3, 1e-9);
  for (double n = 1; n < 100; n += 1) EXPECT_LE(law.ratio(n), n + 1e-12);
  const UnionLaw identical{.shared = 1.0, .pool = 0.0};
  EXPECT_DOUBLE_EQ(identical.ratio(64), 1.0);
}

TEST(UnionLaw, TheFitRecoversTheLawThatMadeThePoints) {
  const UnionLaw truth{.shared = 0.4, .pool = 20.0};
  std::vector<double> ranks{1, 2, 4, 8, 16, 32, 64};
  std::vector<double> ratios;
  for (double n : ranks) ratios.push_back(truth.ratio(n));
  const UnionLaw fit = fit_union_law(ranks, ratios);
  for (double n : {128.0, 1024.0, 4096.0}) {
    EXPECT_NEAR(fit.ratio(n) / truth.ratio(n), 1.0, 0.02) << n;
  }
  const std::vector<double> too_big{1.0, 3.0};
  EXPECT_THROW(fit_union_law(std::vector<double>{1, 2}, too_big), InvalidArgument);
}

TEST(SchemeScaling, InterpolatesInLogNAndExtendsWithTheLaws) {
  const SchemeScaling partitioned(
      "p", false, 1000,
      {{.ranks = 2, .density_ratio = 1, .imbalance = 0.02, .read_share = 1.2},
       {.ranks = 8, .density_ratio = 1, .imbalance = 0.04, .read_share = 1.2}});
  EXPECT_NEAR(partitioned.at(4, 1000).imbalance, 0.03, 1e-12);  // halfway in log n
  // Past the last point: the counting law's ratio at the same K.
  const double expected = 0.04 * counting_imbalance(32, 1000) / counting_imbalance(8, 1000);
  EXPECT_NEAR(partitioned.at(32, 1000).imbalance, expected, 1e-12);
  EXPECT_NEAR(partitioned.at(4096, 1000).read_share, 1.2, 1e-12);  // a fixed share of d/n

  const SchemeScaling whole("w", true, 1000,
                            {{.ranks = 4, .density_ratio = 3.0, .read_share = 4},
                             {.ranks = 8, .density_ratio = 5.0, .read_share = 8}});
  EXPECT_NEAR(whole.at(64, 1000).read_share, 64, 1e-9);  // every rank reads d
  EXPECT_GT(whole.at(64, 1000).density_ratio, 5.0);
  EXPECT_LE(whole.at(64, 1000).density_ratio, 64.0);
  EXPECT_THROW(SchemeScaling("bad", false, 1, {{.ranks = 4}, {.ranks = 2}}), InvalidArgument);
}

TEST(SchemeScaling, EveryBuiltInSchemeStaysWithinWhatAUnionCanBe) {
  for (const char* scheme : {"topk", "dgc", "gaussiank", "micro", "exdyna", "deft"}) {
    for (double density : {0.01, 0.001}) {
      const SchemeScaling& s = builtin_scaling(scheme, density);
      for (int n : {2, 4, 64, 512, 4096}) {
        const ScalingPoint point = s.at(n, 1e6);
        EXPECT_GT(point.density_ratio, 0.0) << scheme << " " << n;
        EXPECT_LE(point.density_ratio, n * point.selected_ratio * (1 + 1e-9)) << scheme << " " << n;
        EXPECT_GE(point.imbalance, 0.0);
        EXPECT_GT(point.read_share, 0.0);
      }
    }
  }
  EXPECT_THROW(builtin_scaling("no-such", 0.01), InvalidArgument);
}

// A scheme added to the registry is priced from its traits; the model then
// needs its measured statistics (builtin_scaling.cc) and its selection cost
// (cost_profile.cc), or the traits must say why it cannot be priced.
TEST(StepModel, EveryRegisteredSchemeIsPricedOrSaysWhyNot) {
  const CostProfile p = network_profile(10, 5);
  const std::vector<std::string>& modeled = modeled_methods();
  for (const SchemeInfo& info : scheme_registry()) {
    SCOPED_TRACE(info.name);
    const bool listed = std::find(modeled.begin(), modeled.end(), info.name) != modeled.end();
    if (!info.traits.unpriced_because.empty()) {
      EXPECT_FALSE(listed);
      const std::string message =
          error_message([&] { predict_step(info.name, {.ranks = 4, .numel = 1e6}, p); });
      EXPECT_NE(message.find(info.traits.unpriced_because), std::string::npos) << message;
      continue;
    }
    EXPECT_TRUE(listed);
    // The dense quantizers select nothing (every coordinate, a known range),
    // and save bytes only where an all-gather of their codes moves fewer than
    // the float32 ring (n E(d) < 8d: below 28 ranks for int2, 51 for sign).
    const bool every_coordinate = info.traits.every_coordinate;
    EXPECT_TRUE(every_coordinate || p.select_s_per_element.contains(info.name))
        << "no default selection cost";
    for (const double density : {0.01, 0.001}) {
      for (const int n : {2, 64}) {
        const Scenario s{.ranks = n, .numel = 1e8, .density = density, .compute_s = 0.1};
        const StepPrediction x = predict_step(info.name, s, p);
        EXPECT_GT(x.exchange_s, 0.0);
        EXPECT_EQ(x.selection_s > 0.0, !every_coordinate);
        // below the dense ring's 2 (n-1)/n d floats
        if (!every_coordinate || n == 2) {
          EXPECT_LT(x.bytes_sent, 4e8);
        }
        if (has_scheme_statistics(info.name)) {
          EXPECT_EQ(x.statistics, "built-in");
        }
      }
    }
  }
}

TEST(StepModel, DenseIsComputePlusTheRingPlusTheUpdate) {
  const CostProfile p = unit_profile();
  Scenario s{.ranks = 8, .numel = 1e7, .density = 0.01, .compute_s = 0.1};
  const StepPrediction dense = predict_step("dense", s, p);
  EXPECT_DOUBLE_EQ(dense.exchange_s, ring_allreduce(p, 8, 4e7).seconds);
  EXPECT_DOUBLE_EQ(dense.step_s, 0.1 + dense.exchange_s + 1e7 * p.update_s_per_element);
  EXPECT_DOUBLE_EQ(dense.bytes_sent, 2.0 * 7 / 8 * 4e7);
  s.ranks = 1;
  EXPECT_EQ(predict_step("dense", s, p).exchange_s, 0.0);
}

// Dense with values=fp16 or bf16 (train's -m dense -o values=fp16): the ring
// carries 16-bit partial sums, half the bytes; a sparse codec leaves it fp32.
TEST(StepModel, DenseOnASixteenBitWireSendsHalfTheBytes) {
  const CostProfile p = unit_profile();
  Scenario s{.ranks = 8, .numel = 1e7, .density = 0.01, .compute_s = 0.1};
  s.values = ValueEncoding::kFloat16;
  EXPECT_DOUBLE_EQ(predict_step("dense", s, p).exchange_s, ring_allreduce(p, 8, 2e7).seconds);
  EXPECT_DOUBLE_EQ(predict_step("dense", s, p).bytes_sent, 2.0 * 7 / 8 * 2e7);
  s.values = ValueEncoding::kBFloat16;
  EXPECT_DOUBLE_EQ(predict_step("dense", s, p).bytes_sent, 2.0 * 7 / 8 * 2e7);
  s.values = ValueEncoding::kInt8;
  EXPECT_DOUBLE_EQ(predict_step("dense", s, p).bytes_sent, 2.0 * 7 / 8 * 4e7);
}

TEST(StepModel, AMessagesFramingIsTheLargerOfItsPerMessageAndPerByteFigures) {
  CostProfile p = unit_profile();
  Scenario s{.ranks = 8, .numel = 1e7, .density = 0.01, .compute_s = 0.1};
  s.tensors = a_matrix();
  EXPECT_DOUBLE_EQ(predict_step("dense", s, p).wire_bytes_sent,
                   predict_step("dense", s, p).bytes_sent);
  p.wire_bytes_per_message = 100;
  p.wire_overhead_per_byte = 0.05;
  // The ring: 2(n-1) messages of 5 MB, each framed by its per-byte share
  // (which holds its first packet's headers and an acknowledgement).
  const StepPrediction dense = predict_step("dense", s, p);
  EXPECT_DOUBLE_EQ(dense.bytes_sent, 2.0 * 7 / 8 * 4e7);
  EXPECT_DOUBLE_EQ(dense.wire_bytes_sent, 1.05 * 2.0 * 7 / 8 * 4e7);
  // The agreement: n-1 messages of one byte, each a packet and its
  // acknowledgement; a 2,000-byte message is where the two figures meet.
  EXPECT_DOUBLE_EQ(nonfinite_agreement(p, 8).wire_bytes_sent, 7 * (1 + 100.0));
  EXPECT_DOUBLE_EQ(ring_allgatherv(p, 8, 2000, 2000).wire_bytes_sent, 7 * 2100.0);
  EXPECT_DOUBLE_EQ(ring_allgatherv(p, 8, 8000, 8000).wire_bytes_sent, 7 * 8400.0);
  // A broadcast: every rank but the root receives one message.
  EXPECT_DOUBLE_EQ(binomial_broadcast(p, 8, 10).wire_bytes_sent, 7.0 / 8 * 110);
  // Every method's wire bytes hold its payload's per-byte framing at least,
  // and its short messages' framing on top.
  for (const std::string& method : modeled_methods()) {
    SCOPED_TRACE(method);
    const StepPrediction m = predict_step(method, s, p);
    EXPECT_GE(m.wire_bytes_sent, 1.05 * m.bytes_sent - 1e-6);
    EXPECT_GT(m.wire_bytes_sent - m.bytes_sent, 99.0);
  }
}

TEST(StepModel, EveryMethodsTermsAddUpToItsStep) {
  const CostProfile p = network_profile(10, 5);
  for (int n : {2, 16, 4096}) {
    Scenario s{
        .ranks = n, .numel = 3.5e8, .density = 0.001, .compute_s = 0.3, .bucket_bytes = 25 << 20};
    s.tensors = a_matrix();
    for (const std::string& method : modeled_methods()) {
      const StepPrediction x = predict_step(method, s, p);
      EXPECT_NEAR(
          x.step_s,
          x.compute_s + x.accumulate_s + x.selection_s + x.exchange_s - x.overlap_s + x.update_s,
          1e-12)
          << method;
      EXPECT_GE(x.overlap_s, 0.0);
      EXPECT_LE(x.overlap_s, s.backward_share * s.compute_s + 1e-12) << method;
      EXPECT_GT(x.bytes_sent, 0.0) << method << " " << n;
    }
  }
}

TEST(StepModel, SparseStepsPayTheNonFiniteAgreementDenseDoesNot) {
  const CostProfile p = unit_profile();
  // One byte from each rank around the ring: n-1 latency-bound rounds.
  EXPECT_DOUBLE_EQ(nonfinite_agreement(p, 8).seconds, 7 * (p.alpha_s + p.beta_s_per_byte));
  EXPECT_DOUBLE_EQ(nonfinite_agreement(p, 8).bytes_sent, 7.0);
  const Scenario s{.ranks = 8, .numel = 1e6, .density = 0.01};
  const double k = 1e4;
  const StepPrediction randomk = predict_step("randomk", s, p);
  const SparseSend shared{.mean_count = k, .max_count = k, .union_count = k, .numel = 1e6};
  EXPECT_DOUBLE_EQ(randomk.exchange_s,
                   nonfinite_agreement(p, 8).seconds + shared_allreduce(p, 8, shared).seconds);
  EXPECT_DOUBLE_EQ(randomk.agreement_s, nonfinite_agreement(p, 8).seconds);
  EXPECT_DOUBLE_EQ(predict_step("dense", s, p).exchange_s, ring_allreduce(p, 8, 4e6).seconds);
}

TEST(StepModel, TensorsSentDenselyAreARingAllReduceBesideTheMethodOnTheRest) {
  const CostProfile p = network_profile(10, 5);
  for (const double bucket_bytes : {0.0, 4e6}) {
    Scenario with{.ranks = 8,
                  .numel = 1e7,
                  .dense_numel = 2e6,
                  .density = 0.01,
                  .compute_s = 0.1,
                  .bucket_bytes = bucket_bytes};
    with.tensors = a_matrix();  // of the method's 8e6
    // The method alone on the other tensors, in the same number of buckets.
    Scenario rest = with;
    rest.numel = 8e6;
    rest.dense_numel = 0;
    rest.bucket_bytes = bucket_bytes * 0.8;
    for (const std::string& method : modeled_methods()) {
      SCOPED_TRACE(method + (bucket_bytes > 0 ? ", pipelined" : ""));
      const StepPrediction x = predict_step(method, with, p);
      if (method == "dense" || method == "ps") {  // every parameter dense anyway
        Scenario plain = with;
        plain.dense_numel = 0;
        EXPECT_DOUBLE_EQ(x.step_s, predict_step(method, plain, p).step_s);
        continue;
      }
      const StepPrediction alone = predict_step(method, rest, p);
      const double buckets = bucket_bytes > 0 && alone.overlap_s > 0 ? 10 : 1;
      const CommCost ring = ring_allreduce(p, 8, 4 * 2e6 / buckets) * buckets;
      EXPECT_NEAR(x.exchange_s, alone.exchange_s + ring.seconds, 1e-12);
      EXPECT_NEAR(x.bytes_sent, alone.bytes_sent + ring.bytes_sent, 1e-6);
      EXPECT_DOUBLE_EQ(x.selection_s, alone.selection_s);  // k = c (d - dense)
      EXPECT_DOUBLE_EQ(x.accumulate_s, alone.accumulate_s);
      EXPECT_DOUBLE_EQ(x.update_s, 1e7 * p.update_s_per_element);  // every parameter
    }
  }
  Scenario all{.ranks = 8, .numel = 1e7, .dense_numel = 1e7};
  EXPECT_NE(error_message<InvalidArgument>([&] {
              predict_step("topk", all, p);
            }).find("sent densely beside the method must be in [0, 1e+07)"),
            std::string::npos);
}

// PowerSGD: the matrices whose rank-r factors are smaller than them are
// factorized (P's R r floats in the first ring all-reduce, Q's C r in the
// second), everything else rides whole in the first; its arithmetic is
// R C (a + b r) per factorized tensor, its accumulate one pass over them.
TEST(StepModel, PowerSgdIsPricedFromTheTensorsShapes) {
  CostProfile p = unit_profile();
  p.low_rank_s_per_element = 4e-10;
  p.low_rank_s_per_element_rank = 6e-10;
  const std::vector<LayerSpan> tensors = {
      {"fc1.weight", 0, 1000 * 500, 1000},     // factorized: 4 (1000 + 500) < 500,000
      {"fc1.bias", 500000, 1000, 0},           // a vector: whole
      {"conv.weight", 501000, 3 * 9, 3},       // 3 x 9: rank 3, 3 (3 + 9) > 27: whole
      {"fc2.weight", 501027, 10 * 1000, 10}};  // rank 4: 4 (10 + 1000) < 10,000
  const double numel = 600000;                 // 88,973 more, outside the tensors: whole
  Scenario s{.ranks = 8, .numel = numel, .compute_s = 0.1};
  s.tensors = tensors;
  s.low_rank = 4;
  const StepPrediction x = predict_step("powersgd", s, p);
  const double first = 1000 * 4 + 1000 + 27 + 10 * 4 + (numel - 511027);
  const double second = 500 * 4 + 1000 * 4;
  const CommCost expected = nonfinite_agreement(p, 8) + ring_allreduce(p, 8, 4 * first) +
                            ring_allreduce(p, 8, 4 * second);
  EXPECT_DOUBLE_EQ(x.exchange_s, expected.seconds);
  EXPECT_DOUBLE_EQ(x.bytes_sent, expected.bytes_sent);
  const double factorized = 500000 + 10000;
  EXPECT_DOUBLE_EQ(x.selection_s, factorized * (4e-10 + 4 * 6e-10));
  EXPECT_DOUBLE_EQ(x.accumulate_s, factorized * p.accumulate_s_per_element);
  // The factors shrink with r: rank 1 sends less than rank 4, and both far
  // less than the dense ring.
  s.low_rank = 1;
  EXPECT_LT(predict_step("powersgd", s, p).bytes_sent, x.bytes_sent);
  EXPECT_LT(x.bytes_sent, 0.25 * predict_step("dense", s, p).bytes_sent);
  EXPECT_TRUE(needs_tensor_shapes("powersgd"));
  EXPECT_FALSE(needs_tensor_shapes("topk"));

  // No shapes, more tensors than parameters, a rank below 1: refused.
  EXPECT_NE(error_message<InvalidArgument>([&] {
              predict_step("powersgd", Scenario{.numel = 1e6}, p);
            }).find("powersgd's cost depends on the tensors' shapes"),
            std::string::npos);
  s.numel = 500000;
  EXPECT_NE(error_message<InvalidArgument>([&] {
              predict_step("powersgd", s, p);
            }).find("hold 511027 elements, more than the 500000 parameters"),
            std::string::npos);
  s.numel = numel;
  s.low_rank = 0;
  EXPECT_EQ(error_message<InvalidArgument>([&] { predict_step("powersgd", s, p); }),
            "PowerSGD's rank must be >= 1, got 0");
}

// DeMo at its defaults: an all-gather of one message per rank (a chunk of
// 64's largest coefficient and its 6-bit position, per chunk of each
// tensor), and two DCTs of chunk multiply-adds per element.
TEST(StepModel, DeMoIsPricedAsAnAllGatherOfItsMessage) {
  CostProfile p = unit_profile();
  p.low_rank_s_per_element_rank = 6e-10;
  const std::vector<LayerSpan> tensors = {{"w", 0, 1000 * 64, 1000}, {"b", 0, 100, 0}};
  Scenario s{.ranks = 8, .numel = 64100, .compute_s = 0.1};
  s.tensors = tensors;
  s.values = ValueEncoding::kLloyd2;
  const StepPrediction x = predict_step("demo", s, p);
  const std::vector<LayerSpan> laid = {{"w", 0, 64000, 1000}, {"b", 64000, 100, 0}};
  const auto message =
      static_cast<double>(demo_message_bytes(64100, laid, 64, 1, ValueEncoding::kLloyd2));
  EXPECT_EQ(message, static_cast<double>(encoded_value_bytes(ValueEncoding::kLloyd2, 1000 + 2) +
                                         (1002 * 6 + 7) / 8));
  const CommCost expected = nonfinite_agreement(p, 8) + ring_allgatherv(p, 8, message, message);
  EXPECT_DOUBLE_EQ(x.exchange_s, expected.seconds);
  EXPECT_DOUBLE_EQ(x.bytes_sent, expected.bytes_sent);
  EXPECT_DOUBLE_EQ(x.selection_s, 2.0 * 64100 * 64 * 6e-10);
  // Without shapes: the parameters as one tensor (1002 chunks as well here).
  s.tensors = {};
  EXPECT_DOUBLE_EQ(predict_step("demo", s, p).bytes_sent, expected.bytes_sent);
  // Far below the dense ring; refused with local steps, as train refuses it.
  EXPECT_LT(x.bytes_sent, 0.05 * predict_step("dense", s, p).bytes_sent);
  EXPECT_FALSE(takes_local_steps("demo"));
  EXPECT_TRUE(takes_local_steps("topk"));
  s.local_steps = 4;
  EXPECT_NE(error_message<InvalidArgument>([&] {
              predict_step("demo", s, p);
            }).find("refuses it with --local-steps"),
            std::string::npos);
}

TEST(StepModel, TheExpectedMaximumOfNormalsMatchesItsClosedForms) {
  EXPECT_EQ(expected_max_of_normals(1), 0.0);
  const double root_pi = std::sqrt(std::numbers::pi);
  EXPECT_NEAR(expected_max_of_normals(2), 1.0 / root_pi, 1e-9);
  EXPECT_NEAR(expected_max_of_normals(3), 1.5 / root_pi, 1e-9);
  // n = 4 and 5: (3/sqrt(pi)) (1/2 + asin(1/3)/pi) and (5/(4 sqrt(pi)))
  // (1 + 6 asin(1/3)/pi).
  const double asin_third = std::asin(1.0 / 3.0);
  EXPECT_NEAR(expected_max_of_normals(4), 3.0 / root_pi * (0.5 + asin_third / std::numbers::pi),
              1e-9);
  EXPECT_NEAR(expected_max_of_normals(5),
              1.25 / root_pi * (1.0 + 6.0 * asin_third / std::numbers::pi), 1e-9);
  // It grows like sqrt(2 ln n), from below.
  double previous = 0.0;
  for (int n : {8, 64, 512, 4096, 1 << 20}) {
    const double e = expected_max_of_normals(n);
    EXPECT_GT(e, previous) << n;
    EXPECT_LT(e, std::sqrt(2.0 * std::log(n))) << n;
    EXPECT_GT(e, 0.6 * std::sqrt(2.0 * std::log(n))) << n;
    previous = e;
  }
  EXPECT_THROW(expected_max_of_normals(0), InvalidArgument);
}

TEST(StepModel, EveryMethodWaitsForTheSlowestRanksCompute) {
  const CostProfile p = network_profile(10, 5);
  for (int n : {1, 4, 4096}) {
    Scenario s{.ranks = n, .numel = 2.5e7, .density = 0.01, .compute_s = 0.2, .servers = 4};
    s.tensors = a_matrix();
    for (const std::string& method : modeled_methods()) {
      const StepPrediction still = predict_step(method, s, p);
      s.compute_spread_s = 0.01;
      const StepPrediction spread = predict_step(method, s, p);
      s.compute_spread_s = 0.0;
      const double wait = 0.01 * expected_max_of_normals(n);
      EXPECT_EQ(still.arrival_wait_s, 0.0) << method;
      EXPECT_DOUBLE_EQ(spread.arrival_wait_s, wait) << method << " " << n;
      EXPECT_NEAR(spread.exchange_s - still.exchange_s, wait, 1e-12) << method << " " << n;
      EXPECT_NEAR(spread.step_s - still.step_s, wait, 1e-12) << method << " " << n;
    }
  }
  EXPECT_EQ(error_message<InvalidArgument>(
                [&] { predict_step("dense", Scenario{.numel = 10, .compute_spread_s = -1}, p); }),
            "the compute time's spread must be a finite number >= 0, got -1");
}

// Local steps: one synchronization per H steps, per inner step its terms
// and bytes over H, the arrival wait over sqrt(H), one more update pass
// over H; pipelining is off; the parameter server is refused.
TEST(StepModel, LocalStepsAmortizeOneSynchronizationOverARound) {
  const CostProfile p = network_profile(10, 5);
  for (const std::string& method : modeled_methods()) {
    if (!takes_local_steps(method)) continue;
    Scenario s{
        .ranks = 8, .numel = 2.5e7, .density = 0.01, .compute_s = 0.2, .compute_spread_s = 0.01};
    s.tensors = a_matrix();
    const StepPrediction every = predict_step(method, s, p);
    s.local_steps = 16;
    s.bucket_bytes = 1 << 20;  // ignored: a round synchronizes after its last step
    const StepPrediction local = predict_step(method, s, p);
    const double wait = 0.01 * expected_max_of_normals(8);
    EXPECT_DOUBLE_EQ(local.arrival_wait_s, wait / 4) << method;
    EXPECT_NEAR(local.exchange_s, (every.exchange_s - wait) / 16 + wait / 4, 1e-12) << method;
    EXPECT_DOUBLE_EQ(local.bytes_sent, every.bytes_sent / 16) << method;
    EXPECT_DOUBLE_EQ(local.selection_s, every.selection_s / 16) << method;
    EXPECT_DOUBLE_EQ(local.update_s, every.update_s * (1 + 1.0 / 16)) << method;
    EXPECT_EQ(local.overlap_s, 0.0) << method;
    EXPECT_EQ(local.compute_s, every.compute_s) << method;
    EXPECT_LT(local.step_s, every.step_s) << method;
  }
  const Scenario ps{.numel = 1e6, .local_steps = 4};
  EXPECT_NE(error_message<InvalidArgument>([&] {
              predict_step("ps", ps, p);
            }).find("parameter-server workers push every step"),
            std::string::npos);
  EXPECT_EQ(error_message<InvalidArgument>(
                [&] { predict_step("dense", Scenario{.numel = 10, .local_steps = -1}, p); }),
            "local steps must be >= 0, got -1");
}

// Overlapped rounds hide a round's exchange behind the next round's compute:
// all of it when a round computes longer (slow compute), one step's compute
// per step otherwise (a slow link); the arrival wait and host work stay.
TEST(StepModel, OverlappedRoundsHideTheExchangeUpToTheComputeOfARound) {
  const CostProfile p = network_profile(0.05, 5);  // 50 Mbit/s
  Scenario s{.ranks = 8,
             .numel = 2.5e7,
             .density = 0.01,
             .compute_s = 0.2,
             .compute_spread_s = 0.01,
             .local_steps = 32};
  const StepPrediction waits = predict_step("exdyna", s, p);
  s.overlap_rounds = true;
  const StepPrediction hides = predict_step("exdyna", s, p);
  const double network_s = waits.exchange_s - waits.arrival_wait_s;
  EXPECT_DOUBLE_EQ(hides.overlap_s, std::min(0.2, network_s));
  EXPECT_DOUBLE_EQ(hides.step_s, waits.step_s - hides.overlap_s);
  s.compute_s = 1e-4;  // the exchange outlasts a round: only compute's worth hides
  EXPECT_DOUBLE_EQ(predict_step("dense", s, p).overlap_s, 1e-4);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              predict_step("dense", Scenario{.numel = 10, .overlap_rounds = true}, p);
            }).find("overlapped rounds need local steps"),
            std::string::npos);
}

TEST(StepModel, ExDynasBytesStayFlatWhereTopKsGrowWithN) {
  const CostProfile p = network_profile(25, 5);
  auto bytes = [&](const char* method, int n) {
    return predict_step(method, Scenario{.ranks = n, .numel = 2.5e7, .density = 0.01}, p)
        .bytes_sent;
  };
  EXPECT_GT(bytes("topk", 512) / bytes("topk", 8), 30.0);
  EXPECT_LT(bytes("exdyna", 512) / bytes("exdyna", 8), 1.5);
}

// Scenario::exchange prices the schemes that select per rank with another
// pattern (train's -o exchange=): Top-k on Ok-Topk keeps its bytes at O(k)
// per rank where its own allgather grows with n; the schemes that cannot
// take it keep their own; shared, and ok-topk on quantized values, are
// refused.
TEST(StepModel, AnExchangePatternRepricesTheSchemesThatTakeIt) {
  const CostProfile p = network_profile(25, 5);
  auto step = [&](const char* method, int n, std::optional<ExchangePattern> exchange) {
    return predict_step(
        method, Scenario{.ranks = n, .numel = 2.5e7, .density = 0.01, .exchange = exchange}, p);
  };
  const StepPrediction own = step("topk", 512, std::nullopt);
  const StepPrediction ok = step("topk", 512, ExchangePattern::kOkTopk);
  EXPECT_EQ(own.exchange, "sparse allgather");
  EXPECT_EQ(ok.exchange, "ok-topk");
  EXPECT_GT(own.bytes_sent / ok.bytes_sent, 100.0);
  EXPECT_LT(ok.bytes_sent, 2.2 * 8 * 0.01 * 2.5e7);  // 16 m and the counts
  EXPECT_EQ(step("exdyna", 512, ExchangePattern::kSparseAllgather).exchange, "allgather");
  EXPECT_EQ(step("exdyna", 512, ExchangePattern::kUnionAllreduce).exchange, "union all-reduce");
  EXPECT_EQ(step("deft", 512, ExchangePattern::kOkTopk).exchange, "union all-reduce");
  EXPECT_EQ(step("randomk", 512, ExchangePattern::kOkTopk).exchange, "shared all-reduce");
  const StepPrediction split = step("topk", 512, ExchangePattern::kSparseAllreduce);
  EXPECT_EQ(split.exchange, "sparse-allreduce");
  EXPECT_LT(split.bytes_sent, own.bytes_sent);
  EXPECT_NE(error_message([&] {
              step("topk", 8, ExchangePattern::kSharedIndices);
            }).find("shared pattern is the shared schemes' own"),
            std::string::npos);
  Scenario int4{.ranks = 8, .numel = 1e6, .exchange = ExchangePattern::kOkTopk};
  int4.values = ValueEncoding::kInt4;
  EXPECT_NE(error_message([&] { predict_step("topk", int4, p); }).find("fp32 values"),
            std::string::npos);
}

// A `bench sparsifiers --format json` row with the fields the model reads.
nlohmann::json bench_row(const std::string& scheme, int n, double ratio, double selected,
                         double imbalance) {
  return {{"scheme", scheme},
          {"numel", 100000},
          {"density", 0.01},
          {"workers", n},
          {"density_ratio_mean", ratio},
          {"selected_mean", selected},
          {"imbalance_mean", imbalance},
          {"read_share", nullptr},
          {"selection_collectives_mean", 0.0}};
}

TEST(MeasuredScaling, BenchRowsReplaceTheBuiltInStatisticsOfTheirSchemes) {
  // Top-k on a trace: each rank selects 1.2 k, the union 2 k at n = 4.
  const std::vector<BenchRows> inputs = {
      {"a.json", nlohmann::json::array({bench_row("topk", 2, 1.8, 1200, 0.0),
                                        bench_row("randomk", 2, 1.0, 1000, 0.0)})},
      {"b.json", nlohmann::json::array({bench_row("topk", 4, 2.4, 1200, 0.0),
                                        bench_row("exdyna", 4, 1.0, 250, 0.3)})}};
  const MeasuredScaling measured = scaling_from_bench_rows(inputs);
  EXPECT_EQ(measured.table.schemes(), (std::vector<std::string>{"exdyna", "topk"}));
  EXPECT_EQ(measured.unused, (std::vector<std::string>{"randomk"}));
  const SchemeScaling* topk = measured.table.find("topk", 0.01);
  ASSERT_NE(topk, nullptr);
  EXPECT_TRUE(topk->independent());
  EXPECT_NEAR(topk->at(4, 1000).density_ratio, 2.4, 1e-12);
  EXPECT_NEAR(topk->at(4, 1000).selected_ratio, 1.2, 1e-12);
  EXPECT_NEAR(measured.table.find("exdyna", 0.02)->at(4, 1000).imbalance, 0.3, 1e-12);

  // The model uses them: Top-k's bytes follow the measured 1.2 k per rank.
  const CostProfile p = unit_profile();
  Scenario s{.ranks = 4, .numel = 1e5, .density = 0.01};
  const StepPrediction builtin = predict_step("topk", s, p);
  s.statistics = &measured.table;
  const StepPrediction traced = predict_step("topk", s, p);
  EXPECT_EQ(builtin.statistics, "built-in");
  EXPECT_EQ(traced.statistics, "measured");
  EXPECT_NEAR(traced.density_ratio, 2.4, 1e-12);
  const SparseSend send{.mean_count = 1200,
                        .max_count = 1200,
                        .union_count = 2400,
                        .index_bytes = varint_index_bytes(0.01),
                        .numel = 1e5};
  EXPECT_NEAR(traced.bytes_sent,
              nonfinite_agreement(p, 4).bytes_sent + sparse_allgather(p, 4, send).bytes_sent, 1e-6);
  EXPECT_EQ(predict_step("micro", s, p).statistics, "built-in");  // not in the table
  EXPECT_EQ(predict_step("dense", s, p).statistics, "");
}

// A mean of 1.5 histogram rounds per step costs half-way between 1 and 2:
// the second round runs on half of the steps.
TEST(MeasuredScaling, AFractionalMeanOfSelectionRoundsCostsItsShareOfTheSteps) {
  auto with_rounds = [](double rounds) {
    nlohmann::json row = bench_row("micro", 4, 1.0, 250, 0.1);
    row["selection_collectives_mean"] = rounds;
    const std::vector<BenchRows> inputs = {{"r.json", nlohmann::json::array({row})}};
    const MeasuredScaling measured = scaling_from_bench_rows(inputs);
    Scenario s{.ranks = 4, .numel = 1e5, .density = 0.01};
    s.statistics = &measured.table;
    return predict_step("micro", s, unit_profile());
  };
  const StepPrediction one = with_rounds(1.0), half = with_rounds(1.5), two = with_rounds(2.0);
  EXPECT_GT(two.bytes_sent, one.bytes_sent);
  EXPECT_GT(two.exchange_s, one.exchange_s);
  EXPECT_NEAR(half.bytes_sent, (one.bytes_sent + two.bytes_sent) / 2, 1e-9);
  EXPECT_NEAR(half.exchange_s, (one.exchange_s + two.exchange_s) / 2, 1e-12);
}

TEST(MeasuredScaling, RowsThatAreNotBenchRowsAreRefusedNamingTheFileAndField) {
  auto load = [](nlohmann::json rows) {
    const std::vector<BenchRows> inputs = {{"stats.json", std::move(rows)}};
    return error_message([&] { scaling_from_bench_rows(inputs); });
  };
  EXPECT_NE(load(nlohmann::json::object()).find("stats.json: expected the JSON array"),
            std::string::npos);
  nlohmann::json old = bench_row("topk", 4, 2.0, 1000, 0);
  old.erase("selected_mean");
  EXPECT_NE(load(nlohmann::json::array({old})).find("stats.json, row 0: 'selected_mean'"),
            std::string::npos);
  EXPECT_NE(load(nlohmann::json::array(
                     {bench_row("topk", 4, 2, 1000, 0), bench_row("topk", 4, 2, 1000, 0)}))
                .find("appears twice"),
            std::string::npos);
  nlohmann::json other_d = bench_row("topk", 8, 3, 1000, 0);
  other_d["numel"] = 200000;
  EXPECT_NE(load(nlohmann::json::array({bench_row("topk", 4, 2, 1000, 0), other_d}))
                .find("one scheme's statistics come from one trace"),
            std::string::npos);
  EXPECT_NE(load(nlohmann::json::array({bench_row("topk", 4, 0, 0, 0)})).find("selected nothing"),
            std::string::npos);
  const std::vector<std::string> missing = {"/nonexistent/stats.json"};
  EXPECT_NE(error_message([&] { load_bench_statistics(missing); }).find("cannot read"),
            std::string::npos);
}

TEST(StepModel, BadInputIsRefusedNamingWhatIsWrong) {
  const CostProfile p = unit_profile();
  EXPECT_EQ(error_message<InvalidArgument>([&] {
              predict_step("nope", Scenario{.numel = 10}, p);
            }).rfind("the performance model knows no method 'nope' (known: dense, skipreduce", 0),
            0u);
  EXPECT_EQ(error_message<InvalidArgument>(
                [&] { predict_step("dense", Scenario{.numel = 10, .density = 0}, p); }),
            "density must be in (0, 1], got 0");
  EXPECT_EQ(error_message<InvalidArgument>(
                [&] { predict_step("dense", Scenario{.ranks = 0, .numel = 10}, p); }),
            "ranks must be >= 1, got 0");
  EXPECT_THROW(predict_step("dense", Scenario{.numel = 0}, p), InvalidArgument);
  EXPECT_THROW(predict_step("dense", Scenario{.numel = 10, .compute_s = -1}, p), InvalidArgument);
  EXPECT_NO_THROW(predict_step("topk", Scenario{.numel = 10, .values = ValueEncoding::kInt2}, p));
}

// A codec's width sets the bytes; its per-value costs (encoding once at the
// sender, decoding every received list) join the exchange.
TEST(StepModel, TheValueCodecSetsTheBytesAndAddsItsHostWork) {
  CostProfile p = unit_profile();
  const SparseSend fp32{.mean_count = 1e4, .max_count = 1e4, .union_count = 1e4, .numel = 1e6};
  SparseSend int2 = fp32;
  int2.value_bytes = 2.25 / 8;
  const CommCost plain = shared_allreduce(p, 4, int2);
  int2.encode_s = 3e-9;
  int2.decode_s = 2e-9;
  // 4 ranks: 4 x 2.25 bits < 8 bytes, so the codes are all-gathered and all
  // 4 lists decoded.
  EXPECT_NEAR(shared_allreduce(p, 4, int2).seconds - plain.seconds, 1e4 * (3e-9 + 4 * 2e-9), 1e-15);
  // (n-1) 2.25 bits against the ring's 2 (n-1)/n 32: 7.1x fewer bytes.
  EXPECT_LT(plain.bytes_sent, shared_allreduce(p, 4, fp32).bytes_sent / 7);
  // Allgather: each rank encodes its m values and decodes the n blocks.
  SparseSend gathered = fp32;
  const CommCost before = sparse_allgather(p, 8, gathered);
  gathered.encode_s = 3e-9;
  gathered.decode_s = 2e-9;
  EXPECT_NEAR(sparse_allgather(p, 8, gathered).seconds - before.seconds, 1e4 * (3e-9 + 8 * 2e-9),
              1e-15);
  // From the profile by the codec's name; the dense quantizers use their own.
  p.encode_s_per_value["sign"] = 5e-9;
  p.decode_s_per_value["sign"] = 4e-9;
  const Scenario s{.ranks = 4, .numel = 1e6};
  const StepPrediction sign = predict_step("signsgd", s, p);
  CostProfile free = p;
  free.encode_s_per_value.clear();
  free.decode_s_per_value.clear();
  EXPECT_NEAR(sign.exchange_s - predict_step("signsgd", s, free).exchange_s,
              1e6 * (5e-9 + 4 * 4e-9), 1e-12);
}

TEST(CostProfile, SurvivesAJsonRoundTripAndRefusesBadFields) {
  CostProfile p = network_profile(25, 3);
  p.select_s_per_element["exdyna"] = 1.5e-9;
  const CostProfile back = profile_from_json(to_json(p), "test");
  EXPECT_EQ(back.name, p.name);
  EXPECT_DOUBLE_EQ(back.alpha_s, 3e-6);
  EXPECT_DOUBLE_EQ(back.beta_s_per_byte, 8.0 / 25e9);
  EXPECT_DOUBLE_EQ(back.select_cost("exdyna"), 1.5e-9);
  EXPECT_DOUBLE_EQ(back.select_cost("topk"), p.select_cost("default"));

  nlohmann::json missing = to_json(p);
  missing.erase("beta_s_per_byte");
  EXPECT_EQ(error_message<InvalidArgument>([&] { profile_from_json(missing, "f.json"); }),
            "f.json: 'beta_s_per_byte' is missing or not a number");
  nlohmann::json negative = to_json(p);
  negative["alpha_s"] = -1;
  EXPECT_EQ(error_message<InvalidArgument>([&] { profile_from_json(negative, "f.json"); }),
            "f.json: 'alpha_s' must be a finite number >= 0, got -1");
  EXPECT_THROW(network_profile(0, 1), InvalidArgument);
  EXPECT_THROW(network_profile(10, -1), InvalidArgument);

  // The decoding and wire fields round-trip; a profile written before they
  // existed reads them as 0 (no fill, gamma per entry, payload alone on the
  // wire); a bad one is refused.
  p.wire_bytes_per_message = 170;
  p.wire_overhead_per_byte = 0.045;
  const CostProfile framed = profile_from_json(to_json(p), "test");
  EXPECT_DOUBLE_EQ(framed.scatter_s_per_element, p.scatter_s_per_element);
  EXPECT_DOUBLE_EQ(framed.cache_bytes, p.cache_bytes);
  EXPECT_DOUBLE_EQ(framed.wire_bytes_per_message, 170);
  EXPECT_DOUBLE_EQ(framed.wire_overhead_per_byte, 0.045);
  EXPECT_DOUBLE_EQ(framed.pack_s_per_element, p.pack_s_per_element);
  EXPECT_DOUBLE_EQ(framed.merge_s_per_element, p.merge_s_per_element);
  EXPECT_DOUBLE_EQ(framed.index_decode_s_per_element, p.index_decode_s_per_element);
  EXPECT_DOUBLE_EQ(framed.low_rank_s_per_element, p.low_rank_s_per_element);
  EXPECT_DOUBLE_EQ(framed.low_rank_s_per_element_rank, p.low_rank_s_per_element_rank);
  EXPECT_DOUBLE_EQ(framed.encode_cost("int2-sr"), p.encode_cost("int2-sr"));
  EXPECT_DOUBLE_EQ(framed.decode_cost("sign"), p.decode_cost("sign"));
  EXPECT_GT(p.encode_cost("int2-sr"), 0.0);
  nlohmann::json older = to_json(p);
  for (const char* key :
       {"fill_s_per_element", "scatter_s_per_element", "cache_bytes", "pack_s_per_element",
        "index_decode_s_per_element", "merge_s_per_element", "wire_bytes_per_message",
        "wire_overhead_per_byte", "low_rank_s_per_element", "low_rank_s_per_element_rank",
        "encode_s_per_value", "decode_s_per_value"})
    older.erase(key);
  const CostProfile old_profile = profile_from_json(older, "old.json");
  EXPECT_EQ(old_profile.fill_s_per_element, 0.0);
  EXPECT_EQ(old_profile.pack_cost(1e12), 0.0);
  EXPECT_EQ(old_profile.merge_s_per_element, 0.0);
  EXPECT_EQ(old_profile.wire_bytes_per_message, 0.0);
  EXPECT_EQ(old_profile.wire_overhead_per_byte, 0.0);
  EXPECT_EQ(old_profile.low_rank_s_per_element_rank, 0.0);
  EXPECT_EQ(old_profile.encode_cost("int2"), 0.0);
  EXPECT_DOUBLE_EQ(old_profile.scatter_cost(1e12), old_profile.gamma_s_per_element);
  nlohmann::json bad_scatter = to_json(p);
  bad_scatter["scatter_s_per_element"] = -1e-9;
  EXPECT_EQ(error_message<InvalidArgument>([&] { profile_from_json(bad_scatter, "f.json"); }),
            "f.json: 'scatter_s_per_element' must be a finite number >= 0, got -1e-09");
}

TEST(CostProfile, TheNetworkOnlyBoundKeepsTheLinkAndDropsEveryHostCost) {
  CostProfile p = network_profile(10, 5);
  p.wire_bytes_per_message = 170;
  p.pack_s_per_element = p.merge_s_per_element = p.index_decode_s_per_element = 1e-9;
  const CostProfile network = without_host_costs(p);
  EXPECT_EQ(network.alpha_s, p.alpha_s);
  EXPECT_EQ(network.beta_s_per_byte, p.beta_s_per_byte);
  EXPECT_EQ(network.wire_bytes_per_message, 170);
  EXPECT_EQ(network.name, p.name + ", no host costs");
  // With no host costs, Top-k's step is its compute plus its messages' time.
  const Scenario s{.ranks = 8, .numel = 1e8, .density = 0.01, .compute_s = 0.1};
  const StepPrediction topk = predict_step("topk", s, network);
  EXPECT_EQ(topk.selection_s, 0.0);
  EXPECT_EQ(topk.accumulate_s + topk.update_s, 0.0);
  EXPECT_LT(predict_step("topk", s, network).exchange_s, predict_step("topk", s, p).exchange_s);
  EXPECT_DOUBLE_EQ(topk.step_s, 0.1 + topk.exchange_s);
}

TEST(CostProfile, FilesAreWrittenWholeAndBadFilesNamed) {
  ScratchDir dir("perf");
  const std::string path = (dir.path() / "profile.json").string();
  save_profile(network_profile(1, 50), path);
  EXPECT_DOUBLE_EQ(load_profile(path).alpha_s, 50e-6);
  std::ofstream(dir.path() / "bad.json") << "{ not json";
  EXPECT_NE(error_message<InvalidArgument>([&] {
              load_profile((dir.path() / "bad.json").string());
            }).find("is not JSON"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              load_profile((dir.path() / "none.json").string());
            }).find("sparsecomm calibrate"),
            std::string::npos);
}

}  // namespace
}  // namespace sparsecomm::perf
