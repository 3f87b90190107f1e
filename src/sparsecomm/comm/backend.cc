#include "sparsecomm/comm/backend.h"

#include <fmt/format.h>

#include "sparsecomm/comm/launcher.h"
#include "sparsecomm/comm/mpi/mpi_communicator.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"

namespace sparsecomm {

BackendKind parse_backend(std::string_view name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "thread") return BackendKind::kThread;
  if (name == "mpi") return BackendKind::kMpi;
  throw InvalidArgument(fmt::format(
      "unknown backend '{}': valid backends are auto (mpi under mpirun, else thread), thread, mpi",
      name));
}

std::string_view backend_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kThread:
      return "thread";
    case BackendKind::kMpi:
      return "mpi";
  }
  return "?";
}

BackendKind resolve_backend(BackendKind kind) {
  if (kind != BackendKind::kAuto) return kind;
  return launched_by_mpirun() ? BackendKind::kMpi : BackendKind::kThread;
}

void run_world(const WorldOptions& options, const std::function<void(Communicator&)>& body) {
  std::function<void(Communicator&)> delayed;
  if (options.message_delay.count() > 0) {
    delayed = [&](Communicator& comm) {
      if (comm.rank() == 0) {
        logger().warn("every message is delayed by {} us (SPARSECOMM_MESSAGE_DELAY_US)",
                      options.message_delay.count());
      }
      DelayedCommunicator slow(comm, options.message_delay);
      body(slow);
    };
  }
  const std::function<void(Communicator&)>& fn = delayed ? delayed : body;
  switch (resolve_backend(options.backend)) {
    case BackendKind::kThread:
      if (options.ranks < 1) {
        throw InvalidArgument(
            fmt::format("the thread backend needs at least 1 rank, got {}", options.ranks));
      }
      run_thread_world(options.ranks, fn, options.timeout);
      return;
    case BackendKind::kMpi: {
      auto comm = make_mpi_world_communicator(options.timeout);
      if (options.ranks != 0 && options.ranks != comm->size()) {
        throw InvalidArgument(
            fmt::format("[mpi] rank {}: asked for {} ranks but the MPI job has {}; start it with "
                        "`mpirun -np {}` or leave the rank count unset",
                        comm->rank(), options.ranks, comm->size(), options.ranks));
      }
      fn(*comm);
      return;
    }
    case BackendKind::kAuto:
      break;
  }
  throw InvalidArgument("unresolved backend");
}

}  // namespace sparsecomm
