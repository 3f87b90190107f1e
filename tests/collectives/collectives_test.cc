// The collectives on the thread backend: every check of collective_checks.h
// over a sweep of world sizes, plus what needs no world (schedules) or needs
// a world that fails (mismatched sizes).

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/collective_checks.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/skip_reduce.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::testing {
namespace {

using std::chrono::milliseconds;

// Generous for a correct run on 2 busy cores, short enough that a hang fails fast.
constexpr milliseconds kWorldTimeout{20000};

std::string world_name(const ::testing::TestParamInfo<int>& info) {
  return "n" + std::to_string(info.param);
}

TEST(AllreduceAlgorithm, ParsesAndNames) {
  EXPECT_EQ(parse_allreduce_algorithm("ring"), AllreduceAlgorithm::kRing);
  EXPECT_EQ(parse_allreduce_algorithm("native"), AllreduceAlgorithm::kNative);
  EXPECT_EQ(allreduce_algorithm_name(AllreduceAlgorithm::kRing), "ring");
  EXPECT_EQ(allreduce_algorithm_name(AllreduceAlgorithm::kNative), "native");
  EXPECT_EQ(parse_allreduce_algorithm("recursive-doubling"),
            AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(allreduce_algorithm_name(AllreduceAlgorithm::kRecursiveDoubling), "recursive-doubling");
  EXPECT_THROW(parse_allreduce_algorithm("tree"), InvalidArgument);
}

TEST(ChunkBegin, SplitsIntoNearEqualContiguousChunks) {
  for (const std::size_t numel : {0, 1, 3, 7, 8, 1000, 1001}) {
    for (int parts = 1; parts <= 8; ++parts) {
      EXPECT_EQ(chunk_begin(numel, parts, 0), 0u);
      EXPECT_EQ(chunk_begin(numel, parts, parts), numel);
      for (int c = 0; c < parts; ++c) {
        const std::size_t len = chunk_begin(numel, parts, c + 1) - chunk_begin(numel, parts, c);
        const std::size_t base = numel / static_cast<std::size_t>(parts);
        const bool extra = static_cast<std::size_t>(c) < numel % static_cast<std::size_t>(parts);
        EXPECT_EQ(len, base + (extra ? 1 : 0)) << numel << " / " << parts << " chunk " << c;
      }
    }
  }
  EXPECT_THROW(chunk_begin(10, 0, 0), InvalidArgument);
  EXPECT_THROW(chunk_begin(10, 4, 5), InvalidArgument);
}

class RingAllreduceTest : public ::testing::TestWithParam<int> {};

TEST_P(RingAllreduceTest, SumsExactlyForEverySizeAndSegmentSize) {
  run_thread_world(
      GetParam(), [](Communicator& comm) { check_ring_sweep(comm); }, kWorldTimeout);
}

TEST_P(RingAllreduceTest, AHalfWireSendsHalfTheBytesAndAgreesOnEveryRank) {
  run_thread_world(
      GetParam(), [](Communicator& comm) { check_half_wire_ring(comm); }, kWorldTimeout);
}

TEST_P(RingAllreduceTest, RejectsInvalidArguments) {
  run_thread_world(
      GetParam(), [](Communicator& comm) { check_invalid_arguments(comm); }, kWorldTimeout);
}

TEST_P(RingAllreduceTest, NativeIsNotSupportedOnThreads) {
  run_thread_world(
      GetParam(),
      [](Communicator& comm) {
        std::vector<float> data(10, 1.0f);
        AllreduceOptions options;
        options.algorithm = AllreduceAlgorithm::kNative;
        if (comm.size() == 1) {
          // Nothing to reduce: a world of one never reaches the backend.
          EXPECT_NO_THROW(allreduce(comm, std::span<float>(data), options));
        } else {
          EXPECT_THROW(allreduce(comm, std::span<float>(data), options), NotSupported);
        }
      },
      kWorldTimeout);
}

INSTANTIATE_TEST_SUITE_P(Worlds, RingAllreduceTest, ::testing::Values(1, 2, 3, 4, 7, 8),
                         world_name);

class RecursiveDoublingTest : public ::testing::TestWithParam<int> {};

// Powers of two and not (folding): the exact sum on every rank.
TEST_P(RecursiveDoublingTest, SumsExactlyOnEveryWorldSize) {
  run_thread_world(
      GetParam(), [](Communicator& comm) { check_recursive_doubling_sweep(comm); }, kWorldTimeout);
}

INSTANTIATE_TEST_SUITE_P(Worlds, RecursiveDoublingTest, ::testing::Range(1, 10), world_name);

TEST(RingAllreduce, MismatchedSizesAreACommErrorNotAHang) {
  // Rank 0 passes one element more, so some chunk boundaries differ: the
  // backend reports the first message whose size the two ends disagree on.
  for (const std::size_t segment : {std::size_t{64}, kDefaultSegmentBytes}) {
    EXPECT_THROW(run_thread_world(
                     3,
                     [&](Communicator& comm) {
                       std::vector<float> data(comm.rank() == 0 ? 1001 : 1000, 1.0f);
                       AllreduceOptions options;
                       options.segment_bytes = segment;
                       allreduce(comm, std::span<float>(data), options);
                     },
                     milliseconds(2000)),
                 CommError);
  }
  // Rank 0 passes nothing at all.
  EXPECT_THROW(run_thread_world(
                   4,
                   [](Communicator& comm) {
                     std::vector<float> data(comm.rank() == 0 ? 0 : 100, 1.0f);
                     skip_reduce(comm, std::span<float>(data), SkipReduceOptions{});
                   },
                   milliseconds(2000)),
               CommError);
}

// --- Skip-Reduce: the schedule alone ---

TEST(SkipReduceSchedule, RejectsSkipOutsideTheWorld) {
  SkipReduceOptions options;
  options.skip = 4;
  EXPECT_THROW(skip_reduce_schedule(4, 1000, options), InvalidArgument);
  options.skip = -1;
  EXPECT_THROW(skip_reduce_schedule(4, 1000, options), InvalidArgument);
  options.skip = 0;
  EXPECT_THROW(skip_reduce_schedule(0, 1000, options), InvalidArgument);
  options.skip = 3;
  EXPECT_NO_THROW(skip_reduce_schedule(4, 1000, options));
  try {
    options.skip = 9;
    skip_reduce_schedule(4, 1000, options);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("skip 9"), std::string::npos) << message;
    EXPECT_NE(message.find("[0, 3]"), std::string::npos) << message;
  }
}

TEST(SkipReduceSchedule, IsAPureFunctionOfSeedStepAndBucket) {
  SkipReduceOptions options;
  options.skip = 2;
  options.min_elements = 0;
  options.seed = 99;
  std::vector<int> rotations;
  for (std::int64_t step = 0; step < 64; ++step) {
    options.step = step;
    const SkipSchedule a = skip_reduce_schedule(7, 1000, options);
    const SkipSchedule b = skip_reduce_schedule(7, 1000, options);
    EXPECT_EQ(a.rotation, b.rotation);
    rotations.push_back(a.rotation);
  }
  // 64 draws from 7 values cannot all be equal unless the step is ignored.
  EXPECT_NE(std::count(rotations.begin(), rotations.end(), rotations[0]), 64);
}

TEST(SkipReduceSchedule, ProtectsSmallAndUserListedBuffers) {
  SkipReduceOptions options;
  options.skip = 3;
  options.min_elements = 100;
  const SkipSchedule small = skip_reduce_schedule(4, 99, options);
  EXPECT_TRUE(small.protected_buffer);
  EXPECT_EQ(small.skip, 0);
  const SkipSchedule large = skip_reduce_schedule(4, 100, options);
  EXPECT_FALSE(large.protected_buffer);
  EXPECT_EQ(large.skip, 3);
  options.protect = true;
  const SkipSchedule user = skip_reduce_schedule(4, 100000, options);
  EXPECT_TRUE(user.protected_buffer);
  EXPECT_EQ(user.skip, 0);
  for (const SkipChunk& chunk : user.chunks) EXPECT_EQ(chunk.contributors, 4);
}

// Over many steps every rank is dropped equally often from every chunk
// position: for fixed (rank, chunk) the rotation is uniform over n values, of
// which exactly s drop the rank, so the count over T draws is
// Binomial(T, s/n). We allow 6 standard deviations (a false failure has
// probability ~2e-9 per cell; the seed is fixed, so the test is
// deterministic anyway). The rotation itself must be uniform too.
TEST(SkipReduceSchedule, DropsEveryRankEquallyOften) {
  constexpr int kDraws = 2000;
  for (const int n : {2, 4, 7, 8}) {
    for (int skip = 1; skip < n; ++skip) {
      SkipReduceOptions options;
      options.skip = skip;
      options.min_elements = 0;
      options.seed = 12345;
      options.bucket = 2;
      std::vector<int> dropped(static_cast<std::size_t>(n * n), 0);  // [rank][chunk]
      std::vector<int> rotations(static_cast<std::size_t>(n), 0);
      for (int step = 0; step < kDraws; ++step) {
        options.step = step;
        const SkipSchedule s = skip_reduce_schedule(n, 10000, options);
        ++rotations[static_cast<std::size_t>(s.rotation)];
        for (int c = 0; c < n; ++c) {
          for (int r = 0; r < n; ++r) {
            if (s.chunks[static_cast<std::size_t>(c)].dropped(r, n)) {
              ++dropped[static_cast<std::size_t>(r * n + c)];
            }
          }
        }
      }
      const double p = static_cast<double>(skip) / n;
      const double expected = kDraws * p;
      const double bound = 6.0 * std::sqrt(kDraws * p * (1.0 - p));
      for (int r = 0; r < n; ++r) {
        int total = 0;
        for (int c = 0; c < n; ++c) {
          const int count = dropped[static_cast<std::size_t>(r * n + c)];
          total += count;
          EXPECT_LE(std::fabs(count - expected), bound)
              << "n=" << n << " skip=" << skip << " rank " << r << " chunk " << c << ": dropped "
              << count << " times, expected " << expected << " +- " << bound;
        }
        // Per step a rank is dropped from exactly `skip` chunks.
        EXPECT_EQ(total, kDraws * skip) << "n=" << n << " skip=" << skip << " rank " << r;
      }
      const double q = 1.0 / n;
      const double rotation_bound = 6.0 * std::sqrt(kDraws * q * (1.0 - q));
      for (int v = 0; v < n; ++v) {
        EXPECT_LE(std::fabs(rotations[static_cast<std::size_t>(v)] - kDraws * q), rotation_bound)
            << "n=" << n << " rotation " << v;
      }
    }
  }
}

// --- Skip-Reduce on a world ---

class SkipReduceTest : public ::testing::TestWithParam<int> {};

TEST_P(SkipReduceTest, EachChunkSumsExactlyItsContributors) {
  run_thread_world(
      GetParam(), [](Communicator& comm) { check_skip_reduce_sweep(comm); }, kWorldTimeout);
}

TEST_P(SkipReduceTest, ProtectedBuffersAreSummedInFull) {
  run_thread_world(
      GetParam(), [](Communicator& comm) { check_skip_reduce_protection(comm); }, kWorldTimeout);
}

INSTANTIATE_TEST_SUITE_P(Worlds, SkipReduceTest, ::testing::Values(1, 2, 3, 4, 7, 8), world_name);

}  // namespace
}  // namespace sparsecomm::testing
