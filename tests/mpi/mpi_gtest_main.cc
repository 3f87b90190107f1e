// GoogleTest main of the MPI suites (see sparsecomm_mpi_test in
// tests/CMakeLists.txt). Every rank runs every test in the same order. Rank 0
// prints gtest's usual report; the other ranks print only their failures,
// each line prefixed with "[rank R]". The job fails (every rank exits
// non-zero) if any rank failed, and rank 0 names the ranks that failed.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "mpi/mpi_world.h"
#include "sparsecomm/comm/mpi/mpi_communicator.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

// 30 s unless SPARSECOMM_TIMEOUT_MS says otherwise.
std::chrono::milliseconds test_timeout() {
  if (const char* env = std::getenv("SPARSECOMM_TIMEOUT_MS"); env != nullptr && *env != '\0') {
    return default_timeout();
  }
  return std::chrono::seconds(30);
}

std::string current_test_name() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "(between tests)";
  return fmt::format("{}.{}", info->test_suite_name(), info->name());
}

// The report of ranks other than 0: only failures.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n[rank %d] %s\n", rank_,
                 result.file_name() != nullptr ? result.file_name() : "(unknown file)",
                 result.line_number(), rank_, result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                   info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

Communicator& mpi_world() {
  static const std::unique_ptr<Communicator> world = make_mpi_world_communicator(test_timeout());
  return *world;
}

void run_on_mpi_world(const std::function<void(Communicator&)>& fn) {
  Communicator& world = mpi_world();
  try {
    fn(world);
  } catch (const TimeoutError& e) {
    mpi_abort_job(fmt::format("{}\n[mpi-gtest] rank {}: timed out in test {}; aborting the job",
                              e.what(), world.rank(), current_test_name()));
  }
}

}  // namespace sparsecomm

int main(int argc, char** argv) {
  // mpiexec forwards output through a pseudo-terminal: without this, gtest's
  // colors end up in ctest's logs. --gtest_color and GTEST_COLOR still win.
  if (std::getenv("GTEST_COLOR") == nullptr) GTEST_FLAG_SET(color, "no");
  ::testing::InitGoogleTest(&argc, argv);
  sparsecomm::Communicator* world = nullptr;
  try {
    world = &sparsecomm::mpi_world();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[mpi-gtest] cannot start MPI: %s\n", e.what());
    return 2;
  }
  const int rank = world->rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new sparsecomm::FailurePrinter(rank));
  }

  const int result = RUN_ALL_TESTS();

  std::vector<int> failed;
  try {
    failed = sparsecomm::allgather_value(*world, result == 0 ? 0 : 1);
  } catch (const std::exception& e) {
    sparsecomm::mpi_abort_job(
        fmt::format("[mpi-gtest] rank {}: combining the results failed: {}", rank, e.what()));
  }
  std::vector<int> failed_ranks;
  for (int q = 0; q < world->size(); ++q) {
    if (failed[static_cast<std::size_t>(q)] != 0) failed_ranks.push_back(q);
  }
  if (rank == 0) {
    if (failed_ranks.empty()) {
      std::printf("[mpi-gtest] all %d ranks passed\n", world->size());
    } else {
      std::printf(
          "[mpi-gtest] tests failed on rank(s) %s of %d (lines from ranks other than 0 "
          "are prefixed with [rank R])\n",
          fmt::format("{}", fmt::join(failed_ranks, ", ")).c_str(), world->size());
    }
    std::fflush(stdout);
  }
  return failed_ranks.empty() ? 0 : 1;
}
