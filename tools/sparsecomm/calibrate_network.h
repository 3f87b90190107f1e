#pragma once
// The network measurements of `sparsecomm calibrate` (calibrate_command.h):
// ring rounds for alpha, our ring all-reduce for beta, and the wire's
// framing from the NIC counters. Every rank calls each function together.

#include <cstddef>
#include <optional>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm::cli {

// `rounds` ring rounds of `bytes` back to back after a barrier: the slowest
// rank's time per round, median over iterations. A collective's rounds
// follow one another like this, so a chain gives the per-round latency the
// model charges. One round alone (rounds = 1) also pays every rank's wake-up
// from the barrier, which where ranks share cores costs more than a round
// (docs/benchmarks/performance-model.md, "The terms the validation corrected").
double ring_round_seconds(Communicator& comm, std::size_t bytes, int rounds, int iters);

// The chain that measures alpha: about as many rounds as a sparse step's
// collectives take on a few hosts.
inline constexpr int kAlphaChainRounds = 16;

// Our ring all-reduce of `bytes` of floats (the collective the dense and
// union methods run, with its 1 MiB segments): slowest rank, median.
double ring_allreduce_seconds(Communicator& comm, std::size_t bytes, int iters);

// Framing on the wire, from the NIC counters: bytes per short message
// beyond its payload, from 8-byte ring rounds (a run of 250 against one of
// a fifth as many, so that the barriers around them cancel), and per
// payload byte, from ring all-reduces of `bulk_bytes` (the median of
// three). The model charges a message the larger of the two
// (perf/collective_cost.cc), so the bulk figure keeps its messages' own.
// nullopt when a rank cannot read its NIC counters.
struct WireFraming {
  double per_message = 0.0;
  double per_byte = 0.0;
};
std::optional<WireFraming> measure_wire_framing(Communicator& comm, std::size_t bulk_bytes);

}  // namespace sparsecomm::cli
