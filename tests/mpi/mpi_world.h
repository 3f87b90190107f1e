#pragma once
// The process-wide MPI communicator of an MPI test binary. Defined in
// mpi_gtest_main.cc, whose main() initializes MPI through the library.

#include <functional>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm {

// MPI_COMM_WORLD as a sparsecomm communicator, created on first use, with
// the tests' timeout (30 s, or SPARSECOMM_TIMEOUT_MS). Every rank runs every
// test in the same order.
Communicator& mpi_world();

// Runs fn(mpi_world()). A TimeoutError escaping fn aborts the whole job: a
// rank out of step would otherwise make every later test wait for its
// timeout.
void run_on_mpi_world(const std::function<void(Communicator&)>& fn);

}  // namespace sparsecomm
