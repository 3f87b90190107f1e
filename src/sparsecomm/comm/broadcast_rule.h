#pragma once
// Which algorithm Communicator::broadcast runs, in a header of its own so
// that the performance model (perf/, which links no communicator) prices
// the broadcast by the same rule.
//
//  - Binomial tree: ceil(log2 n) rounds, each carrying the whole buffer.
//  - Scatter, then ring allgather: the root sends block q of n to rank q,
//    and the ranks ring-allgather the blocks: 2(n-1) rounds of 1/n of the
//    buffer, so about 2(n-1)/n of it crosses the busiest link instead of
//    log2(n) times all of it (the long-message broadcast of MPICH, Thakur,
//    Rabenseifner and Gropp, 2005).
//
// The scatter pays 2(n-1) message latencies instead of log2(n); it is
// taken once every block is large enough to amortize them.

#include <cstddef>

namespace sparsecomm {

// Smallest block (buffer / ranks) at which a broadcast scatters.
inline constexpr std::size_t kBroadcastScatterMinBlockBytes = 16 * 1024;

// True when a broadcast of `bytes` on `ranks` ranks scatters and
// ring-allgathers; false for a binomial tree. Two ranks always send once.
constexpr bool broadcast_scatters(int ranks, std::size_t bytes) {
  return ranks >= 3 && bytes / static_cast<std::size_t>(ranks) >= kBroadcastScatterMinBlockBytes;
}

}  // namespace sparsecomm
