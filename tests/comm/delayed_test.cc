// DelayedCommunicator: the Communicator contract holds through it, every
// message of a collective goes through its delay, run_world() wraps ranks
// in it when asked, and SPARSECOMM_MESSAGE_DELAY_US is parsed strictly.

#include "sparsecomm/comm/delayed.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <vector>

#include "comm/comm_checks.h"
#include "error_message.h"
#include "sparsecomm/comm/backend.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

using testing::error_message;

// Runs `check` on n thread ranks, each behind a 50 us delay, through run_world.
void run_delayed(int n, const std::function<void(Communicator&)>& check) {
  WorldOptions world;
  world.backend = BackendKind::kThread;
  world.ranks = n;
  world.timeout = std::chrono::seconds(20);
  world.message_delay = std::chrono::microseconds(50);
  run_world(world, check);
}

class DelayedTest : public ::testing::TestWithParam<int> {};

TEST_P(DelayedTest, KeepsTheCommunicatorContract) {
  for (const auto& check :
       {checks::check_ring_exchange, checks::check_ordering_per_source_and_tag,
        checks::check_tags_out_of_order, checks::check_zero_byte_messages, checks::check_barrier,
        checks::check_broadcast, checks::check_allgather, checks::check_allgatherv,
        checks::check_alltoallv, checks::check_native_allreduce, checks::check_typed_helpers}) {
    run_delayed(GetParam(), check);
  }
}

TEST_P(DelayedTest, EveryMessageOfACollectiveIsDelayed) {
  const int n = GetParam();
  run_delayed(n, [n](Communicator& comm) {
    auto* delayed = dynamic_cast<DelayedCommunicator*>(&comm);
    ASSERT_NE(delayed, nullptr) << "run_world did not wrap the rank";
    EXPECT_EQ(delayed->delay(), std::chrono::microseconds(50));
    std::vector<std::byte> mine(16, std::byte{1}), all(16 * static_cast<std::size_t>(n));
    comm.allgather(mine, all);
    // The default allgather is a ring: n - 1 messages per rank.
    EXPECT_EQ(delayed->messages_sent(), static_cast<std::uint64_t>(n - 1));
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DelayedTest, ::testing::Values(1, 2, 4, 7));

TEST(Delayed, TheEnvironmentVariableIsParsedStrictly) {
  ::unsetenv("SPARSECOMM_MESSAGE_DELAY_US");
  EXPECT_EQ(default_message_delay(), std::chrono::microseconds(0));
  ::setenv("SPARSECOMM_MESSAGE_DELAY_US", "250", 1);
  EXPECT_EQ(default_message_delay(), std::chrono::microseconds(250));
  ::setenv("SPARSECOMM_MESSAGE_DELAY_US", "1ms", 1);
  EXPECT_EQ(error_message<InvalidArgument>([] { default_message_delay(); }),
            "SPARSECOMM_MESSAGE_DELAY_US='1ms' is not a number of microseconds >= 0");
  ::unsetenv("SPARSECOMM_MESSAGE_DELAY_US");
}

}  // namespace
}  // namespace sparsecomm
