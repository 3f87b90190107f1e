#pragma once
// Choosing and starting a world: the one place that knows every backend.

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/comm/delayed.h"

namespace sparsecomm {

enum class BackendKind { kAuto, kThread, kMpi };

// "auto", "thread" or "mpi"; anything else is an InvalidArgument that lists
// the valid names.
BackendKind parse_backend(std::string_view name);
std::string_view backend_name(BackendKind kind);

// kAuto becomes kMpi when launched by mpirun, else kThread.
BackendKind resolve_backend(BackendKind kind);

struct WorldOptions {
  BackendKind backend = BackendKind::kAuto;
  // Thread backend: number of ranks (>= 1). MPI backend: 0 (take the job's
  // size) or the job's size, checked.
  int ranks = 4;
  std::chrono::milliseconds timeout = default_timeout();
  // > 0: every rank's communicator is a DelayedCommunicator (delayed.h):
  // each message leaves this long after it is posted.
  std::chrono::microseconds message_delay = default_message_delay();
};

// Runs fn on every rank of the chosen world: on `ranks` threads for the
// thread backend, on this process's rank for MPI. Errors propagate as
// exceptions (for MPI: only from this process's rank; see
// run_main_guarded() to turn them into a job abort).
void run_world(const WorldOptions& options, const std::function<void(Communicator&)>& fn);

}  // namespace sparsecomm
