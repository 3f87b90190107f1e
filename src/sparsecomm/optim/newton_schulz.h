#pragma once
// The orthogonalization of Muon (muon.h): Newton-Schulz iterations that take
// a matrix G = U S V^T to about U V^T (every singular value pushed towards 1)
// with matrix products only. With X = G / ||G||_F (transposed first when
// it has more rows than columns, so that X X^T is the smaller Gram matrix),
// each of `steps` iterations is the quintic
//
//   A = X X^T,   X = a X + (b A + c A A) X,   (a, b, c) = (3.4445, -4.7750, 2.0315)
//
// whose coefficients trade exactness for speed: the singular values end
// in about [0.7, 1.2] after 5 iterations, not at 1 (Jordan et al., the
// Muon optimizer). Deterministic and the same on every CPU: each element
// is summed in one fixed order, without fused multiply-adds.

#include <cstddef>
#include <span>
#include <vector>

namespace sparsecomm {

// Scratch space, reused between calls so that a step allocates nothing.
struct NewtonSchulzScratch {
  std::vector<float> x, xt, gram, gram2, next;
};

// In place: `matrix` (rows x cols, row-major) becomes its orthogonalization
// after `steps` iterations. A matrix of zeros stays zero. InvalidArgument
// when rows * cols != matrix.size() or steps < 1.
void newton_schulz(std::span<float> matrix, std::size_t rows, std::size_t cols, int steps,
                   NewtonSchulzScratch& scratch);

}  // namespace sparsecomm
