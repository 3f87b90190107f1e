// The Communicator contract (comm_checks.h) on the thread backend, for world
// sizes 1 to 8 (7: not a power of two).

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "comm/comm_checks.h"
#include "sparsecomm/comm/mpi/mpi_communicator.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

// Short enough that a check stuck on one rank fails the test quickly.
constexpr auto kTestTimeout = std::chrono::seconds(20);

class CommThreadTest : public ::testing::TestWithParam<int> {
 protected:
  void run(const std::function<void(Communicator&)>& check) {
    run_thread_world(GetParam(), check, kTestTimeout);
  }
};

TEST_P(CommThreadTest, BackendAndSize) {
  run([n = GetParam()](Communicator& comm) {
    EXPECT_EQ(comm.backend(), "thread");
    EXPECT_EQ(comm.size(), n);
  });
}
TEST_P(CommThreadTest, RingExchange) { run(checks::check_ring_exchange); }
TEST_P(CommThreadTest, OrderingPerSourceAndTag) { run(checks::check_ordering_per_source_and_tag); }
TEST_P(CommThreadTest, TagsOutOfOrder) { run(checks::check_tags_out_of_order); }
TEST_P(CommThreadTest, ZeroByteMessages) { run(checks::check_zero_byte_messages); }
TEST_P(CommThreadTest, SizeMismatchIsAnError) { run(checks::check_size_mismatch_is_an_error); }
TEST_P(CommThreadTest, Barrier) { run(checks::check_barrier); }
TEST_P(CommThreadTest, Broadcast) { run(checks::check_broadcast); }
TEST_P(CommThreadTest, Allgather) { run(checks::check_allgather); }
TEST_P(CommThreadTest, Allgatherv) { run(checks::check_allgatherv); }
TEST_P(CommThreadTest, Alltoallv) { run(checks::check_alltoallv); }
TEST_P(CommThreadTest, InvalidArguments) { run(checks::check_invalid_arguments); }
TEST_P(CommThreadTest, NativeAllreduce) { run(checks::check_native_allreduce); }
TEST_P(CommThreadTest, TypedHelpers) { run(checks::check_typed_helpers); }

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommThreadTest, ::testing::Values(1, 2, 3, 4, 7, 8),
                         [](const ::testing::TestParamInfo<int>& world) {
                           return fmt::format("n{}", world.param);
                         });

// A build without MPI says so, and how to get it (comm_mpi_test covers the
// MPI backend itself). Compiled only into builds without MPI.
#ifndef SPARSECOMM_TEST_WITH_MPI
TEST(MpiStub, ReportsThatTheBackendIsMissing) {
  ASSERT_FALSE(mpi_compiled_in());
  try {
    make_mpi_world_communicator();
    ADD_FAILURE() << "make_mpi_world_communicator() worked in a build without MPI";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("-DSPARSECOMM_WITH_MPI=ON"), std::string::npos)
        << e.what();
  }
}
#endif

}  // namespace
}  // namespace sparsecomm
