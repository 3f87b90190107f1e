// SparseSync on the MPI backend (run under mpiexec -n 4): the same
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
    struct Scheme {
      const char* name;
      bool shared;
      std::vector<std::string> extra;
    };
    const Scheme schemes[] = {
        {"topk", false, {}},      {"threshold", false, {"lambda=0.8"}},
        {"randomk", true, {}},    {"dgc", false, {}},
        {"gaussiank", false, {}}, {"cltk", true, {}},
    };
    for (const Scheme& s : schemes) {
      std::vector<std::string> patterns = {"union", "allgather", "sparse-allreduce"};
      if (s.shared) patterns.emplace_back("shared");
      for (const auto& pattern : patterns) {
        for (const char* values : {"fp32", "fp16"}) {
          const SyncCase c{s.name, pattern, values, s.extra};
          for (const std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
            check_conservation(comm, c, d, 3);
          }
        }
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
