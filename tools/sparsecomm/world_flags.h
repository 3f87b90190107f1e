#pragma once
// The flags of the commands that start a world of ranks, declared once:
// --backend, -n/--workers and --timeout-ms, and the WorldOptions they mean.

#include <string>

#include <CLI/CLI.hpp>

#include "sparsecomm/comm/backend.h"

namespace sparsecomm::cli {

struct WorldFlags {
  std::string backend = "auto";  // auto | thread | mpi
  int workers = 4;               // ranks of the thread backend; MPI takes the job's size
  long long timeout_ms = 0;      // per-operation timeout; 0: the backend's default
};

// --backend only (commands whose world size means more than a rank count).
void add_backend_flag(CLI::App& cmd, std::string& backend);
// --timeout-ms only.
void add_timeout_flag(CLI::App& cmd, long long& timeout_ms);
// --backend, -n/--workers (>= 1) and --timeout-ms.
void add_world_flags(CLI::App& cmd, WorldFlags& flags);

// The world the flags ask for with `thread_ranks` ranks on the thread
// backend (0, the job's size, under MPI). Throws InvalidArgument for an
// unknown backend name.
WorldOptions world_options(const WorldFlags& flags, int thread_ranks);
inline WorldOptions world_options(const WorldFlags& flags) {
  return world_options(flags, flags.workers);
}

}  // namespace sparsecomm::cli
