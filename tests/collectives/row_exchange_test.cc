// Row-sparse gradients summed over ranks on the thread backend: the checks
// of row_exchange_checks.h over world sizes 1, 2, 3, 4, 7, and what needs a
// failing world (bad input, disagreeing ranks, rogue bytes).

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/row_exchange_checks.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::testing {
namespace {

constexpr std::chrono::milliseconds kWorldTimeout{20000};

class RowSparseSum : public ::testing::TestWithParam<int> {};

TEST_P(RowSparseSum, BothMethodsGiveEveryRankTheRankOrderSumOfEveryTouchedRow) {
  run_thread_world(GetParam(), check_row_sparse_sums, kWorldTimeout);
}

std::string world_name(const ::testing::TestParamInfo<int>& world) {
  std::string name = "n";  // (not "n" + ...: a false -Wrestrict of GCC 12 at -O3)
  name += std::to_string(world.param);
  return name;
}

INSTANTIATE_TEST_SUITE_P(Worlds, RowSparseSum, ::testing::Values(1, 2, 3, 4, 7), world_name);

class RowOwners : public ::testing::TestWithParam<int> {};

TEST_P(RowOwners, PushSumsEachRangeOnItsOwnerAndPullReturnsEveryWantedRow) {
  run_thread_world(GetParam(), check_row_owners, kWorldTimeout);
}

INSTANTIATE_TEST_SUITE_P(Worlds, RowOwners, ::testing::Values(1, 2, 3, 4, 7), world_name);

// Bad wanted rows or a shard of the wrong size: InvalidArgument on every
// rank before any message (every rank passes the same bad input).
TEST(RowOwners, BadPullsAreRejectedBeforeAnyMessage) {
  const auto expect_throw = [](std::vector<Index> ids, std::size_t shard_floats) {
    std::atomic<int> thrown = 0;
    run_thread_world(
        2,
        [&](Communicator& comm) {
          const std::vector<float> shard(shard_floats);
          RowSparse out;
          try {
            pull_rows_from_owners(comm, ids, shard, 10, 2, out);
          } catch (const InvalidArgument&) {
            ++thrown;
          }
        },
        kWorldTimeout);
    EXPECT_EQ(thrown.load(), 2);
  };
  expect_throw({3, 2}, 10);   // not ascending
  expect_throw({3, 3}, 10);   // repeated
  expect_throw({3, 10}, 10);  // past the table
  expect_throw({3}, 8);       // a range of 5 rows x 2 floats is 10
}

TEST(RowExchange, MalformedGradientsAreRejectedOnEveryRankBeforeAnyMessage) {
  RowSparse unsorted;
  unsorted.reset(10, 1);
  unsorted.ids = {3, 2};
  unsorted.values = {1, 1};
  RowSparse out_of_range = unsorted;
  out_of_range.ids = {2, 10};
  RowSparse short_values = unsorted;
  short_values.ids = {2, 3};
  short_values.values = {1};
  for (const RowSparse* bad : {&unsorted, &out_of_range, &short_values}) {
    // Every rank passes the bad gradient: every rank throws, nobody waits.
    run_thread_world(
        3,
        [&](Communicator& comm) {
          RowSparse sum;
          EXPECT_THROW(row_sparse_sum(comm, *bad, RowExchange::kAllgather, sum), InvalidArgument);
        },
        kWorldTimeout);
  }
}

TEST(RowExchange, RanksWithDifferentTablesAllThrowTheSameError) {
  for (const RowExchange method : {RowExchange::kAllgather, RowExchange::kSparseAllreduce}) {
    run_thread_world(
        3,
        [&](Communicator& comm) {
          RowSparse mine;
          mine.reset(comm.rank() == 2 ? 11 : 10, 4);
          RowSparse sum;
          try {
            row_sparse_sum(comm, mine, method, sum);
            ADD_FAILURE() << "rank " << comm.rank() << ": different tables accepted";
          } catch (const InvalidArgument& e) {
            EXPECT_NE(std::string(e.what()).find("rank 0 has 10 x 4, rank 2 has 11 x 4"),
                      std::string::npos)
                << e.what();
          }
        },
        kWorldTimeout);
  }
}

TEST(RowExchange, ParsesAndNamesTheMethods) {
  for (const RowExchange m : {RowExchange::kAllgather, RowExchange::kSparseAllreduce})
    EXPECT_EQ(parse_row_exchange(row_exchange_name(m)), m);
  try {
    parse_row_exchange("densify");
    ADD_FAILURE() << "densify accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("allgather, sparse-allreduce"), std::string::npos)
        << e.what();
  }
}

// Rank 1 plays a rogue peer of the allgather: a valid header, then a block
// that does not match it.
TEST(RowExchange, MalformedBlocksFromAPeerAreCommErrorsNamingIt) {
  constexpr std::size_t kRows = 10;
  struct Rogue {
    std::uint64_t count;
    std::vector<std::uint8_t> block;  // [varint ids][count x 4 bytes]
  };
  const std::vector<Rogue> rogues{
      {1, {50, 0, 0, 128, 63}},          // id 50 >= 10 rows
      {2, {3, 0, 0, 0, 0, 0, 0, 0, 0}},  // block too small for two rows
      {1, {1, 2, 0, 0, 128, 63}},        // a trailing index byte: 2 varints for 1 id
  };
  for (const Rogue& rogue : rogues) {
    try {
      run_thread_world(
          2,
          [&](Communicator& comm) {
            if (comm.rank() == 0) {
              RowSparse mine;
              mine.reset(kRows, 1);
              mine.ids = {4};
              mine.values = {1.0f};
              RowSparse sum;
              row_sparse_sum(comm, mine, RowExchange::kAllgather, sum);
              return;
            }
            const std::array<std::uint64_t, 4> header{rogue.count, rogue.block.size(), kRows, 1};
            std::vector<std::uint64_t> headers(8);
            comm.allgather(bytes_of(std::span<const std::uint64_t>(header)),
                           writable_bytes_of(std::span<std::uint64_t>(headers)));
            const std::vector<std::size_t> byte_counts{static_cast<std::size_t>(headers[1]),
                                                       rogue.block.size()};
            std::vector<std::byte> recv(byte_counts[0] + byte_counts[1]);
            comm.allgatherv(std::as_bytes(std::span<const std::uint8_t>(rogue.block)), recv,
                            byte_counts);
          },
          kWorldTimeout);
      ADD_FAILURE() << "malformed block of " << rogue.count << " rows accepted";
    } catch (const PeerFailure& e) {
      ADD_FAILURE() << e.what();
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace sparsecomm::testing
