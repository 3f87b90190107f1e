// The collectives on the MPI backend (run under mpiexec -n 4): the same
// checks as the thread suite, plus our ring against MPI's own all-reduce.

#include <gtest/gtest.h>

#include <cstddef>

#include "collectives/collective_checks.h"
#include "mpi/mpi_world.h"

namespace sparsecomm::testing {
namespace {

TEST(CollectivesMpi, RunsOnFourRanks) { EXPECT_EQ(mpi_world().size(), 4); }

TEST(CollectivesMpi, RingSumsExactlyForEverySizeAndSegmentSize) {
  run_on_mpi_world([](Communicator& comm) { check_ring_sweep(comm); });
  run_on_mpi_world([](Communicator& comm) { check_half_wire_ring(comm); });
}

TEST(CollectivesMpi, RecursiveDoublingSumsExactly) {
  run_on_mpi_world([](Communicator& comm) { check_recursive_doubling_sweep(comm); });
}

TEST(CollectivesMpi, RingMatchesNative) {
  run_on_mpi_world([](Communicator& comm) {
    ASSERT_TRUE(comm.has_native_allreduce());
    for (const std::size_t numel :
         {std::size_t{0}, std::size_t{3}, std::size_t{1000}, std::size_t{1} << 20}) {
      check_ring_matches_native(comm, numel);
    }
  });
}

TEST(CollectivesMpi, SkipReduceSumsExactlyTheScheduledContributors) {
  run_on_mpi_world([](Communicator& comm) { check_skip_reduce_sweep(comm); });
}

TEST(CollectivesMpi, SkipReduceProtectsSmallAndUserListedBuffers) {
  run_on_mpi_world([](Communicator& comm) { check_skip_reduce_protection(comm); });
}

TEST(CollectivesMpi, RejectsInvalidArguments) {
  run_on_mpi_world([](Communicator& comm) { check_invalid_arguments(comm); });
}

}  // namespace
}  // namespace sparsecomm::testing
