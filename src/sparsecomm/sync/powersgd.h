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

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sync/gradient_sync_interface.h"
#include "sparsecomm/sync/sparsify_sequence.h"

namespace sparsecomm {

// The rank at which PowerSGD factorizes `layer` for a target rank r:
// min(r, R, C) for a matrix (R = layer.rows >= 2, C = size / R >= 2) whose
// factors are smaller than it (min(r, R, C) (R + C) < R C); 0 when the
// tensor is averaged whole. The method and the performance model both use it.
std::size_t powersgd_factor_rank(const LayerSpan& layer, std::size_t rank);

// The arithmetic of one factorized tensor, in the order a step runs it (the
// all-reduces between them are the caller's); m is R x C row-major, the
// factors are stored column after column: p's r columns of R floats, q's
// and q_local's of C floats.
//   project:      p = m q
//   back_project: orthonormalize p's columns (modified Gram-Schmidt; a
//                 column with nothing left becomes 0), then q_local = m^T p
//   reconstruct:  out = p q_sum^T / ranks and m -= p q_local^T (the error
//                 kept); returns the sum of the new error's squares
void powersgd_project(std::span<const float> m, std::span<const float> q, std::span<float> p,
                      std::size_t rows, std::size_t cols, std::size_t rank);
void powersgd_back_project(std::span<const float> m, std::span<float> p, std::span<float> q_local,
                           std::size_t rows, std::size_t cols, std::size_t rank);
double powersgd_reconstruct(std::span<float> m, std::span<const float> p,
                            std::span<const float> q_sum, std::span<const float> q_local,
                            float ranks, std::span<float> out, std::size_t rows, std::size_t cols,
                            std::size_t rank);

// The options `sparsecomm methods` lists for powersgd: rank, warm_start, seed.
std::vector<OptionSpec> powersgd_option_specs();

std::unique_ptr<GradientSync> make_powersgd(const SchemeOptions& options,
                                            NonFinitePolicy nonfinite);

}  // namespace sparsecomm
