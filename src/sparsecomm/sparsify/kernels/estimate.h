#pragma once
// Threshold and moment estimators used by DGC and Gaussian-k.

#include <cstddef>
#include <cstdint>
#include <span>

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/sparsify/kernels/simd.h"

namespace sparsecomm {

// DGC's sampled threshold: a strided sample of
// max(1% of d, min(d, 1000)) elements of |x| starting at `start % stride`,
// threshold = the sample's value at rank ceil(density * sample_size) from the
// top (1-based). `scratch` is reused. Returns +inf for an empty x.
float sampled_threshold(std::span<const float> x, double density, std::uint64_t start,
                        UninitVector<float>& scratch);

struct Moments {
  double mean = 0.0;
  double stddev = 0.0;  // population standard deviation
};

// Mean and standard deviation of x in one vectorized pass (double
// accumulators). Non-finite elements make the result non-finite.
Moments moments(std::span<const float> x, SimdLevel level = detected_simd_level());

// True when no element of x is NaN or infinite (one vectorized read pass).
bool all_finite(std::span<const float> x, SimdLevel level = detected_simd_level());

// The memory-bandwidth floor (docs/benchmarks/methodology.md, "How we measure"): one vectorized,
// single-threaded read pass over x (a sum of |x| with several accumulators).
// Returned so the compiler cannot drop the pass.
float read_pass(std::span<const float> x, SimdLevel level = detected_simd_level());

}  // namespace sparsecomm
