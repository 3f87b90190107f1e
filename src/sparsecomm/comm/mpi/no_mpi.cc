// The MPI functions of a build without MPI (-DSPARSECOMM_WITH_MPI=OFF): the
// backend reports that it is missing; aborting still works (detection is
// comm/launcher.cc, in every build).

#include <cstdio>
#include <cstdlib>

#include "sparsecomm/comm/mpi/mpi_communicator.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {

bool mpi_compiled_in() { return false; }

std::unique_ptr<Communicator> make_mpi_world_communicator(std::chrono::milliseconds) {
  throw NotSupported(
      "[mpi] this build has no MPI backend; rebuild with -DSPARSECOMM_WITH_MPI=ON (needs "
      "libopenmpi-dev)");
}

void mpi_abort_job(const std::string& message, int exit_code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::exit(exit_code);
}

}  // namespace sparsecomm
