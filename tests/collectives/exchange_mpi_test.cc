// The exchange patterns on the MPI backend (run under mpiexec -n 4): the
// same checks as the thread suite.

#include <gtest/gtest.h>

#include "collectives/exchange_checks.h"
#include "mpi/mpi_world.h"

namespace sparsecomm::testing {
namespace {

TEST(ExchangeMpi, RunsOnFourRanks) { EXPECT_EQ(mpi_world().size(), 4); }

TEST(ExchangeMpi, UnionAllreduce) {
  run_on_mpi_world([](Communicator& comm) {
    check_exchange_sweep(comm, ExchangePattern::kUnionAllreduce, SparseAllreduceAlgorithm::kAuto,
                         true);
  });
}

TEST(ExchangeMpi, SharedIndices) {
  run_on_mpi_world([](Communicator& comm) {
    check_exchange_sweep(comm, ExchangePattern::kSharedIndices, SparseAllreduceAlgorithm::kAuto,
                         true);
  });
}

TEST(ExchangeMpi, SparseAllgather) {
  run_on_mpi_world([](Communicator& comm) {
    check_exchange_sweep(comm, ExchangePattern::kSparseAllgather, SparseAllreduceAlgorithm::kAuto,
                         true);
  });
}

TEST(ExchangeMpi, SparseAllreduceBothAlgorithms) {
  run_on_mpi_world([](Communicator& comm) {
    check_exchange_sweep(comm, ExchangePattern::kSparseAllreduce,
                         SparseAllreduceAlgorithm::kRecursiveDoubling, true);
    check_exchange_sweep(comm, ExchangePattern::kSparseAllreduce, SparseAllreduceAlgorithm::kSplit,
                         true);
  });
}

TEST(ExchangeMpi, SparseAllreduceAlgorithmsAgree) {
  run_on_mpi_world(check_sparse_allreduce_algorithms_agree);
}

TEST(ExchangeMpi, ErrorFeedbackConservesMassOverSteps) {
  run_on_mpi_world([](Communicator& comm) {
    for (const ExchangePattern p :
         {ExchangePattern::kUnionAllreduce, ExchangePattern::kSharedIndices,
          ExchangePattern::kSparseAllgather, ExchangePattern::kSparseAllreduce}) {
      check_error_feedback_steps(comm, p);
    }
  });
}

TEST(ExchangeMpi, KnownRangesJoinTheUnionWithoutIndices) {
  run_on_mpi_world([](Communicator& comm) {
    for (const ExchangePattern p :
         {ExchangePattern::kUnionAllreduce, ExchangePattern::kSharedIndices,
          ExchangePattern::kSparseAllgather}) {
      check_known_ranges(comm, p, SparseAllreduceAlgorithm::kAuto, ValueEncoding::kFloat32);
    }
    check_known_ranges(comm, ExchangePattern::kSparseAllreduce,
                       SparseAllreduceAlgorithm::kRecursiveDoubling, ValueEncoding::kFloat16);
    check_known_ranges(comm, ExchangePattern::kSparseAllreduce, SparseAllreduceAlgorithm::kSplit,
                       ValueEncoding::kFloat32);
  });
}

TEST(ExchangeMpi, RejectsInvalidArguments) {
  run_on_mpi_world(check_exchange_rejects_invalid_arguments);
}

}  // namespace
}  // namespace sparsecomm::testing
