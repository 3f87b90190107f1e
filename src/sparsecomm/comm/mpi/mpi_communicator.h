#pragma once
// The OpenMPI backend. Compiled from mpi_communicator.cc when the build has
// MPI, else from no_mpi.cc, whose functions throw NotSupported.
//
// MPI is initialized once per process on first use (thread level
// MPI_THREAD_SERIALIZED: one thread at a time may call it) and finalized at
// exit. Every operation is non-blocking underneath and polled against the
// communicator's timeout, so a stalled peer becomes a TimeoutError naming
// the peer and the operation instead of a hang (Debian's OpenMPI 4.1 has no
// timeouts of its own).

#include <memory>
#include <string>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm {

// True when this build includes the MPI backend.
bool mpi_compiled_in();

// A communicator over its own duplicate of MPI_COMM_WORLD; initializes MPI
// if needed. Collective (MPI_Comm_dup): every rank calls it in the same
// order. "One thread at a time" holds for all MPI communicators of the
// process together (MPI_THREAD_SERIALIZED).
std::unique_ptr<Communicator> make_mpi_world_communicator(
    std::chrono::milliseconds timeout = default_timeout());

// Prints `message` to stderr and aborts every process of the MPI job with
// `exit_code` (MPI_Abort). Use it when an error must end the whole job.
[[noreturn]] void mpi_abort_job(const std::string& message, int exit_code = 3);

}  // namespace sparsecomm
