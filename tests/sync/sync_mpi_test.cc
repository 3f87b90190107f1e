// SparsifyExchangeStep on the MPI backend (run under mpiexec -n 4): the same
// conservation, metrics and non-finite checks as the thread suite.

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "mpi/mpi_world.h"
#include "sync/sync_checks.h"

namespace sparsecomm::testing {
namespace {

TEST(SyncMpi, RunsOnFourRanks) { EXPECT_EQ(mpi_world().size(), 4); }

TEST(SyncMpi, ConservationForEverySchemeAndPattern) {
  run_on_mpi_world([](Communicator& comm) {
    for (const SyncCase& c : scheme_pattern_cases()) {
      for (const std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
        check_conservation(comm, c, d, 3);
      }
    }
  });
}

TEST(SyncMpi, MetricsOnACraftedCase) {
  run_on_mpi_world([](Communicator& comm) {
    for (const char* exchange : {"allgather", "union", "sparse-allreduce"}) {
      check_metrics_formulas(comm, exchange);
    }
  });
}

TEST(SyncMpi, NonFiniteSkipIsAgreedByAllRanks) {
  run_on_mpi_world([](Communicator& comm) {
    check_nonfinite(comm, NonFinitePolicy::kSkip, {3}, std::nanf(""));
    check_nonfinite(comm, NonFinitePolicy::kSkip, {0, 2}, INFINITY);
  });
}

TEST(SyncMpi, NonFiniteStopThrowsOnEveryRank) {
  run_on_mpi_world([](Communicator& comm) {
    check_nonfinite(comm, NonFinitePolicy::kStop, {1}, std::nanf(""));
    check_nonfinite(comm, NonFinitePolicy::kStop, {0, 3}, -INFINITY);
  });
}

}  // namespace
}  // namespace sparsecomm::testing
