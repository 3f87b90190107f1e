// MiCRO, ExDyna and DEFT: partitions, agreement across ranks, edge cases.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <set>
#include <vector>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/sparsify/partition.h"
#include "sparsecomm/sparsify/schemes/deft.h"
#include "sparsecomm/sparsify/schemes/partitioned.h"

namespace sparsecomm {
namespace {

// ---------- pure layout logic ----------

TEST(Partition, EqualPartitionsTileTheVector) {
  for (std::size_t d : {0u, 1u, 5u, 7u, 1000u, 1001u}) {
    for (int n : {1, 2, 3, 8}) {
      const auto ranges = equal_partitions(d, n);
      ASSERT_EQ(ranges.size(), static_cast<std::size_t>(n));
      std::size_t next = 0;
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        EXPECT_EQ(ranges[i].begin, next);
        EXPECT_EQ(ranges[i].size(), d / n + (i < d % n ? 1 : 0));
        next = ranges[i].end;
      }
      EXPECT_EQ(next, d);
    }
  }
}

TEST(Partition, BlockGridFollowsTheReferenceRules) {
  const BlockGrid big = make_block_grid(1000000, 1024, 32);
  EXPECT_EQ(big.blocks, 1024);
  EXPECT_EQ(big.block_size, 960u);  // floor(1e6 / 1024) = 976 -> multiple of 32
  EXPECT_EQ(big.block(1023).end, 1000000u) << "the last block takes the remainder";
  EXPECT_EQ(big.block_of(999999), 1023);
  const BlockGrid small = make_block_grid(1000, 1024, 32);  // d < 32 * B
  EXPECT_EQ(small.blocks, 31);
  EXPECT_EQ(small.block_size, 32u);
  EXPECT_EQ(small.block(30).end, 1000u);
  const BlockGrid tiny = make_block_grid(5, 1024, 32);
  EXPECT_EQ(tiny.blocks, 1);
  EXPECT_EQ(tiny.block(0).size(), 5u);
  const BlockGrid empty = make_block_grid(0, 1024, 32);
  EXPECT_EQ(empty.blocks, 1);
  EXPECT_EQ(empty.block(0).size(), 0u);
}

TEST(Partition, SpreadRemainderKeepsEveryBlockWithinOneAlignmentStep) {
  for (const std::size_t numel : {std::size_t{421642}, std::size_t{1000000}, std::size_t{32768},
                                  std::size_t{1000}, std::size_t{5}, std::size_t{0}}) {
    const BlockGrid grid = make_block_grid(numel, 1024, 32, /*spread_remainder=*/true);
    std::size_t next = 0;
    std::size_t smallest = numel, largest = 0;
    for (int b = 0; b < grid.blocks; ++b) {
      const Range r = grid.block(b);
      ASSERT_EQ(r.begin, next) << "numel " << numel << " block " << b;
      next = r.end;
      smallest = std::min(smallest, r.size());
      largest = std::max(largest, r.size());
      for (const std::size_t i : {r.begin, r.end - 1}) {
        if (r.size() > 0) {
          EXPECT_EQ(grid.block_of(i), b) << "numel " << numel << " i " << i;
        }
      }
    }
    EXPECT_EQ(next, numel);
    if (numel >= 32 * 1024) {
      EXPECT_LT(largest - smallest, 64u) << "numel " << numel;
    }
  }
  // The reference rule, for comparison: 6.7% of this model in one block.
  EXPECT_EQ(make_block_grid(421642, 1024, 32).block(1023).size(), 384u + 28426u);
}

TEST(Partition, InitialLayoutSpreadsBlocks) {
  const BlockLayout layout = initial_layout(10, 4);
  EXPECT_EQ(layout.first, (std::vector<int>{0, 3, 6, 8, 10}));
  const BlockLayout sparse = initial_layout(2, 4);  // B' < n: empty partitions
  EXPECT_EQ(sparse.blocks_in(2), 0);
  EXPECT_EQ(sparse.blocks_in(3), 0);
}

// The known weakness of the reference sweep (docs/algorithms.md "Dynamic
// partition allocation"): these skews never move, while the counts
// balancer fixes them in one step.
TEST(Partition, FaithfulSweepStallsWhereTheCountsBalancerDoesNot) {
  const BlockGrid grid = make_block_grid(1 << 20, 1024, 32);
  for (const std::vector<double>& shape :
       {std::vector<double>{1.5, 1, 1, 0.5}, {0.7, 0.9, 1.1, 1.3}}) {
    BlockLayout sweep = initial_layout(grid.blocks, 4);
    const BlockLayout before = sweep;
    std::vector<std::int64_t> loads;
    for (double s : shape) loads.push_back(static_cast<std::int64_t>(s * 1000));
    const std::int64_t total = std::accumulate(loads.begin(), loads.end(), std::int64_t{0});
    faithful_sweep(sweep, loads, total, grid, {});
    if (shape[0] == 1.5) {
      EXPECT_EQ(sweep.first, before.first) << "the reference sweep never moves on this skew";
    } else {
      for (int i = 1; i < 4; ++i) {
        EXPECT_LE(std::abs(sweep.first[static_cast<std::size_t>(i)] -
                           before.first[static_cast<std::size_t>(i)]),
                  1)
            << "the reference sweep moves at most one block per boundary";
      }
    }

    // The same skew as per-block counts (uniform inside each partition).
    std::vector<double> blocks(static_cast<std::size_t>(grid.blocks));
    for (int p = 0; p < 4; ++p) {
      for (int b = before.first[p]; b < before.first[p + 1]; ++b) {
        blocks[static_cast<std::size_t>(b)] = shape[static_cast<std::size_t>(p)] * 100;
      }
    }
    BlockLayout balanced = before;
    balance_from_block_counts(balanced, blocks, {1, 0});
    std::vector<double> after(4, 0.0);
    for (int p = 0; p < 4; ++p) {
      for (int b = balanced.first[p]; b < balanced.first[p + 1]; ++b) {
        after[static_cast<std::size_t>(p)] += blocks[static_cast<std::size_t>(b)];
      }
    }
    const double sum = std::accumulate(after.begin(), after.end(), 0.0);
    const double imbalance = 4.0 * *std::max_element(after.begin(), after.end()) / sum - 1.0;
    EXPECT_LT(imbalance, 0.02);
  }
}

TEST(Partition, CountsBalancerRespectsMinBlocksAndMaxMove) {
  std::vector<double> blocks(64, 0.0);
  blocks[0] = 1000;  // everything in the first block
  BlockLayout layout = initial_layout(64, 4);
  balance_from_block_counts(layout, blocks, {2, 0});
  for (int p = 0; p < 4; ++p) EXPECT_GE(layout.blocks_in(p), 2);
  EXPECT_EQ(layout.first.back(), 64);
  BlockLayout limited = initial_layout(64, 4);
  balance_from_block_counts(limited, blocks, {1, 3});
  for (int i = 1; i < 4; ++i)
    EXPECT_LE(std::abs(limited.first[i] - initial_layout(64, 4).first[i]), 3);
}

// Scattered layout: every block in exactly one partition, at most ceil(B/n)
// blocks per partition, lists ascending, and the predicted load spread so
// the heaviest partition exceeds the mean by less than the heaviest block.
TEST(Partition, GreedyAssignmentCoversEqualSharesAndBalancesTheLoad) {
  const Philox rng(5);
  for (int n = 1; n <= 8; ++n) {
    for (int blocks : {0, 1, n - 1, n, 3 * n + 1, 257}) {
      if (blocks < 0) continue;
      std::vector<double> load(static_cast<std::size_t>(blocks));
      for (std::size_t b = 0; b < load.size(); ++b) {
        const double u = (rng.block(b, static_cast<std::uint64_t>(n))[0] + 0.5) / 4294967296.0;
        load[b] = b % 17 == 0 ? 50.0 * u : u * u;  // a few hot blocks
      }
      BlockAssignment a = cyclic_assignment(blocks, n);
      assign_blocks_greedy(load, n, a);
      SCOPED_TRACE("n=" + std::to_string(n) + " B=" + std::to_string(blocks));
      ASSERT_EQ(a.parts(), n);
      std::vector<int> seen(static_cast<std::size_t>(blocks), 0);
      std::vector<double> part_load(static_cast<std::size_t>(n), 0.0);
      for (int p = 0; p < n; ++p) {
        const auto& list = a.blocks[static_cast<std::size_t>(p)];
        EXPECT_LE(static_cast<int>(list.size()), (blocks + n - 1) / n);
        EXPECT_TRUE(std::is_sorted(list.begin(), list.end()));
        for (int b : list) {
          ++seen[static_cast<std::size_t>(b)];
          EXPECT_EQ(a.part_of[static_cast<std::size_t>(b)], p);
          part_load[static_cast<std::size_t>(p)] += load[static_cast<std::size_t>(b)];
        }
      }
      for (int count : seen) EXPECT_EQ(count, 1) << "disjoint and covering";
      if (blocks >= 2 * n) {
        const double total = std::accumulate(load.begin(), load.end(), 0.0);
        const double heaviest_block = *std::max_element(load.begin(), load.end());
        EXPECT_LE(*std::max_element(part_load.begin(), part_load.end()),
                  total / n + heaviest_block);
      }
      // A function of the loads only.
      BlockAssignment again = cyclic_assignment(blocks, n);
      assign_blocks_greedy(load, n, again);
      EXPECT_EQ(again.part_of, a.part_of);
    }
  }
}

TEST(Partition, ScatteredRangesMergeAdjacentBlocks) {
  const BlockGrid grid = make_block_grid(10 * 32, 10, 32);
  BlockAssignment a = cyclic_assignment(10, 3);
  a.blocks[0] = {0, 1, 2, 5, 9};
  std::vector<Range> ranges;
  a.ranges(grid, 0, ranges);
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0].begin, 0u);
  EXPECT_EQ(ranges[0].end, 96u);
  EXPECT_EQ(ranges[1].begin, 160u);
  EXPECT_EQ(ranges[1].end, 192u);
  EXPECT_EQ(ranges[2].end, 320u);
}

TEST(Deft, PiecesSplitLargeTensors) {
  const std::vector<LayerSpan> layers = {{"a", 0, 10}, {"b", 10, 100}, {"c", 110, 10}};
  const auto pieces = deft_pieces(layers, 120, 4);  // d/n = 30: b is split in 4
  ASSERT_EQ(pieces.size(), 6u);
  std::size_t next = 0;
  for (const Range& piece : pieces) {
    EXPECT_EQ(piece.begin, next);
    next = piece.end;
  }
  EXPECT_EQ(next, 120u);
}

TEST(Deft, AllocationNeverExceedsTheBudgetAndCapsAtPieceSize) {
  const std::vector<Range> pieces = {{0, 10}, {10, 20}, {20, 1000}, {1000, 1001}};
  const std::vector<double> norms = {100.0, 0.0, 1.0, 5.0};
  for (std::size_t k : {0u, 1u, 3u, 50u, 1001u}) {
    const auto budget = deft_allocate(norms, pieces, k, true);
    std::int64_t total = 0;
    for (std::size_t l = 0; l < pieces.size(); ++l) {
      EXPECT_LE(budget[l], static_cast<std::int64_t>(pieces[l].size()));
      EXPECT_GE(budget[l], 0);
      total += budget[l];
    }
    EXPECT_LE(total, static_cast<std::int64_t>(k));
  }
  const auto all = deft_allocate(std::vector<double>(4, 0.0), pieces, 1001, false);
  EXPECT_EQ(std::accumulate(all.begin(), all.end(), std::int64_t{0}), 1001)
      << "zero norms split by size";
  const auto packed = deft_pack(pieces, all, 3);
  for (std::size_t l = 0; l < pieces.size(); ++l) EXPECT_EQ(packed[l], -2) << "k_l == size: whole";
}

TEST(Deft, PackingBalancesCost) {
  std::vector<Range> pieces;
  for (std::size_t i = 0; i < 16; ++i) pieces.push_back({i * 1000, (i + 1) * 1000});
  const std::vector<std::int64_t> budget(16, 10);
  const auto bins = deft_pack(pieces, budget, 4);
  std::vector<int> per_bin(4, 0);
  for (auto b : bins) ++per_bin[static_cast<std::size_t>(b)];
  for (int count : per_bin) EXPECT_EQ(count, 4);
}

// ---------- the schemes on a thread world ----------

struct SchemeCase {
  std::string name;
  std::function<std::unique_ptr<Sparsifier>()> make;
  // The whole saved state is identical on every rank (false: per-rank
  // quotas keep a floor of each rank's own; the layout is still shared, and
  // disjoint, covering selections show it).
  bool shared_state = true;
};

std::vector<SchemeCase> partition_schemes(double density) {
  std::vector<SchemeCase> cases;
  const std::vector<std::pair<const char*, std::vector<std::string>>> variants = {
      {"micro", {}},
      {"exdyna", {}},
      {"exdyna", {"controller=quota"}},
      {"exdyna", {"cap=0"}},
      {"exdyna", {"balancer=scattered"}},
      {"exdyna", {"balancer=counts", "controller=histogram"}},
      {"exdyna-faithful", {}}};
  for (const auto& [name, extra] : variants) {
    std::string label = name;
    for (const std::string& option : extra) label += " " + option;
    const bool quota = std::find(extra.begin(), extra.end(), "controller=quota") != extra.end();
    cases.push_back({label,
                     [name, extra, density] {
                       SchemeOptions options;
                       options.set("density", std::to_string(density));
                       for (const std::string& option : extra) options.set(option);
                       return make_partitioned_sparsifier(partitioned_options_from(name, options));
                     },
                     !quota});
  }
  cases.push_back({"deft", [density] {
                     DeftOptions options;
                     options.density = density;
                     return make_deft_sparsifier(options);
                   }});
  return cases;
}

// A deterministic gradient for (rank, step): mostly small, a few large.
void fill_gradient(int rank, std::int64_t step, std::span<float> out, bool zeros) {
  const Philox rng(77);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (zeros) {
      out[i] = 0.0f;
      continue;
    }
    const auto bits =
        rng.block(i, static_cast<std::uint64_t>(step) * 64 + static_cast<std::uint64_t>(rank));
    const double u = (bits[0] + 0.5) / 4294967296.0;
    out[i] = static_cast<float>((bits[1] & 1 ? 1.0 : -1.0) * std::pow(u, 3.0) *
                                (1.0 + static_cast<double>(i % 7)));
  }
}

// Runs `steps` steps of select() (no exchange: selection and shared state
// only) and checks: identical state on all ranks each step, disjoint
// selections, ascending indices in range.
void check_agreement(const SchemeCase& scheme, int n, std::size_t d, int steps, bool zeros) {
  SCOPED_TRACE(scheme.name + " n=" + std::to_string(n) + " d=" + std::to_string(d));
  run_thread_world(n, [&](Communicator& comm) {
    auto sparsifier = scheme.make();
    std::vector<LayerSpan> layers = {{"w", 0, d / 2}, {"b", d / 2, d - d / 2}};
    std::vector<float> a(d);
    SparseSelection selection;
    for (int step = 0; step < steps; ++step) {
      StepContext ctx{step, 0.0, comm.rank(), n, layers};
      fill_gradient(comm.rank(), step, a, zeros);
      sparsifier->select(a, ctx, comm, selection);
      for (std::size_t i = 0; i < selection.size(); ++i) {
        ASSERT_LT(selection.indices[i], d);
        if (i > 0) {
          ASSERT_LT(selection.indices[i - 1], selection.indices[i]);
        }
        ASSERT_EQ(selection.values[i], a[selection.indices[i]]);
      }
      // What the scheme says it read covers everything it selected.
      const std::span<const Range> read = sparsifier->last_read();
      for (std::size_t i = 0; i < selection.size(); ++i) {
        const Index index = selection.indices[i];
        ASSERT_TRUE(std::any_of(read.begin(), read.end(),
                                [&](const Range& r) { return r.begin <= index && index < r.end; }))
            << "index " << index << " outside last_read() at step " << step;
      }
      if (scheme.name != "deft") {
        // One exclusive partition per rank (one range, or ExDyna's scattered
        // blocks: ascending, non-adjacent ranges); together they tile [0, d).
        std::uint64_t own = 0;
        for (std::size_t i = 0; i < read.size(); ++i) {
          ASSERT_FALSE(read[i].empty());
          if (i > 0) {
            ASSERT_LT(read[i - 1].end, read[i].begin);
          }
          own += read[i].size();
        }
        const auto sizes = allgather_value<std::uint64_t>(comm, own);
        std::uint64_t covered = 0;
        for (auto size : sizes) covered += size;
        EXPECT_EQ(covered, d) << "partitions must tile the vector at step " << step;
      }
      if (zeros && scheme.name != "deft") {
        EXPECT_EQ(selection.size(), 0u) << "zeros are never selected by a threshold";
      }
      // Disjoint across ranks: gather everyone's indices.
      const auto counts = allgather_value<std::uint64_t>(comm, selection.size());
      std::vector<std::size_t> bytes;
      std::size_t total = 0;
      for (auto c : counts) {
        bytes.push_back(c * sizeof(Index));
        total += c;
      }
      std::vector<Index> all(total);
      comm.allgatherv(
          std::as_bytes(std::span<const Index>(selection.indices.data(), selection.size())),
          writable_bytes_of(std::span<Index>(all)), bytes);
      const std::set<Index> unique(all.begin(), all.end());
      ASSERT_EQ(unique.size(), all.size()) << "selections overlap at step " << step;
      std::vector<std::uint64_t> count_values(counts.begin(), counts.end());
      std::vector<std::size_t> sizes(count_values.begin(), count_values.end());
      ExchangeOutcome outcome{sizes, total, sparsifier->target(d, ctx)};
      sparsifier->observe(outcome, ctx);
      if (!scheme.shared_state) continue;
      // Identical shared state (thresholds, layouts) on every rank.
      StateWriter writer;
      sparsifier->save(writer);
      const auto sizes_of_state = allgather_value<std::uint64_t>(comm, writer.bytes().size());
      for (auto s : sizes_of_state) {
        ASSERT_EQ(s, writer.bytes().size());
      }
      std::vector<std::byte> states(writer.bytes().size() * static_cast<std::size_t>(n));
      comm.allgather(writer.bytes(), states);
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(
            std::equal(writer.bytes().begin(), writer.bytes().end(),
                       states.begin() + static_cast<std::ptrdiff_t>(writer.bytes().size()) * r))
            << "rank " << r << " disagrees at step " << step;
      }
    }
  });
}

class PartitionedWorlds : public ::testing::TestWithParam<int> {};

TEST_P(PartitionedWorlds, RanksAgreeAndSelectionsAreDisjoint) {
  const int n = GetParam();
  for (const SchemeCase& scheme : partition_schemes(0.01))
    check_agreement(scheme, n, 20000, 6, false);
}

TEST_P(PartitionedWorlds, EdgeCasesWork) {
  const int n = GetParam();
  for (const SchemeCase& scheme : partition_schemes(0.05)) {
    check_agreement(scheme, n, static_cast<std::size_t>(std::max(n - 1, 0)), 3, false);  // d < n
    check_agreement(scheme, n, 1000, 3, false);  // d < 32 * blocks
    check_agreement(scheme, n, 4000, 3, true);   // all-zero gradients
  }
  for (const SchemeCase& scheme : partition_schemes(0.0005)) {
    check_agreement(scheme, n, 4000, 3, false);  // k = 2 < n for n > 2
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, PartitionedWorlds, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return "n" + std::to_string(param.param);
                         });

TEST(PartitionedOptions, BadOptionsAreRejected) {
  SchemeOptions bad;
  bad.set("controller", "magic");
  EXPECT_THROW(partitioned_options_from("exdyna", bad), InvalidArgument);
  SchemeOptions zero;
  zero.set("density", "0");
  EXPECT_THROW(partitioned_options_from("micro", zero), InvalidArgument);
  SchemeOptions blocks;
  blocks.set("blocks", "-3");
  EXPECT_THROW(partitioned_options_from("exdyna", blocks), InvalidArgument);
  SchemeOptions band;
  band.set("candidates_low", "2");
  band.set("candidates_high", "1.5");
  EXPECT_THROW(partitioned_options_from("micro", band), InvalidArgument);
  SchemeOptions below_one;
  below_one.set("candidates_low", "0.5");
  EXPECT_THROW(partitioned_options_from("exdyna", below_one), InvalidArgument);
  SchemeOptions fine;
  fine.set("candidates_low", "1.1");
  fine.set("candidates_high", "3");
  const PartitionedOptions parsed = partitioned_options_from("exdyna", fine);
  EXPECT_EQ(parsed.histogram.settled_candidates_low, 1.1);
  EXPECT_EQ(parsed.histogram.settled_candidates_high, 3.0);
  EXPECT_EQ(parsed.histogram.candidates_low, 1.5) << "the settling band is not an option";
}

}  // namespace
}  // namespace sparsecomm
