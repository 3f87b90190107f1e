// The same-step threshold (sparsify/step_threshold.h): every rank derives the
// same threshold from all-reduced histograms of this step's candidates, and
// the global count K lands within the tolerance of k (exactly k on ties),
// also when the floor was set too high and a second pass is needed.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"
#include "sparsecomm/sparsify/step_threshold.h"

namespace sparsecomm {
namespace {

using Fill = std::function<float(int rank, std::int64_t step, std::size_t i)>;

double uniform(int rank, std::int64_t step, std::size_t i) {
  const Philox rng(11);
  const auto bits =
      rng.block(i, static_cast<std::uint64_t>(step) * 64 + static_cast<std::uint64_t>(rank));
  return (bits[0] + 0.5) / 4294967296.0;
}

struct Outcome {
  std::int64_t selected = 0;  // K over all ranks
  int candidate_passes = 0;
};

// Runs `steps` steps of start/choose on n ranks over `per_rank` elements
// each, checks on every step that all ranks agree on the threshold and on
// the stats, that each selection is exactly its candidates >= the threshold
// (ties aside), and that K is within tolerance * k of k (exactly k on
// ties), or all nonzero elements when there are fewer than k. Returns the
// last step's outcome.
std::vector<Outcome> run(int n, std::size_t per_rank, std::size_t k, int steps, const Fill& fill,
                         StepThresholdOptions options = {}, float force_floor = 0.0f) {
  std::vector<Outcome> outcomes(static_cast<std::size_t>(steps));
  run_thread_world(n, [&](Communicator& comm) {
    StepThreshold threshold(options);
    std::vector<float> values(per_rank);
    SparseSelection candidates;
    const std::vector<Range> own = {{0, per_rank}};
    for (int step = 0; step < steps; ++step) {
      for (std::size_t i = 0; i < per_rank; ++i) values[i] = fill(comm.rank(), step, i);
      if (!threshold.started()) threshold.start(values, own, k, comm);
      if (force_floor > 0 && step == steps - 1) {
        // A floor far above this step's crossing (the same on every rank):
        // this call must rescan.
        StateWriter forced;
        forced.tag("step-threshold");
        forced.value(true);
        forced.value(force_floor);
        forced.value(2.0);
        StateReader reader(forced.bytes());
        threshold.load(reader);
      }
      const auto collect = [&](float floor, SparseSelection& out) {
        out.clear();
        threshold_select(values, floor, 0, out);
      };
      collect(threshold.candidate_floor(), candidates);
      const float t = threshold.choose(candidates, k, {}, comm, collect);
      const StepThresholdStats stats = threshold.stats();
      // Same threshold and stats on every rank.
      const auto thresholds = allgather_value(comm, t);
      const auto passes = allgather_value(comm, stats.candidate_passes);
      const auto claimed = allgather_value(comm, stats.selected);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(thresholds[static_cast<std::size_t>(r)]),
                  std::bit_cast<std::uint32_t>(t));
        ASSERT_EQ(passes[static_cast<std::size_t>(r)], stats.candidate_passes);
        ASSERT_EQ(claimed[static_cast<std::size_t>(r)], stats.selected);
      }
      // The selection: every element > t, and elements == t (all of them,
      // unless ties were split), nothing below.
      std::size_t above = 0, at = 0, nonzero = 0;
      for (float v : values) {
        above += std::fabs(v) > t ? 1 : 0;
        at += std::fabs(v) == t ? 1 : 0;
        nonzero += v != 0.0f ? 1 : 0;
      }
      ASSERT_GE(candidates.size(), above);
      ASSERT_LE(candidates.size(), above + at);
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        ASSERT_GE(std::fabs(candidates.values[i]), t);
        ASSERT_EQ(candidates.values[i], values[candidates.indices[i]]);
        if (i > 0) {
          ASSERT_LT(candidates.indices[i - 1], candidates.indices[i]);
        }
      }
      const auto sizes = allgather_value(comm, static_cast<std::int64_t>(candidates.size()));
      const auto nonzeros = allgather_value(comm, static_cast<std::int64_t>(nonzero));
      std::int64_t total = 0, all_nonzero = 0;
      for (int r = 0; r < n; ++r) {
        total += sizes[static_cast<std::size_t>(r)];
        all_nonzero += nonzeros[static_cast<std::size_t>(r)];
      }
      ASSERT_EQ(total, stats.selected) << "K is known before the exchange";
      const auto want = static_cast<std::int64_t>(k);
      if (all_nonzero <= want) {
        EXPECT_EQ(total, all_nonzero) << "fewer nonzeros than k: all of them";
      } else {
        EXPECT_LE(std::abs(total - want),
                  static_cast<std::int64_t>(options.tolerance * static_cast<double>(k)))
            << "step " << step;
      }
      if (comm.rank() == 0)
        outcomes[static_cast<std::size_t>(step)] = {total, stats.candidate_passes};
    }
  });
  return outcomes;
}

TEST(StepThreshold, HeavyTailsLandWithinTheToleranceEveryStep) {
  for (int n : {1, 3, 4, 8}) {
    for (std::size_t k : {1u, 7u, 100u, 2000u}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k));
      // The scale falls 100x over the steps and the tail is heavy.
      run(n, 5000, k, 12, [](int r, std::int64_t step, std::size_t i) {
        const double u = uniform(r, step, i);
        return static_cast<float>((i % 2 ? 1 : -1) * std::pow(u, 4.0) *
                                  std::pow(0.66, static_cast<double>(step)));
      });
    }
  }
}

TEST(StepThreshold, TiesAreSplitInRankOrderSoKIsExact) {
  // Every element has the same magnitude: no threshold separates them.
  const auto outcomes =
      run(4, 1000, 123, 3, [](int, std::int64_t, std::size_t i) { return i % 3 ? 0.25f : -0.25f; });
  for (const Outcome& o : outcomes) EXPECT_EQ(o.selected, 123);
  // Two levels: 300 large values and the rest tied below them.
  run(3, 1000, 500, 2,
      [](int r, std::int64_t, std::size_t i) { return r == 0 && i < 300 ? 4.0f : 1.0f; });
}

TEST(StepThreshold, FewerNonzerosThanKSelectsThemAll) {
  run(4, 1000, 300, 3, [](int r, std::int64_t, std::size_t i) {
    return r == 1 && i % 10 == 0 ? 0.5f + static_cast<float>(i) : 0.0f;  // 100 nonzeros
  });
  run(2, 100, 10, 3, [](int, std::int64_t, std::size_t) { return 0.0f; });  // all zero
}

TEST(StepThreshold, AFloorAboveTheCrossingRescansAndKeepsK) {
  const Fill fill = [](int r, std::int64_t step, std::size_t i) {
    return static_cast<float>(uniform(r, step, i));
  };
  // The floor forced to 0.999 on the last step: about 4 candidates per rank.
  const auto outcomes = run(4, 4000, 800, 4, fill, {}, 0.999f);
  EXPECT_GE(outcomes.back().candidate_passes, 2) << "the floor was too high: a second pass";
  EXPECT_NEAR(static_cast<double>(outcomes.back().selected), 800.0, 8.0);
  // Without forcing, the floor the last step left suffices.
  const auto normal = run(4, 4000, 800, 4, fill);
  EXPECT_EQ(normal.back().candidate_passes, 1);
}

TEST(StepThreshold, ZeroToleranceRefinesToTheExactCount) {
  StepThresholdOptions exact;
  exact.tolerance = 0.0;
  const auto outcomes = run(
      4, 5000, 1000, 3,
      [](int r, std::int64_t step, std::size_t i) {
        return static_cast<float>(uniform(r, step, i) - 0.5);
      },
      exact);
  for (const Outcome& o : outcomes) EXPECT_EQ(o.selected, 1000);
}

// Six steps of start/choose on 4 ranks whose scales differ 4x each (one
// global threshold alone would give rank 3 nearly everything), with ties on
// step 3 when `ties`; `check(comm, step, selection, threshold)` after each.
void run_unequal_ranks(const StepThresholdOptions& options, std::size_t k, bool ties,
                       const std::function<void(Communicator&, int, const SparseSelection&,
                                                const StepThreshold&)>& check) {
  run_thread_world(4, [&](Communicator& comm) {
    StepThreshold threshold(options);
    std::vector<float> values(5000);
    const std::vector<Range> own = {{0, values.size()}};
    SparseSelection candidates;
    for (int step = 0; step < 6; ++step) {
      for (std::size_t i = 0; i < values.size(); ++i) {
        values[i] =
            static_cast<float>(std::pow(4.0, comm.rank()) * (uniform(comm.rank(), step, i) - 0.5));
      }
      if (ties && step == 3) std::fill(values.begin(), values.begin() + 2000, 0.125f);
      if (!threshold.started()) threshold.start(values, own, k, comm);
      const auto collect = [&](float floor, SparseSelection& out) {
        out.clear();
        threshold_select(values, floor, 0, out);
      };
      collect(threshold.candidate_floor(), candidates);
      threshold.choose(candidates, k, {}, comm, collect);
      check(comm, step, candidates, threshold);
    }
  });
}

// Per-rank quotas: each rank its own threshold from its own histogram, no
// collective, and exactly its quota selected (within the tolerance; exactly
// on ties), whatever the ranks' scales.
TEST(StepThreshold, PerRankQuotasSelectEachRanksShareWithoutACollective) {
  StepThresholdOptions options;
  options.per_rank = true;
  for (std::size_t quota : {1u, 37u, 400u}) {
    run_unequal_ranks(
        options, quota, /*ties=*/true,
        [&](Communicator& comm, int step, const SparseSelection& selection,
            const StepThreshold& threshold) {
          EXPECT_EQ(threshold.stats().rounds, 0) << "no collective";
          EXPECT_NEAR(static_cast<double>(selection.size()), static_cast<double>(quota),
                      options.tolerance * static_cast<double>(quota))
              << "rank " << comm.rank() << " step " << step;
          EXPECT_EQ(threshold.stats().selected, static_cast<std::int64_t>(selection.size()));
        });
  }
}

// A cap on each rank's count: with cap 1.05 no rank selects more than
// ceil(1.05 k/n), the others take the rest (water-filling), and K stays
// within the tolerance of k.
TEST(StepThreshold, ACapKeepsEveryRankAtMostCapTimesItsShare) {
  StepThresholdOptions options;
  options.cap = 1.05;
  for (std::size_t k : {8u, 400u, 4000u}) {
    const auto cap = static_cast<std::size_t>(std::ceil(1.05 * static_cast<double>(k) / 4));
    run_unequal_ranks(
        options, k, /*ties=*/false,
        [&](Communicator& comm, int step, const SparseSelection& selection,
            const StepThreshold& threshold) {
          EXPECT_LE(selection.size(), cap) << "rank " << comm.rank() << " step " << step;
          const auto sizes = allgather_value(comm, static_cast<std::int64_t>(selection.size()));
          std::int64_t total = 0;
          for (const std::int64_t size : sizes) total += size;
          EXPECT_NEAR(static_cast<double>(total), static_cast<double>(k),
                      std::max(1.0, options.tolerance * static_cast<double>(k)))
              << "step " << step;
          EXPECT_EQ(threshold.stats().selected, total);
          // The largest rank is at the cap.
          if (comm.rank() == 3) {
            EXPECT_EQ(selection.size(), cap);
          }
        });
  }
}

TEST(StepThreshold, BadOptionsAreRejected) {
  StepThresholdOptions bad;
  bad.margin = 0.5;
  EXPECT_THROW(StepThreshold{bad}, InvalidArgument);
  bad = {};
  bad.max_rounds = 0;
  EXPECT_THROW(StepThreshold{bad}, InvalidArgument);
  bad = {};
  bad.cap = 0.5;
  EXPECT_THROW(StepThreshold{bad}, InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm
