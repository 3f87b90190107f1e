#pragma once
// One-pass threshold selection: the kernel behind hard threshold, DGC,
// Gaussian-k, MiCRO and ExDyna, and the filtering pass of exact top-k.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/sparsify/kernels/simd.h"

namespace sparsecomm {

// |v| as its float bit pattern: monotone in |v| for every non-NaN v (the
// bins of the histogram selections and the top-k sample's ranks).
inline std::uint32_t magnitude_bits(float v) {
  return std::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
}

// Appends (base + i, x[i]) to `out` for every i with |x[i]| >= threshold, in
// ascending i; returns how many were appended. `threshold` must be >= 0 and
// not NaN (InvalidArgument otherwise); +inf selects nothing finite. NaN
// elements are never selected. Grows `out` as needed (amortized; no
// allocation once its capacity suffices). base + x.size() must fit in Index.
std::size_t threshold_select(std::span<const float> x, float threshold, Index base,
                             SparseSelection& out, SimdLevel level = detected_simd_level());

// Keeps, in place and in order, the pairs (indices[j], values[j]) of
// `selection` with |values[j]| >= threshold (same rules as threshold_select);
// returns how many. Does not allocate.
std::size_t compact_at_least(SparseSelection& selection, float threshold,
                             SimdLevel level = detected_simd_level());

// Number of i with |x[i]| >= threshold (same rules, no output).
std::size_t count_at_least(std::span<const float> x, float threshold,
                           SimdLevel level = detected_simd_level());

}  // namespace sparsecomm
