#pragma once
// A synthetic image-classification dataset for benchmarks and tests that
// must not depend on a download: 28x28 grey images of 10 classes, each a
// fixed random class pattern with per-sample noise (learnable, not trivial).
// Deterministic: a pure function of (count, seed, first index).

#include <cstddef>
#include <cstdint>

#include "sparsecomm/data/fashion_mnist.h"

namespace sparsecomm {

// Samples first_index .. first_index + count - 1 of the stream keyed by
// `seed` (so a train and a test split are disjoint ranges of one stream).
ImageDataset make_synthetic_images(std::size_t count, std::uint64_t seed,
                                   std::uint64_t first_index = 0);

}  // namespace sparsecomm
