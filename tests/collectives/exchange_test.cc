// The exchange patterns on the thread backend: every check of
// exchange_checks.h over world sizes 1, 2, 3, 4, 7, 8, plus what needs a
// failing world (ranks that disagree).

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "collectives/exchange_checks.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::testing {
namespace {

// Generous for a correct run on 2 busy cores, short enough that a hang fails fast.
constexpr std::chrono::milliseconds kWorldTimeout{20000};

std::string world_name(const ::testing::TestParamInfo<int>& info) {
  return "n" + std::to_string(info.param);
}

TEST(ExchangePattern, ParsesAndNames) {
  for (const ExchangePattern p :
       {ExchangePattern::kUnionAllreduce, ExchangePattern::kSparseAllgather,
        ExchangePattern::kSparseAllreduce, ExchangePattern::kSharedIndices}) {
    EXPECT_EQ(parse_exchange_pattern(exchange_pattern_name(p)), p);
  }
  for (const SparseAllreduceAlgorithm a :
       {SparseAllreduceAlgorithm::kAuto, SparseAllreduceAlgorithm::kRecursiveDoubling,
        SparseAllreduceAlgorithm::kSplit}) {
    EXPECT_EQ(parse_sparse_allreduce_algorithm(sparse_allreduce_algorithm_name(a)), a);
  }
  try {
    parse_exchange_pattern("gossip");
    ADD_FAILURE() << "gossip accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("union, allgather, sparse-allreduce, shared"),
              std::string::npos)
        << e.what();
  }
  try {
    parse_sparse_allreduce_algorithm("tree");
    ADD_FAILURE() << "tree accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("auto, recursive-doubling, split"), std::string::npos)
        << e.what();
  }
}

class ExchangeTest : public ::testing::TestWithParam<int> {
 protected:
  void sweep(ExchangePattern pattern,
             SparseAllreduceAlgorithm algorithm = SparseAllreduceAlgorithm::kAuto) {
    run_thread_world(
        GetParam(),
        [&](Communicator& comm) { check_exchange_sweep(comm, pattern, algorithm, /*full=*/true); },
        kWorldTimeout);
  }
};

TEST_P(ExchangeTest, UnionAllreduce) { sweep(ExchangePattern::kUnionAllreduce); }
TEST_P(ExchangeTest, SharedIndices) { sweep(ExchangePattern::kSharedIndices); }
TEST_P(ExchangeTest, SparseAllgather) { sweep(ExchangePattern::kSparseAllgather); }
TEST_P(ExchangeTest, SparseAllreduceRecursiveDoubling) {
  sweep(ExchangePattern::kSparseAllreduce, SparseAllreduceAlgorithm::kRecursiveDoubling);
}
TEST_P(ExchangeTest, SparseAllreduceSplit) {
  sweep(ExchangePattern::kSparseAllreduce, SparseAllreduceAlgorithm::kSplit);
}
TEST_P(ExchangeTest, SparseAllreduceAuto) { sweep(ExchangePattern::kSparseAllreduce); }

TEST_P(ExchangeTest, SparseAllreduceAlgorithmsAgree) {
  run_thread_world(GetParam(), check_sparse_allreduce_algorithms_agree, kWorldTimeout);
}

TEST_P(ExchangeTest, ErrorFeedbackConservesMassOverSteps) {
  run_thread_world(
      GetParam(),
      [](Communicator& comm) {
        for (const ExchangePattern p :
             {ExchangePattern::kUnionAllreduce, ExchangePattern::kSharedIndices,
              ExchangePattern::kSparseAllgather, ExchangePattern::kSparseAllreduce}) {
          check_error_feedback_steps(comm, p);
        }
      },
      kWorldTimeout);
}

TEST_P(ExchangeTest, KnownRangesJoinTheUnionWithoutIndices) {
  run_thread_world(
      GetParam(),
      [](Communicator& comm) {
        for (const ValueEncoding values : {ValueEncoding::kFloat32, ValueEncoding::kFloat16}) {
          check_known_ranges(comm, ExchangePattern::kUnionAllreduce,
                             SparseAllreduceAlgorithm::kAuto, values);
          check_known_ranges(comm, ExchangePattern::kSharedIndices, SparseAllreduceAlgorithm::kAuto,
                             values);
          check_known_ranges(comm, ExchangePattern::kSparseAllgather,
                             SparseAllreduceAlgorithm::kAuto, values);
          check_known_ranges(comm, ExchangePattern::kSparseAllreduce,
                             SparseAllreduceAlgorithm::kRecursiveDoubling, values);
          check_known_ranges(comm, ExchangePattern::kSparseAllreduce,
                             SparseAllreduceAlgorithm::kSplit, values);
        }
      },
      kWorldTimeout);
}

TEST_P(ExchangeTest, RejectsInvalidArguments) {
  run_thread_world(GetParam(), check_exchange_rejects_invalid_arguments, kWorldTimeout);
}

INSTANTIATE_TEST_SUITE_P(Worlds, ExchangeTest, ::testing::Values(1, 2, 3, 4, 7, 8), world_name);

// Ranks that pass different vector lengths: every rank throws the same
// InvalidArgument after the first allgather (no rank is left waiting).
TEST(ExchangeErrors, RanksDisagreeingOnTheLengthAllThrow) {
  for (const ExchangePattern p :
       {ExchangePattern::kUnionAllreduce, ExchangePattern::kSparseAllgather,
        ExchangePattern::kSparseAllreduce}) {
    EXPECT_THROW(run_thread_world(
                     3,
                     [p](Communicator& comm) {
                       const auto exchanger = make_sparse_exchange(p, {});
                       const std::size_t numel = comm.rank() == 2 ? 11 : 10;
                       std::vector<float> a(numel, 1.0f), out(numel);
                       SparseSelection selection;
                       selection.indices = {1, 4};
                       ExchangeResult result;
                       exchanger->exchange(comm, selection, a, out, result);
                     },
                     kWorldTimeout),
                 InvalidArgument)
        << exchange_pattern_name(p);
  }
}

// A rank that sends a malformed block: the honest rank's exchange throws a
// CommError from the block decoder (exchange_message.h) naming the sender,
// instead of reading or writing out of bounds. Rank 1 plays the protocol's
// first messages by hand: header (count, payload bytes, d), then its block.
TEST(ExchangeErrors, MalformedBlocksFromAPeerAreCommErrors) {
  constexpr std::size_t kNumel = 10;
  struct Rogue {
    ExchangePattern pattern;
    bool encode_indices;
    std::uint64_t count;
    std::vector<std::uint8_t> block;
  };
  const std::vector<Rogue> rogues{
      {ExchangePattern::kUnionAllreduce, true, 4, {1, 2}},                     // truncated varints
      {ExchangePattern::kUnionAllreduce, true, 1, {50}},                       // index >= d
      {ExchangePattern::kUnionAllreduce, false, 2, {3, 0, 0, 0, 2, 0, 0, 0}},  // unsorted raw
      {ExchangePattern::kSparseAllgather, true, 1, {50, 0, 0, 128, 63}},       // index >= d
      {ExchangePattern::kSparseAllgather, true, 1, {0, 0, 0, 128}},  // too small for a value
  };
  for (const Rogue& rogue : rogues) {
    ExchangeOptions options;
    options.encode_indices = rogue.encode_indices;
    try {
      run_thread_world(
          2,
          [&](Communicator& comm) {
            if (comm.rank() == 0) {
              const auto exchanger = make_sparse_exchange(rogue.pattern, options);
              std::vector<float> a(kNumel, 1.0f), out(kNumel);
              SparseSelection selection;
              selection.indices = {1, 4};
              ExchangeResult result;
              exchanger->exchange(comm, selection, a, out, result);
              return;
            }
            const std::array<std::uint64_t, 3> header{rogue.count, rogue.block.size(), kNumel};
            std::vector<std::uint64_t> headers(6);
            comm.allgather(bytes_of(std::span<const std::uint64_t>(header)),
                           writable_bytes_of(std::span<std::uint64_t>(headers)));
            const std::vector<std::size_t> byte_counts{static_cast<std::size_t>(headers[1]),
                                                       rogue.block.size()};
            std::vector<std::byte> recv(byte_counts[0] + byte_counts[1]);
            comm.allgatherv(std::as_bytes(std::span<const std::uint8_t>(rogue.block)), recv,
                            byte_counts);
          },
          kWorldTimeout);
      ADD_FAILURE() << exchange_pattern_name(rogue.pattern) << ": malformed block accepted";
    } catch (const PeerFailure& e) {
      ADD_FAILURE() << e.what();
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0: from rank 1"), std::string::npos) << e.what();
    }
  }
}

#ifndef NDEBUG
TEST(ExchangeErrors, SharedPatternChecksSelectionsInDebugBuilds) {
  EXPECT_THROW(run_thread_world(
                   2,
                   [](Communicator& comm) {
                     const auto exchanger =
                         make_sparse_exchange(ExchangePattern::kSharedIndices, {});
                     std::vector<float> a(10, 1.0f), out(10);
                     SparseSelection selection;
                     selection.indices = {1, static_cast<Index>(4 + comm.rank())};
                     ExchangeResult result;
                     exchanger->exchange(comm, selection, a, out, result);
                   },
                   kWorldTimeout),
               InvalidArgument);
}
#endif

// The exchange reports what index encoding saved: at density 0.1% the
// varints take at most 60% of the raw 4 bytes per index.
TEST(ExchangeBytes, IndexEncodingSavesFortyPercentAtLowDensity) {
  run_thread_world(
      2,
      [](Communicator& comm) {
        const std::size_t numel = 1000000;
        SparseSelection selection;
        std::set<Index> chosen;
        std::uint64_t k = 0;
        while (chosen.size() < 1000)
          chosen.insert(static_cast<Index>(hash4(3, comm.rank(), k++, 0) % numel));
        for (const Index i : chosen) selection.indices.push_back(i);
        std::vector<float> a(numel, 0.5f), out(numel);
        for (const ExchangePattern p :
             {ExchangePattern::kUnionAllreduce, ExchangePattern::kSparseAllgather}) {
          const auto exchanger = make_sparse_exchange(p, {});
          ExchangeResult result;
          exchanger->exchange(comm, selection, a, out, result);
          EXPECT_EQ(result.index_bytes_raw, 4000u);
          EXPECT_LE(static_cast<double>(result.index_bytes_encoded), 0.6 * 4000.0)
              << exchange_pattern_name(p);
        }
      },
      kWorldTimeout);
}

}  // namespace
}  // namespace sparsecomm::testing
