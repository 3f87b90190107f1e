#include "world_flags.h"

#include <chrono>

namespace sparsecomm::cli {

void add_backend_flag(CLI::App& cmd, std::string& backend) {
  cmd.add_option("--backend", backend, "auto | thread | mpi (auto: mpi under mpirun)")
      ->capture_default_str();
}

void add_timeout_flag(CLI::App& cmd, long long& timeout_ms) {
  cmd.add_option("--timeout-ms", timeout_ms,
                 "per-operation communication timeout (default 60000 or SPARSECOMM_TIMEOUT_MS)")
      ->check(CLI::NonNegativeNumber);
}

void add_world_flags(CLI::App& cmd, WorldFlags& flags) {
  add_backend_flag(cmd, flags.backend);
  cmd.add_option("-n,--workers", flags.workers, "ranks for the thread backend (MPI: the job's)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  add_timeout_flag(cmd, flags.timeout_ms);
}

WorldOptions world_options(const WorldFlags& flags, int thread_ranks) {
  WorldOptions world;
  world.backend = parse_backend(flags.backend);
  world.ranks = resolve_backend(world.backend) == BackendKind::kMpi ? 0 : thread_ranks;
  if (flags.timeout_ms > 0) world.timeout = std::chrono::milliseconds(flags.timeout_ms);
  return world;
}

}  // namespace sparsecomm::cli
