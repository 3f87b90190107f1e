// Row-sparse sums on the MPI backend (run under mpiexec -n 4): the same
// checks as the thread suite.

#include <gtest/gtest.h>

#include "collectives/row_exchange_checks.h"
#include "mpi/mpi_world.h"

namespace sparsecomm::testing {
namespace {

TEST(RowSparseMpi, BothMethodsGiveEveryRankTheRankOrderSumOfEveryTouchedRow) {
  ASSERT_EQ(mpi_world().size(), 4);
  run_on_mpi_world(check_row_sparse_sums);
}

TEST(RowOwnersMpi, PushSumsEachRangeOnItsOwnerAndPullReturnsEveryWantedRow) {
  ASSERT_EQ(mpi_world().size(), 4);
  run_on_mpi_world(check_row_owners);
}

}  // namespace
}  // namespace sparsecomm::testing
