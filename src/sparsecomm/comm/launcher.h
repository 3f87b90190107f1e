#pragma once
// What the launcher told this process: whether mpirun/mpiexec started it,
// and as which rank. Read from the environment (Open MPI, PMIx, PMI), so it
// works before MPI is initialized and in builds without MPI.

#include <optional>

namespace sparsecomm {

// True when this process was started by mpirun/mpiexec (Open MPI or PMIx
// environment variables are set).
bool launched_by_mpirun();

// This process's rank in the job as the launcher numbered it, or nothing
// when no launcher set one (or it is not a number >= 0). For what must
// happen once per job before the world exists, e.g. a log line on rank 0.
std::optional<int> launcher_rank();

}  // namespace sparsecomm
