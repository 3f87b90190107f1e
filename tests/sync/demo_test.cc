// DeMo behind GradientSync (sync/demo.h) on thread ranks: the DCT basis is
// orthonormal, what a rank keeps plus what it sent is its momentum plus its
// gradient, every rank applies the same signs, the wire carries exactly
// chunks x topk entries, a saved state resumes bit for bit, and bad options
// and states are refused.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sync/demo.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sync/sync_checks.h"

namespace sparsecomm::testing {
namespace {

std::unique_ptr<GradientSync> demo(std::vector<std::string> options,
                                   NonFinitePolicy policy = NonFinitePolicy::kStop) {
  SchemeOptions parsed;
  for (const std::string& option : options) parsed.set(option);
  return make_gradient_sync("demo", parsed, policy);
}

// A 12 x 10 matrix (chunks of 16: seven whole and one of 8), a vector of 7
// (one short chunk) and 3 elements outside every layer.
const std::vector<LayerSpan> kLayers = {{"weight", 0, 120, 12}, {"bias", 120, 7, 0}};
constexpr std::size_t kNumel = 130;
constexpr std::size_t kChunks = 8 + 1 + 1;

std::vector<float> input_of(int rank, int step) {
  std::vector<float> g(kNumel);
  for (std::size_t i = 0; i < kNumel; ++i) g[i] = sync_input(rank, step, i);
  return g;
}

StepMetrics step(GradientSync& sync, std::vector<float>& gradient, int step, Communicator& comm) {
  StepContext ctx;
  ctx.step = step;
  ctx.world = comm.size();
  ctx.layers = kLayers;
  return sync.synchronize(gradient, ctx, comm);
}

TEST(DctBasis, IsOrthonormal) {
  for (const std::size_t length : {2u, 7u, 64u}) {
    const DctBasis basis(length);
    for (std::size_t a = 0; a < length; ++a) {
      for (std::size_t b = 0; b < length; ++b) {
        double dot = 0.0;
        for (std::size_t j = 0; j < length; ++j) dot += double{basis.row(a)[j]} * basis.row(b)[j];
        EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5) << length << ": " << a << ", " << b;
      }
    }
  }
}

TEST(DeMo, EveryCoefficientSentWithoutMomentumIsThePlainMean) {
  for (const int n : {1, 3}) {
    run_thread_world(n, [&](Communicator& comm) {
      auto sync = demo({"chunk=16", "topk=16", "momentum=0", "sign=false"});
      std::vector<float> gradient = input_of(comm.rank(), 0);
      const auto locals = gather_all<float>(comm, gradient);
      step(*sync, gradient, 0, comm);
      for (std::size_t i = 0; i < kNumel; ++i) {
        double mean = 0.0;
        for (const auto& g : locals) mean += g[i];
        EXPECT_NEAR(gradient[i], mean / n, 1e-5) << "n=" << n << " element " << i;
      }
      for (const float kept : sync->kept()) EXPECT_NEAR(kept, 0.0f, 1e-6f);
    });
  }
}

TEST(DeMo, KeepsWhatItDidNotSendAndEveryRankAppliesTheSameSigns) {
  constexpr double kBeta = 0.9;
  for (const int n : {1, 2, 4}) {
    run_thread_world(n, [&](Communicator& comm) {
      auto plain = demo({"chunk=16", "topk=2", "momentum=0.9", "sign=false"});
      auto signed_ = demo({"chunk=16", "topk=2", "momentum=0.9"});
      std::vector<float> before(kNumel, 0.0f);
      for (int t = 0; t < 6; ++t) {
        std::vector<float> gradient = input_of(comm.rank(), t);
        std::vector<float> direction = gradient;
        const StepMetrics m = step(*plain, gradient, t, comm);
        step(*signed_, direction, t, comm);
        EXPECT_EQ(m.selected, 8 * 2 + 2 + 2u);
        EXPECT_EQ(m.target, m.selected);
        // 20 fp32 values and 20 positions of 4 bits, to each of the n - 1 others.
        EXPECT_EQ(m.bytes_sent, (20 * 4 + 10u) * static_cast<std::uint64_t>(n - 1));
        EXPECT_EQ(m.index_bytes_raw, 10u);
        // Over the ranks: beta * kept before + g = kept after + sent, and the
        // mean of what was sent is what sign=false applies.
        const std::vector<float> local = input_of(comm.rank(), t);
        const std::vector<float> after(plain->kept().begin(), plain->kept().end());
        std::vector<double> sent(kNumel);
        for (std::size_t i = 0; i < kNumel; ++i) {
          sent[i] = kBeta * before[i] + local[i] - after[i];
        }
        const auto all_sent = gather_all<double>(comm, sent);
        for (std::size_t i = 0; i < kNumel; ++i) {
          double total = 0.0;
          for (const auto& s : all_sent) total += s[i];
          EXPECT_NEAR(gradient[i], total / n, 1e-5) << "n=" << n << " step " << t << " " << i;
          // sign=true applies the sign of that same mean.
          const double mean = total / n;
          if (std::fabs(mean) > 1e-5) {
            EXPECT_EQ(direction[i], mean > 0 ? 1.0f : -1.0f) << i;
          }
          EXPECT_TRUE(direction[i] == 1.0f || direction[i] == -1.0f || direction[i] == 0.0f);
        }
        before = after;
        for (const auto& other : gather_all<float>(comm, direction)) EXPECT_EQ(other, direction);
      }
    });
  }
}

TEST(DeMo, CodecsAndPositionWidthsSetTheBytes) {
  run_thread_world(2, [](Communicator& comm) {
    auto bf16 = demo({"chunk=16", "topk=1", "values=bf16"});
    std::vector<float> gradient = input_of(comm.rank(), 0);
    EXPECT_EQ(step(*bf16, gradient, 0, comm).bytes_sent, kChunks * 2 + 5u);  // 10 x 4 bits
    auto wide = demo({"chunk=300", "topk=1"});  // chunks of 120, 7 and 3: 9-bit positions
    gradient = input_of(comm.rank(), 0);
    EXPECT_EQ(step(*wide, gradient, 0, comm).bytes_sent, 3u * 4u + 4u);
    // The rule `plan` prices with (one message to the one other rank).
    EXPECT_EQ(demo_message_bytes(kNumel, kLayers, 16, 1, ValueEncoding::kBFloat16),
              kChunks * 2 + 5u);
    EXPECT_EQ(demo_message_bytes(kNumel, kLayers, 300, 1, ValueEncoding::kFloat32), 3u * 4u + 4u);
    EXPECT_EQ(demo_message_bytes(kNumel, kLayers, 16, 2, ValueEncoding::kFloat32), 20 * 4 + 10u);
  });
}

TEST(DeMo, ResumesFromASavedStateBitForBit) {
  run_thread_world(2, [](Communicator& comm) {
    auto first = demo({"chunk=16", "topk=2", "values=int8-sr"});
    for (int t = 0; t < 3; ++t) {
      std::vector<float> g = input_of(comm.rank(), t);
      step(*first, g, t, comm);
    }
    StateWriter writer;
    first->save(writer);
    auto second = demo({"chunk=16", "topk=2", "values=int8-sr"});
    StateReader reader(writer.bytes());
    second->load(reader);
    for (int t = 3; t < 6; ++t) {
      std::vector<float> a = input_of(comm.rank(), t);
      std::vector<float> b = a;
      step(*first, a, t, comm);
      step(*second, b, t, comm);
      EXPECT_EQ(a, b) << "step " << t;
      EXPECT_TRUE(std::equal(first->kept().begin(), first->kept().end(), second->kept().begin()));
    }
    auto other_chunk = demo({"chunk=32"});
    StateReader again(writer.bytes());
    EXPECT_THROW(other_chunk->load(again), Error);
  });
}

TEST(DeMo, SkipsANonFiniteStepWithoutTouchingItsMomentum) {
  run_thread_world(2, [](Communicator& comm) {
    auto sync = demo({"chunk=16"}, NonFinitePolicy::kSkip);
    std::vector<float> g = input_of(comm.rank(), 0);
    step(*sync, g, 0, comm);
    const std::vector<float> kept(sync->kept().begin(), sync->kept().end());
    g = input_of(comm.rank(), 1);
    if (comm.rank() == 1) g[5] = std::nanf("");
    EXPECT_TRUE(step(*sync, g, 1, comm).skipped_nonfinite);
    for (const float v : g) EXPECT_EQ(v, 0.0f);
    EXPECT_TRUE(std::equal(kept.begin(), kept.end(), sync->kept().begin()));
  });
}

TEST(DeMo, RefusesBadOptionsAndLayersOutsideTheGradient) {
  EXPECT_THROW(demo({"chunk=1"}), InvalidArgument);
  EXPECT_THROW(demo({"chunk=64", "topk=65"}), InvalidArgument);
  EXPECT_THROW(demo({"topk=0"}), InvalidArgument);
  EXPECT_THROW(demo({"momentum=1"}), InvalidArgument);
  EXPECT_THROW(demo({"values=fp8"}), InvalidArgument);
  EXPECT_THROW(demo({"density=0.01"}), InvalidArgument);
  EXPECT_TRUE(demo({})->applies_momentum());
  run_thread_world(1, [](Communicator& comm) {
    auto sync = demo({});
    std::vector<float> gradient(10, 1.0f);
    const std::vector<LayerSpan> outside = {{"w", 4, 12, 3}};
    StepContext ctx;
    ctx.layers = outside;
    EXPECT_THROW(sync->synchronize(gradient, ctx, comm), InvalidArgument);
  });
}

}  // namespace
}  // namespace sparsecomm::testing
