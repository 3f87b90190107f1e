// --deterministic gives bit-identical parameters on the thread backend and
// under `mpiexec -n 4` (the real CLI, as a user runs it), and a run stopped
// and resumed under mpiexec ends where an uninterrupted one does.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sparsecomm/train/checkpoint.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

void train(const std::string& launcher, const std::string& backend, const fs::path& out,
           const std::string& extra) {
  const std::string command = fmt::format(
      "{} {} train --backend {} --workers 4 --deterministic --model cnn {} "
      "--train-samples 2048 --test-samples 500 --batch 32 --epochs 1 --checkpoint-every 16 "
      "--no-plots --out '{}' > '{}.log' 2>&1",
      launcher, SPARSECOMM_CLI, backend, extra, out.string(), out.string());
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed; see " << out << ".log";
}

class Deterministic : public ::testing::TestWithParam<std::string> {};

TEST_P(Deterministic, ThreadBackendAndMpiGiveIdenticalParameters) {
  const testing::ScratchDir scratch("deterministic");
  train("", "thread", scratch.path() / "thread", GetParam());
  train(fmt::format("{} -n 4 {}", SPARSECOMM_MPIEXEC, SPARSECOMM_MPIEXEC_FLAGS), "mpi",
        scratch.path() / "mpi", GetParam());
  for (int rank = 0; rank < 4; ++rank) {
    const auto a = testing::parameters_of_checkpoint(
        read_rank_checkpoint(scratch.path() / "thread", 16, rank));
    const auto b =
        testing::parameters_of_checkpoint(read_rank_checkpoint(scratch.path() / "mpi", 16, rank));
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(a == b) << "rank " << rank << ": parameters differ between thread and MPI";
  }
}

// Stopped at step 8 of 16 (with a checkpoint), then resumed with --resume in a
// new mpiexec job: the final parameters of every rank equal those of the
// uninterrupted thread-backend run.
TEST(DeterministicResume, AResumedMpiRunEndsBitIdentical) {
  const testing::ScratchDir scratch("deterministic_resume");
  const std::string mpiexec =
      fmt::format("{} -n 4 {}", SPARSECOMM_MPIEXEC, SPARSECOMM_MPIEXEC_FLAGS);
  train("", "thread", scratch.path() / "whole", "--method exdyna");
  train(mpiexec, "mpi", scratch.path() / "resumed", "--method exdyna --stop-at-step 8");
  const auto stopped = latest_checkpoint(scratch.path() / "resumed");
  ASSERT_TRUE(stopped.has_value());
  ASSERT_EQ((*stopped)["step"], 8);
  const fs::path run = scratch.path() / "resumed";
  const std::string command =
      fmt::format("{} {} train --backend mpi --resume '{}' > '{}.resume.log' 2>&1", mpiexec,
                  SPARSECOMM_CLI, run.string(), run.string());
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed; see " << run << ".resume.log";
  const auto whole_end = latest_checkpoint(scratch.path() / "whole");
  const auto resumed_end = latest_checkpoint(run);
  ASSERT_TRUE(whole_end.has_value() && resumed_end.has_value());
  const std::int64_t last = (*whole_end)["step"].get<std::int64_t>();
  ASSERT_EQ((*resumed_end)["step"].get<std::int64_t>(), last);
  for (int rank = 0; rank < 4; ++rank) {
    const auto a = testing::parameters_of_checkpoint(
        read_rank_checkpoint(scratch.path() / "whole", last, rank));
    const auto b = testing::parameters_of_checkpoint(read_rank_checkpoint(run, last, rank));
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(a == b) << "rank " << rank << ": the resumed MPI run differs";
  }
}

// The click model under mpiexec -n 4 ends with the tables of the thread
// backend, bit for bit, for every row-sparse exchange; and the exchanges
// agree with each other (each sums every row in rank order), the sharded
// tables' owners included.
TEST(DeterministicClick, ThreadBackendAndMpiGiveIdenticalTables) {
  const testing::ScratchDir scratch("deterministic_click");
  std::vector<std::string> hashes;
  for (const std::string exchange : {"allgather", "sparse-allreduce", "sharded"}) {
    for (const std::string backend : {"thread", "mpi"}) {
      const fs::path out = scratch.path() / (exchange + "-" + backend);
      const std::string launcher =
          backend == "mpi" ? fmt::format("{} -n 4 {}", SPARSECOMM_MPIEXEC, SPARSECOMM_MPIEXEC_FLAGS)
                           : "";
      const std::string command = fmt::format(
          "{} {} train --backend {} --workers 4 --deterministic --model dlrm --method exdyna "
          "--embedding-exchange {} --embedding-cap 300 --train-samples 4096 --test-samples 1000 "
          "--batch 64 --epochs 1 --no-plots --out '{}' > '{}.log' 2>&1",
          launcher, SPARSECOMM_CLI, backend, exchange, out.string(), out.string());
      ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed; see " << out << ".log";
      std::ifstream in(out / "summary.json");
      const nlohmann::json summary = nlohmann::json::parse(in);
      hashes.push_back(summary.at("embedding").at("table_hash").get<std::string>());
    }
    EXPECT_EQ(hashes[hashes.size() - 2], hashes.back())
        << exchange << ": the tables differ between thread and MPI";
    EXPECT_EQ(hashes.front(), hashes.back()) << exchange << " differs from allgather";
  }
}

// ExDyna after backward, and dense pipelined in buckets of ~64 KiB (the
// communication thread's collectives must match across backends too).
INSTANTIATE_TEST_SUITE_P(Methods, Deterministic,
                         ::testing::Values("--method exdyna", "--method dense --bucket-mb 0.0625"));

}  // namespace
}  // namespace sparsecomm
