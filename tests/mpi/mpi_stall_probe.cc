// A job with a stalled rank, for expect_abort.sh: rank 3 of 4 sleeps instead
// of taking part; the others wait for it with a 1000 ms timeout, get a
// TimeoutError and abort the whole job with its message. The job must end
// within seconds, non-zero, and its output must name rank 3 (recv mode).
//
// allreduce mode: a native all-reduce times out; MPI cannot withdraw it, so
// the backend itself aborts the job, saying so.
//
// kill mode: rank 3 dies by SIGKILL (as under the OOM killer or kill -9)
// while the others are in a ring all-reduce that needs it; mpiexec or the
// survivors' timeout must end the job.
//
// Usage: mpiexec -n 4 mpi_stall_probe [recv|barrier|allreduce|kill]

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/mpi/mpi_communicator.h"
#include "sparsecomm/core/errors.h"

int main(int argc, char** argv) {
  using namespace sparsecomm;
  const std::string mode = argc > 1 ? argv[1] : "recv";
  if (mode != "recv" && mode != "barrier" && mode != "allreduce" && mode != "kill") {
    std::fprintf(stderr, "usage: mpi_stall_probe [recv|barrier|allreduce|kill]\n");
    return 2;
  }
  try {
    const auto comm = make_mpi_world_communicator(std::chrono::milliseconds(1000));
    if (comm->size() != 4) {
      mpi_abort_job(comm->where() + "run this probe with exactly 4 ranks", 2);
    }
    if (mode == "kill") {
      comm->barrier();  // every rank is up before one dies
      if (comm->rank() == 3) ::kill(::getpid(), SIGKILL);
      std::vector<float> values(1 << 20, 1.0f);
      for (int round = 0; round < 100; ++round) allreduce(*comm, std::span<float>(values));
      mpi_abort_job(comm->where() + "the killed rank 3 went unnoticed", 5);
    }
    if (comm->rank() == 3) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    if (mode == "recv") {
      std::vector<std::byte> buffer(4096);
      comm->recv(buffer, 3, tags::kRingReduceScatter);
    } else if (mode == "barrier") {
      comm->barrier();
    } else {
      std::vector<float> values(1024, 1.0f);
      comm->native_allreduce(values);
    }
    // Reaching this point means the stalled rank was not detected; the
    // missing "timed out" makes expect_abort.sh fail.
    mpi_abort_job(comm->where() + "the stalled rank 3 went unnoticed", 5);
  } catch (const TimeoutError& e) {
    mpi_abort_job(e.what(), 3);
  } catch (const std::exception& e) {
    mpi_abort_job(std::string("[probe] unexpected error: ") + e.what(), 4);
  }
}
