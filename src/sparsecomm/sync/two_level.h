#pragma once
// Two-level synchronization for clusters of hosts with several ranks each
// (docs/algorithms/two-level.md): a GradientSync decorator that runs any
// method between hosts only.
//
//   1. inside each host: the ranks' gradients summed (ring all-reduce over
//      the host's ranks, the fast link) and divided by R: the host's mean
//   2. between hosts: the host's leader (its first rank) runs the method
//      (`inner`) on the host means among the leaders: its selection, memory
//      and exchange see one rank per host, so a sparse method's union and
//      index cost grow with the hosts, not the ranks
//   3. inside each host: the leader broadcasts the result
//
// Only leaders keep the method's state: what a host did not send stays in
// its leader's memory once, not once per rank, so error feedback is exact
// over both levels (the host's residual plus what the hosts sent is the sum
// of every rank's gradient). A step that the method skips or stops on (a
// non-finite gradient reaches the host's sum) is skipped or stopped on
// every rank of the host.
//
// Hosts are `ranks_per_host` consecutive ranks: rank r is on host
// r / ranks_per_host (how mpiexec places ranks by default, and how
// --ranks-per-host names them for thread ranks and emulated clusters).

#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/sync/gradient_sync.h"

namespace sparsecomm {

struct HostTopology {
  int ranks_per_host = 1;

  int hosts(int world) const { return world / ranks_per_host; }
  int host_of(int rank) const { return rank / ranks_per_host; }
  bool leads(int rank) const { return rank % ranks_per_host == 0; }
  // InvalidArgument unless ranks_per_host >= 1 and divides `world`.
  void check(int world) const;
};

// --ranks-per-host auto: the hosts from the ranks' host names.
inline constexpr int kDetectRanksPerHost = 0;

// The topology of `host_of_rank` (rank r's host, numbered in order of
// first appearance): R consecutive ranks on each host. InvalidArgument when
// the hosts run different numbers of ranks or a host's ranks are not
// consecutive, naming the first rank off the pattern and what to do
// (mpiexec --map-by slot, or an explicit R).
HostTopology topology_of_hosts(std::span<const int> host_of_rank);

// topology_of_hosts of the ranks' host names (comm/host_names.h). Collective.
HostTopology detect_host_topology(Communicator& comm);

// `ranks_per_host` as given (checked against the world), or detected for
// kDetectRanksPerHost. Collective in the second case.
HostTopology resolve_host_topology(int ranks_per_host, Communicator& comm);

// Wraps `inner` (made alike on every rank) for `topology`; returns `inner`
// unchanged for one rank per host.
std::unique_ptr<GradientSync> with_two_levels(std::unique_ptr<GradientSync> inner,
                                              HostTopology topology);

}  // namespace sparsecomm
