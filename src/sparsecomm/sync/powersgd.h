#pragma once
// PowerSGD (Vogels et al., NeurIPS 2019): low-rank compression of each
// matrix-shaped tensor by one step of power iteration per training step,
// with warm start and error feedback (docs/algorithms.md, "PowerSGD").
//
// Per step, for every tensor viewed as an R x C matrix (R its first
// dimension, LayerSpan::rows) whose rank-r factors are smaller than it
// (r (R + C) < R C): M = g + e (this rank's gradient plus its error),
// P = M Q, all-reduce the P of every such tensor together with the values
// of the tensors sent whole, orthonormalize P's columns, Q = M^T P,
// all-reduce the Q's, and the gradient becomes P Q^T / n; e = M - P Q^T.
// The other tensors (vectors, small or thin matrices) are averaged whole.
// Q starts from the same counter-based draws on every rank and carries over
// to the next step (warm start). Runs over sparsecomm's own ring all-reduce,
// so it works on any Communicator (threads, MPI, torch.distributed groups).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sync/gradient_sync_interface.h"
#include "sparsecomm/sync/sparsify_exchange_step.h"

namespace sparsecomm {

// The options `sparsecomm methods` lists for powersgd: rank, warm_start, seed.
std::vector<OptionSpec> powersgd_option_specs();

std::unique_ptr<GradientSync> make_powersgd(const SchemeOptions& options,
                                            NonFinitePolicy nonfinite);

}  // namespace sparsecomm
