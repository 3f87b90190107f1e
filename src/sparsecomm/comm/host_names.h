#pragma once
// Which ranks share a host, from the hosts' names: what two-level exchanges
// (sync/two_level.h) detect when --ranks-per-host is `auto`.

#include <string>
#include <vector>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm {

// This process's host name: SPARSECOMM_HOST_NAME where set and not empty
// (emulated hosts sharing one machine, e.g. one per network namespace),
// else gethostname (one name per node, as torch.distributed sees it).
// At most kHostNameBytes - 1 bytes (InvalidArgument beyond).
std::string this_host_name();
inline constexpr std::size_t kHostNameBytes = 256;

// Each rank's host as the index of its name among the world's, numbered in
// order of first appearance (rank 0's host is 0). Collective: an allgather
// of every rank's name. Thread ranks share a process, so one host.
std::vector<int> host_of_each_rank(Communicator& comm);

}  // namespace sparsecomm
