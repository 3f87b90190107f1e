// --deterministic gives bit-identical parameters on the thread backend and
// under `mpiexec -n 4` (the real CLI, as a user runs it), and a run stopped
// (at a given step, or by SIGTERM) and resumed ends where an uninterrupted
// one does.

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sparsecomm/train/checkpoint.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

// The CLI's training arguments: 16 steps an epoch, a checkpoint every 16.
std::string train_arguments(const std::string& backend, const fs::path& out,
                            const std::string& extra) {
  return fmt::format(
      "train --backend {} --workers 4 --deterministic --model cnn {} "
      "--train-samples 2048 --test-samples 500 --batch 32 --checkpoint-every 16 "
      "--no-plots --out '{}'",
      backend, extra, out.string());
}

// The CLI's training command, its output to OUT.log.
std::string train_command(const std::string& launcher, const std::string& backend,
                          const fs::path& out, const std::string& extra) {
  return fmt::format("{} {} {} > '{}.log' 2>&1", launcher, SPARSECOMM_CLI,
                     train_arguments(backend, out, extra), out.string());
}

void train(const std::string& launcher, const std::string& backend, const fs::path& out,
           const std::string& extra) {
  const std::string command = train_command(launcher, backend, out, "--epochs 1 " + extra);
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed; see " << out << ".log";
}

// Every rank's parameters in the checkpoints of `step` of runs `a` and `b`
// are bit for bit equal.
void expect_equal_checkpoints(const fs::path& a, const fs::path& b, std::int64_t step) {
  for (int rank = 0; rank < 4; ++rank) {
    const auto pa = testing::parameters_of_checkpoint(read_rank_checkpoint(a, step, rank));
    const auto pb = testing::parameters_of_checkpoint(read_rank_checkpoint(b, step, rank));
    ASSERT_EQ(pa.size(), pb.size());
    EXPECT_TRUE(pa == pb) << "rank " << rank << ": " << a << " and " << b << " differ";
  }
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

// --ranks-per-host auto under MPI: two "hosts" of two ranks each, named by
// SPARSECOMM_HOST_NAME (one mpiexec, two application contexts), train as
// --ranks-per-host 2 on thread ranks does, bit for bit.
TEST(DeterministicHosts, MpiRanksFindTheirHostsByName) {
  const testing::ScratchDir scratch("deterministic-hosts");
  const std::string extra = "--method exdyna --epochs 1 --ranks-per-host ";
  train("", "thread", scratch.path() / "thread", "--method exdyna --ranks-per-host 2");
  const fs::path mpi = scratch.path() / "mpi";
  const std::string arguments = train_arguments("mpi", mpi, extra + "auto");
  const std::string command = fmt::format(
      "{0} {1} -n 2 -x SPARSECOMM_HOST_NAME=host-a {2} {3} : -n 2 -x SPARSECOMM_HOST_NAME=host-b "
      "{2} {3} > '{4}.log' 2>&1",
      SPARSECOMM_MPIEXEC, SPARSECOMM_MPIEXEC_FLAGS, SPARSECOMM_CLI, arguments, mpi.string());
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed; see " << mpi << ".log";
  std::ifstream log(mpi.string() + ".log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("hosts: 2 of 2 rank(s) each, from the ranks' host names"), std::string::npos)
      << text;
  expect_equal_checkpoints(scratch.path() / "thread", mpi, 16);
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
  expect_equal_checkpoints(scratch.path() / "whole", run, last);
}

// The number of step records in a run's metrics.jsonl so far.
int steps_recorded(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"kind\":\"step\"") != std::string::npos) ++steps;
  }
  return steps;
}

// The processes whose parent is `pid` (from /proc).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> children;
  for (const fs::directory_entry& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    // pid (comm) state ppid ...: comm may hold spaces, so read after its ')'.
    const std::size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    pid_t parent = 0;
    rest >> state >> parent;
    if (parent == pid) children.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return children;
}

// How a test delivers the stop: the signal, and whether to the launched
// process itself or to its children (mpiexec's ranks, as SLURM's scancel
// signals every task).
struct StopSignal {
  std::string backend;
  int signal = SIGTERM;
  bool to_children = false;
  std::string name;
};

// Starts `command` through the shell as a process of its own (exec: the pid
// is the command's), delivers `how` once `run` has recorded `steps` steps,
// and returns its exit status (128 + the signal if one ended it).
int exit_status_after_signal(const std::string& command, const StopSignal& how, const fs::path& run,
                             int steps) {
  const std::string exec = "exec " + command;
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", exec.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  int status = 0;
  while (steps_recorded(run) < steps) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      ADD_FAILURE() << command << " ended before " << steps << " steps";
      return -1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << command << " did not record " << steps << " steps in 5 minutes";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (how.to_children) {
    const std::vector<pid_t> children = children_of(pid);
    EXPECT_EQ(children.size(), 4u) << "mpiexec's ranks";
    for (const pid_t child : children) kill(child, how.signal);
  } else {
    kill(pid, how.signal);
  }
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A stop signal in the middle of a run of 48 steps: the run finishes the
// step in flight, checkpoints there, marks summary.json as stopped and
// exits with status 75 (mpiexec too, its ranks having done so); resumed,
// it ends bit-identical to an uninterrupted run. Under mpiexec: SIGTERM to
// each rank (what SLURM's scancel does), and SIGUSR1 to mpiexec, which
// forwards it at once (SIGTERM to mpiexec reaches the ranks only after
// odls_base_sigkill_timeout seconds, SIGKILL as long after that).
class SignalStop : public ::testing::TestWithParam<StopSignal> {};

TEST_P(SignalStop, ASignalledRunCheckpointsAndResumesBitIdentical) {
  const StopSignal& how = GetParam();
  const testing::ScratchDir scratch("signal_" + how.name);
  const std::string launcher =
      how.backend == "mpi" ? fmt::format("{} -n 4 {}", SPARSECOMM_MPIEXEC, SPARSECOMM_MPIEXEC_FLAGS)
                           : "";
  const std::string flags = "--epochs 3 --method exdyna";
  const std::string whole = train_command("", "thread", scratch.path() / "whole", flags);
  ASSERT_EQ(std::system(whole.c_str()), 0) << whole << " failed";
  const fs::path run = scratch.path() / "stopped";
  const std::string command = train_command(launcher, how.backend, run, flags);
  ASSERT_EQ(exit_status_after_signal(command, how, run, 5), 75)
      << command << "; see " << run << ".log";

  const auto summary = nlohmann::json::parse(std::ifstream(run / "summary.json"));
  ASSERT_TRUE(summary.contains("stopped")) << summary.dump();
  const std::int64_t stopped_at = summary["stopped"]["step"].get<std::int64_t>();
  EXPECT_EQ(summary["stopped"]["reason"], how.signal == SIGUSR1 ? "SIGUSR1" : "SIGTERM");
  EXPECT_GE(stopped_at, 5);
  EXPECT_LT(stopped_at, 48);
  EXPECT_EQ((*latest_checkpoint(run))["step"], stopped_at);
  EXPECT_EQ(steps_recorded(run), stopped_at);

  const std::string resume =
      fmt::format("{} {} train --backend {} --resume '{}' > '{}.resume.log' 2>&1", launcher,
                  SPARSECOMM_CLI, how.backend, run.string(), run.string());
  ASSERT_EQ(std::system(resume.c_str()), 0) << resume << " failed; see " << run << ".resume.log";
  EXPECT_EQ(steps_recorded(run), 48);
  expect_equal_checkpoints(scratch.path() / "whole", run, 48);
}

INSTANTIATE_TEST_SUITE_P(
    Ways, SignalStop,
    ::testing::Values(StopSignal{"thread", SIGTERM, false, "thread_sigterm"},
                      StopSignal{"mpi", SIGTERM, true, "mpi_sigterm_to_ranks"},
                      StopSignal{"mpi", SIGUSR1, false, "mpi_sigusr1_to_mpiexec"}),
    [](const ::testing::TestParamInfo<StopSignal>& way) { return way.param.name; });

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

// ExDyna after backward, dense pipelined in buckets of ~64 KiB (the
// communication thread's collectives must match across backends too), and
// ExDyna between 2 hosts of 2 ranks (sync/two_level.h).
INSTANTIATE_TEST_SUITE_P(Methods, Deterministic,
                         ::testing::Values("--method exdyna", "--method dense --bucket-mb 0.0625",
                                           "--method exdyna --ranks-per-host 2"));

}  // namespace
}  // namespace sparsecomm
