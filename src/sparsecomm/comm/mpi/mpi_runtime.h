#pragma once
// MPI's lifetime in this process and its error texts, for the OpenMPI
// backend (mpi_communicator.cc). Only the files of comm/mpi/ include it.

#include <string>

namespace sparsecomm {

// Initializes MPI at MPI_THREAD_SERIALIZED on the first call; it is
// finalized at exit (unless the job was aborted, or someone else
// initialized MPI and then also finalizes it). Communicators are created
// after the first call, so static ones are destroyed (and their MPI_Comm
// freed) before MPI_Finalize. CommError if MPI was already finalized or
// MPI_Init_thread fails; NotSupported below MPI_THREAD_SERIALIZED.
void ensure_mpi_runtime();
// Called just before MPI_Abort: the exit path must not finalize after it.
void note_mpi_abort();

bool mpi_initialized();
bool mpi_finalized();
// MPI's text and class of an error code.
std::string mpi_error_text(int code);
int mpi_error_class(int code);

}  // namespace sparsecomm
