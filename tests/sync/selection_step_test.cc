// SelectionStep: the sparsify half of a step for callers with their own
// transport. Its selections, gathered and averaged, are exactly what
// SparsifyExchangeStep's all-gather exchange delivers, and its memory and
// state follow the same trajectory.

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/sync/selection_step.h"
#include "sync_checks.h"

namespace sparsecomm {
namespace {

using testing::gather_all;
using testing::sync_input;

constexpr std::size_t kNumel = 1000;
constexpr int kRanks = 4;
// DEFT's layers: a small one with a dominant norm, taken whole (a known range).
const std::vector<LayerSpan> kLayers = {{"hot", 0, 10}, {"rest", 10, kNumel - 10}};

struct Case {
  std::string scheme;
  std::vector<std::string> extra;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.scheme; }

SchemeOptions options_of(const Case& c, bool with_exchange) {
  SchemeOptions options;
  options.set("density=0.05");
  options.set("seed=17");
  if (with_exchange) options.set("exchange=allgather");
  for (const auto& e : c.extra) options.set(e);
  return options;
}

std::vector<float> gradient_of(int rank, std::int64_t step) {
  std::vector<float> g(kNumel);
  for (std::size_t i = 0; i < kNumel; ++i) {
    g[i] = i < 10 ? 1000.0f + static_cast<float>(i) : sync_input(rank, step, i);
  }
  return g;
}

StepContext context_of(const Communicator& comm, std::int64_t step) {
  StepContext ctx;
  ctx.step = step;
  ctx.rank = comm.rank();
  ctx.world = comm.size();
  ctx.layers = kLayers;
  return ctx;
}

class SelectionStepTest : public ::testing::TestWithParam<Case> {};

TEST_P(SelectionStepTest, GatheredSelectionsAreTheAllgatherExchange) {
  const Case c = GetParam();
  run_thread_world(kRanks, [&](Communicator& comm) {
    SparsifyExchangeStep reference(make_scheme(c.scheme, options_of(c, true)));
    SelectionStep step(make_scheme(c.scheme, options_of(c, false)));
    for (std::int64_t t = 0; t < 8; ++t) {
      const StepContext ctx = context_of(comm, t);
      std::vector<float> average = gradient_of(comm.rank(), t);
      reference.synchronize(average, ctx, comm);
      const std::vector<float> g = gradient_of(comm.rank(), t);
      const SparseSelection& mine = step.select(g, ctx, comm);
      EXPECT_FALSE(step.skipped());

      const std::span<const Index> sent = reference.last_exchange().transmitted;
      EXPECT_EQ(std::vector<Index>(mine.indices.begin(), mine.indices.end()),
                std::vector<Index>(sent.begin(), sent.end()))
          << "step " << t << ": this rank's indices, known ranges included";
      const std::span<const float> kept = step.kept();
      const std::span<const float> kept_reference = reference.kept();
      EXPECT_EQ(std::vector<float>(kept.begin(), kept.end()),
                std::vector<float>(kept_reference.begin(), kept_reference.end()))
          << "step " << t << ": the memory";
      const std::span<const std::size_t> counts = reference.last_exchange().counts;
      EXPECT_EQ(std::vector<std::size_t>(step.counts().begin(), step.counts().end()),
                std::vector<std::size_t>(counts.begin(), counts.end()))
          << "step " << t;

      // What a transport of the caller's own would deliver: every rank's
      // selection, summed in rank order and divided by n.
      const auto indices = gather_all<Index>(comm, mine.indices);
      const auto values = gather_all<float>(comm, mine.values);
      std::vector<float> sum(kNumel, 0.0f);
      for (int r = 0; r < kRanks; ++r) {
        for (std::size_t j = 0; j < indices[r].size(); ++j) sum[indices[r][j]] += values[r][j];
      }
      std::size_t bad = 0;
      for (std::size_t i = 0; i < kNumel; ++i) {
        const float expected = sum[i] / static_cast<float>(kRanks);
        bad +=
            std::abs(average[i] - expected) <= 1e-6f * std::max(1.0f, std::abs(expected)) ? 0 : 1;
      }
      EXPECT_EQ(bad, 0u) << "step " << t << ": positions where the average differs";
    }
  });
}

// Top-k's error feedback, the momentum memory, a random draw shared by all
// ranks, same-rank selection collectives (CLT-k), the partition schemes
// (which observe the counts) and DEFT's whole layers.
INSTANTIATE_TEST_SUITE_P(Schemes, SelectionStepTest,
                         ::testing::Values(Case{"topk", {}}, Case{"threshold", {"lambda=0.8"}},
                                           Case{"dgc", {}}, Case{"randomk", {}},
                                           Case{"gaussiank", {}}, Case{"cltk", {}},
                                           Case{"micro", {}}, Case{"exdyna", {}},
                                           Case{"exdyna", {"controller=quota"}},
                                           Case{"exdyna-faithful", {}}, Case{"deft", {}}),
                         [](const auto& test) {
                           std::string name = test.param.scheme;
                           for (const auto& extra : test.param.extra) name += "_" + extra;
                           for (char& ch : name)
                             ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return name;
                         });

// The state has SparsifyExchangeStep's layout: a run resumed from a
// reference checkpoint selects exactly what the uninterrupted one does.
TEST(SelectionStepState, ResumesFromEitherStepsCheckpoint) {
  const Case c{"exdyna", {}};
  run_thread_world(kRanks, [&](Communicator& comm) {
    SparsifyExchangeStep reference(make_scheme(c.scheme, options_of(c, true)));
    SelectionStep uninterrupted(make_scheme(c.scheme, options_of(c, false)));
    for (std::int64_t t = 0; t < 5; ++t) {
      std::vector<float> g = gradient_of(comm.rank(), t);
      uninterrupted.select(g, context_of(comm, t), comm);
      reference.synchronize(g, context_of(comm, t), comm);
    }
    StateWriter writer;
    reference.save(writer);
    SelectionStep resumed(make_scheme(c.scheme, options_of(c, false)));
    StateReader reader(writer.bytes());
    resumed.load(reader);
    for (std::int64_t t = 5; t < 10; ++t) {
      const std::vector<float> g = gradient_of(comm.rank(), t);
      const SparseSelection& a = uninterrupted.select(g, context_of(comm, t), comm);
      const std::vector<Index> expected(a.indices.begin(), a.indices.end());
      const SparseSelection& b = resumed.select(g, context_of(comm, t), comm);
      EXPECT_EQ(std::vector<Index>(b.indices.begin(), b.indices.end()), expected) << "step " << t;
    }
  });
}

TEST(SelectionStepNonFinite, EveryRankStopsOrSkipsWithTheMemoryUntouched) {
  for (const NonFinitePolicy policy : {NonFinitePolicy::kStop, NonFinitePolicy::kSkip}) {
    run_thread_world(3, [&](Communicator& comm) {
      SelectionStep step(make_scheme("topk", SchemeOptions{}), policy);
      step.select(gradient_of(comm.rank(), 0), context_of(comm, 0), comm);
      const std::vector<float> before(step.kept().begin(), step.kept().end());
      std::vector<float> g = gradient_of(comm.rank(), 1);
      if (comm.rank() == 2) g[5] = std::numeric_limits<float>::quiet_NaN();
      if (policy == NonFinitePolicy::kStop) {
        EXPECT_THROW(step.select(g, context_of(comm, 1), comm), NonFiniteGradient);
      } else {
        EXPECT_TRUE(step.select(g, context_of(comm, 1), comm).empty());
        EXPECT_TRUE(step.skipped());
      }
      EXPECT_EQ(std::vector<float>(step.kept().begin(), step.kept().end()), before);
    });
  }
}

}  // namespace
}  // namespace sparsecomm
