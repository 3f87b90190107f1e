// Small tensors sent densely (sync/dense_layers.h): the tensors the rule
// picks get exactly the dense ring average, the others exactly what the
// method gives when it runs alone on them packed, step after step, with
// memory, resume and the non-finite policies intact.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "error_message.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/sync/dense_layers.h"
#include "sparsecomm/sync/tensor_buckets.h"
#include "sync_checks.h"

namespace sparsecomm {
namespace {

using testing::error_message;
using testing::sync_input;

constexpr int kRanks = 4;

// Weights and biases interleaved: the sparse tensors are three runs (packed).
const std::vector<LayerSpan> kInterleaved = {{"conv1.weight", 0, 40},   {"conv1.bias", 40, 4},
                                             {"conv2.weight", 44, 300}, {"conv2.bias", 344, 8},
                                             {"fc.weight", 352, 600},   {"fc.bias", 952, 10}};
// The dense tensor last: the sparse ones are one run (synchronized in place).
const std::vector<LayerSpan> kTrailing = {{"w1", 0, 500}, {"w2", 500, 450}, {"head.b", 950, 12}};

std::size_t numel_of(std::span<const LayerSpan> layers) {
  return layers.back().offset + layers.back().size;
}

std::vector<float> gradient_of(int rank, std::int64_t step, std::size_t numel) {
  std::vector<float> g(numel);
  for (std::size_t i = 0; i < numel; ++i) g[i] = sync_input(rank, step, i);
  return g;
}

StepContext context_of(const Communicator& comm, std::int64_t step,
                       std::span<const LayerSpan> layers) {
  StepContext ctx;
  ctx.step = step;
  ctx.rank = comm.rank();
  ctx.world = comm.size();
  ctx.layers = layers;
  return ctx;
}

SchemeOptions options_of(const std::string& extra, const std::string& method = "topk") {
  SchemeOptions options;
  // Skip-Reduce takes no density; min_elements=0 makes it prune this small gradient.
  options.set(method == "skipreduce" ? "min_elements=0" : "density=0.05");
  options.set("seed=5");
  if (!extra.empty()) options.set(extra);
  return options;
}

// The positions of `layers` that `rule` sends densely (true) or not.
std::vector<bool> dense_mask(const DenseLayerRule& rule, std::span<const LayerSpan> layers) {
  std::vector<bool> mask(numel_of(layers));
  for (const LayerSpan& layer : layers) {
    std::fill(mask.begin() + layer.offset, mask.begin() + layer.offset + layer.size,
              rule.matches(layer));
  }
  return mask;
}

// The tensors the rule leaves to the method, packed, with packed offsets.
std::vector<LayerSpan> packed_layers(const DenseLayerRule& rule,
                                     std::span<const LayerSpan> layers) {
  std::vector<LayerSpan> out;
  std::size_t at = 0;
  for (const LayerSpan& layer : layers) {
    if (rule.matches(layer)) continue;
    out.push_back({layer.name, at, layer.size});
    at += layer.size;
  }
  return out;
}

std::vector<float> select(std::span<const float> values, const std::vector<bool>& mask,
                          bool dense) {
  std::vector<float> out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (mask[i] == dense) out.push_back(values[i]);
  }
  return out;
}

struct Case {
  std::string method;
  std::string extra;
  bool trailing = false;  // kTrailing (in place) instead of kInterleaved (packed)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.method << (c.extra.empty() ? "" : "_" + c.extra)
      << (c.trailing ? "_in_place" : "_packed");
}

class DenseLayersTest : public ::testing::TestWithParam<Case> {};

TEST_P(DenseLayersTest, DenseTensorsGetTheRingAverageAndTheRestTheMethodAlone) {
  const Case c = GetParam();
  const std::vector<LayerSpan>& layers = c.trailing ? kTrailing : kInterleaved;
  DenseLayerRule rule;
  rule.min_numel = 16;
  const std::vector<bool> mask = dense_mask(rule, layers);
  const std::vector<LayerSpan> packed = packed_layers(rule, layers);
  const std::size_t numel = numel_of(layers);
  run_thread_world(kRanks, [&](Communicator& comm) {
    auto sync = with_dense_layers(make_gradient_sync(c.method, options_of(c.extra, c.method)), rule,
                                  NonFinitePolicy::kStop);
    auto alone = make_gradient_sync(c.method, options_of(c.extra, c.method));
    auto dense = make_gradient_sync("dense", SchemeOptions{});
    for (std::int64_t t = 0; t < 6; ++t) {
      std::vector<float> g = gradient_of(comm.rank(), t, numel);
      std::vector<float> sparse_part = select(g, mask, false);
      std::vector<float> dense_part = select(g, mask, true);
      const StepMetrics m = sync->synchronize(g, context_of(comm, t, layers), comm);
      const StepMetrics ms = alone->synchronize(sparse_part, context_of(comm, t, packed), comm);
      const StepMetrics md = dense->synchronize(dense_part, context_of(comm, t, {}), comm);

      EXPECT_EQ(select(g, mask, false), sparse_part) << "step " << t;
      EXPECT_EQ(select(g, mask, true), dense_part) << "step " << t;
      EXPECT_EQ(m.numel, numel);
      EXPECT_EQ(m.dense_numel, dense_part.size());
      EXPECT_EQ(m.target, ms.target);  // k counts only the sparsified tensors
      EXPECT_EQ(m.union_size, ms.union_size);
      EXPECT_EQ(m.bytes_sent, ms.bytes_sent + md.bytes_sent);
      const std::span<const float> kept = sync->kept();
      ASSERT_EQ(kept.size(), numel);
      EXPECT_EQ(select(kept, mask, false),
                std::vector<float>(alone->kept().begin(), alone->kept().end()));
      EXPECT_EQ(select(kept, mask, true), std::vector<float>(dense_part.size(), 0.0f));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Methods, DenseLayersTest,
                         ::testing::Values(Case{"topk", "", false}, Case{"topk", "", true},
                                           Case{"exdyna", "", false}, Case{"exdyna", "", true},
                                           Case{"deft", "", false}, Case{"randomk", "", false},
                                           Case{"skipreduce", "memory=ef", false}));

TEST(DenseLayers, NamePatternsAndSizesPickTheTensors) {
  DenseLayerRule rule;
  rule.patterns = {"*.bias", "fc.*"};
  EXPECT_TRUE(rule.matches({"conv1.bias", 0, 4000}));
  EXPECT_TRUE(rule.matches({"fc.weight", 0, 4000}));
  EXPECT_FALSE(rule.matches({"conv1.weight", 0, 4000}));
  rule.min_numel = 100;
  EXPECT_TRUE(rule.matches({"conv1.weight", 0, 99}));
  EXPECT_FALSE(rule.matches({"conv1.weight", 0, 100}));
  EXPECT_TRUE(DenseLayerRule{}.empty());
}

TEST(DenseLayers, TheDenseCountSumsThePickedTensorsAndRefusesRulesThatPickNoneOrAll) {
  DenseLayerRule rule;
  EXPECT_EQ(dense_numel(rule, kInterleaved, "toy"), 0u);
  rule.min_numel = 16;  // the three biases
  EXPECT_EQ(dense_numel(rule, kInterleaved, "toy"), 4u + 8 + 10);
  rule.patterns = {"fc.*"};  // and fc.weight
  EXPECT_EQ(dense_numel(rule, kInterleaved, "toy"), 4u + 8 + 10 + 600);
  rule.patterns = {"fc.*", "nosuch*"};
  const std::string unmatched = error_message([&] { dense_numel(rule, kInterleaved, "toy"); });
  EXPECT_NE(unmatched.find("--exclude 'nosuch*' matches no tensor of the toy model; its tensors "
                           "(elements) are: conv1.weight (40), conv1.bias (4)"),
            std::string::npos)
      << unmatched;
  rule = DenseLayerRule{};
  rule.min_numel = 1000;
  EXPECT_NE(error_message([&] {
              dense_numel(rule, kInterleaved, "toy");
            }).find("--min-numel 1000 leaves no tensor of the toy model to sparsify"),
            std::string::npos);
}

// The trainer's DataParallel and the Python hook both group tensors so.
TEST(TensorBuckets, BucketsCloseAtTheirSizeFromTheLastTensorBack) {
  const std::vector<std::size_t> bytes = {2560, 128, 512, 16};
  auto ranges = [&](std::size_t cap) {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (const Range& r : tensor_buckets(bytes, cap)) out.emplace_back(r.begin, r.end);
    return out;
  };
  using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;
  EXPECT_EQ(ranges(0), (Ranges{{0, 4}}));  // no cap: one bucket, the tensors in order
  EXPECT_EQ(ranges(104), (Ranges{{2, 4}, {1, 2}, {0, 1}}));  // 16 + 512, 128, 2560
  EXPECT_EQ(ranges(600), (Ranges{{1, 4}, {0, 1}}));          // 656, then what is left
  EXPECT_EQ(ranges(1 << 20), (Ranges{{0, 4}}));              // the last bucket: the rest
  EXPECT_TRUE(tensor_buckets({}, 100).empty());
}

TEST(DenseLayers, AnEmptyRuleOrTheDenseMethodIsLeftAlone) {
  auto topk = make_gradient_sync("topk", options_of(""));
  GradientSync* raw = topk.get();
  EXPECT_EQ(with_dense_layers(std::move(topk), DenseLayerRule{}, NonFinitePolicy::kStop).get(),
            raw);
  DenseLayerRule rule;
  rule.min_numel = 10;
  auto dense = make_gradient_sync("dense", SchemeOptions{});
  raw = dense.get();
  EXPECT_EQ(with_dense_layers(std::move(dense), rule, NonFinitePolicy::kStop).get(), raw);
}

TEST(DenseLayers, BadRulesAndLayoutsAreRefused) {
  DenseLayerRule rule;
  rule.min_numel = 16;
  // DGC's momentum correction: the dense tensors would get no momentum.
  EXPECT_NE(error_message([&] {
              with_dense_layers(make_gradient_sync("dgc", options_of("")), rule,
                                NonFinitePolicy::kStop);
            }).find("no momentum"),
            std::string::npos);
  DenseLayerRule empty_pattern;
  empty_pattern.patterns = {""};
  EXPECT_THROW(with_dense_layers(make_gradient_sync("topk", options_of("")), empty_pattern,
                                 NonFinitePolicy::kStop),
               InvalidArgument);
  run_thread_world(1, [&](Communicator& comm) {
    auto sync =
        with_dense_layers(make_gradient_sync("topk", options_of("")), rule, NonFinitePolicy::kStop);
    std::vector<float> g(100, 1.0f);
    // No layout, a layout with a gap, a layout that does not reach the end.
    EXPECT_NE(error_message([&] {
                sync->synchronize(g, context_of(comm, 0, {}), comm);
              }).find("tensor layout"),
              std::string::npos);
    const std::vector<LayerSpan> gap = {{"a", 0, 40}, {"b", 50, 50}};
    EXPECT_THROW(sync->synchronize(g, context_of(comm, 0, gap), comm), InvalidArgument);
    const std::vector<LayerSpan> short_layout = {{"a", 0, 40}, {"b", 40, 50}};
    EXPECT_THROW(sync->synchronize(g, context_of(comm, 0, short_layout), comm), InvalidArgument);
  });
}

TEST(DenseLayers, ABucketOfDenseTensorsOnlyIsAveraged) {
  DenseLayerRule rule;
  rule.patterns = {"*"};
  const std::vector<LayerSpan> layers = {{"b1", 0, 5}, {"b2", 5, 7}};
  run_thread_world(kRanks, [&](Communicator& comm) {
    auto sync =
        with_dense_layers(make_gradient_sync("topk", options_of("")), rule, NonFinitePolicy::kStop);
    auto dense = make_gradient_sync("dense", SchemeOptions{});
    std::vector<float> g = gradient_of(comm.rank(), 0, 12);
    std::vector<float> expected = g;
    const StepMetrics m = sync->synchronize(g, context_of(comm, 0, layers), comm);
    dense->synchronize(expected, context_of(comm, 0, {}), comm);
    EXPECT_EQ(g, expected);
    EXPECT_EQ(m.numel, 12u);
    EXPECT_EQ(m.dense_numel, 12u);
    EXPECT_EQ(m.target, 0u);
  });
}

// A NaN in a dense tensor on one rank skips the whole step on every rank
// (skip) or stops every rank (stop); the method's memory does not move.
TEST(DenseLayers, ANonFiniteDenseTensorSkipsOrStopsTheWholeStep) {
  DenseLayerRule rule;
  rule.min_numel = 16;
  const std::size_t numel = numel_of(kInterleaved);
  run_thread_world(kRanks, [&](Communicator& comm) {
    auto sync =
        with_dense_layers(make_gradient_sync("topk", options_of(""), NonFinitePolicy::kSkip), rule,
                          NonFinitePolicy::kSkip);
    std::vector<float> g = gradient_of(comm.rank(), 0, numel);
    sync->synchronize(g, context_of(comm, 0, kInterleaved), comm);
    const std::vector<float> kept_before(sync->kept().begin(), sync->kept().end());
    g = gradient_of(comm.rank(), 1, numel);
    if (comm.rank() == 2) g[41] = std::numeric_limits<float>::quiet_NaN();  // conv1.bias
    const StepMetrics m = sync->synchronize(g, context_of(comm, 1, kInterleaved), comm);
    EXPECT_TRUE(m.skipped_nonfinite);
    EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
    EXPECT_EQ(std::vector<float>(sync->kept().begin(), sync->kept().end()), kept_before);
  });
  run_thread_world(kRanks, [&](Communicator& comm) {
    auto sync =
        with_dense_layers(make_gradient_sync("topk", options_of("")), rule, NonFinitePolicy::kStop);
    std::vector<float> g = gradient_of(comm.rank(), 0, numel);
    if (comm.rank() == 1) g[953] = std::numeric_limits<float>::infinity();  // fc.bias
    EXPECT_THROW(sync->synchronize(g, context_of(comm, 0, kInterleaved), comm), NonFiniteGradient);
  });
}

TEST(DenseLayers, ASavedStateResumesExactly) {
  DenseLayerRule rule;
  rule.min_numel = 16;
  const std::size_t numel = numel_of(kInterleaved);
  run_thread_world(kRanks, [&](Communicator& comm) {
    auto make = [&] {
      return with_dense_layers(make_gradient_sync("exdyna", options_of("")), rule,
                               NonFinitePolicy::kStop);
    };
    auto straight = make();
    auto resumed = make();
    std::vector<std::byte> saved;
    for (std::int64_t t = 0; t < 6; ++t) {
      std::vector<float> a = gradient_of(comm.rank(), t, numel);
      straight->synchronize(a, context_of(comm, t, kInterleaved), comm);
      if (t < 3) {
        std::vector<float> b = gradient_of(comm.rank(), t, numel);
        resumed->synchronize(b, context_of(comm, t, kInterleaved), comm);
        if (t == 2) {
          StateWriter writer;
          resumed->save(writer);
          saved = writer.bytes();
          resumed = make();
          StateReader reader(saved);
          resumed->load(reader);
        }
      } else {
        std::vector<float> b = gradient_of(comm.rank(), t, numel);
        resumed->synchronize(b, context_of(comm, t, kInterleaved), comm);
        EXPECT_EQ(a, b) << "step " << t;
      }
    }
    EXPECT_EQ(std::vector<float>(straight->kept().begin(), straight->kept().end()),
              std::vector<float>(resumed->kept().begin(), resumed->kept().end()));
  });
}

}  // namespace
}  // namespace sparsecomm
