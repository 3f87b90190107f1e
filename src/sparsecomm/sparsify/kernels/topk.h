#pragma once
// Exact top-k by magnitude.

#include <cstddef>
#include <cstdint>
#include <span>

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/sparsify/kernels/simd.h"

namespace sparsecomm {

// Selects the k elements of largest |x[i]|, ties broken by the lower index,
// exactly (the same set as a full sort by (|x| desc, i asc)), and appends
// them to `out` as (base + i, x[i]) in ascending i. k is clamped to
// x.size(). NaN elements rank below every number.
//
// Method: estimate a lower bound on the k-th magnitude from a strided sample,
// collect the candidates at or above it in one threshold pass, lower the
// bound and repeat in the rare case too few were collected, then an exact
// selection among the candidates. Scratch buffers live in the object and are
// reused: no allocation per call after warm-up. Not thread-safe; one per rank.
class TopKSelector {
 public:
  explicit TopKSelector(SimdLevel level = detected_simd_level()) : level_(level) {}

  void select(std::span<const float> x, std::size_t k, Index base, SparseSelection& out);

  // Candidate passes the last call needed (1 normally); for tests and stats.
  int last_passes() const { return last_passes_; }

 private:
  SimdLevel level_;
  SparseSelection candidates_;
  UninitVector<float> sample_;
  UninitVector<std::uint32_t> order_;
  int last_passes_ = 0;
};

// Reference: the same result by a full stable sort. Short, obviously correct,
// slow; for tests.
void topk_reference(std::span<const float> x, std::size_t k, Index base, SparseSelection& out);

}  // namespace sparsecomm
