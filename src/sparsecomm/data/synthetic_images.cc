#include "sparsecomm/data/synthetic_images.h"

#include <algorithm>

#include "sparsecomm/core/rng.h"

namespace sparsecomm {

ImageDataset make_synthetic_images(std::size_t count, std::uint64_t seed,
                                   std::uint64_t first_index) {
  constexpr std::size_t kSide = 28;
  constexpr std::size_t kPixels = kSide * kSide;
  constexpr int kClasses = 10;
  const Philox rng(seed);
  // Class patterns: a coarse 7x7 grid of random intensities, upsampled.
  std::uint8_t patterns[kClasses][kPixels];
  for (int c = 0; c < kClasses; ++c) {
    for (std::size_t p = 0; p < kPixels; ++p) {
      const std::size_t cell = (p / kSide / 4) * 7 + (p % kSide) / 4;
      patterns[c][p] = static_cast<std::uint8_t>(rng.below(256, 0xC1A55, c * 64 + cell));
    }
  }
  ImageDataset data;
  data.count = count;
  data.rows = data.cols = kSide;
  data.images.resize(count * kPixels);
  data.labels.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t sample = first_index + i;
    const int label = static_cast<int>(rng.below(kClasses, sample, 0));
    data.labels[i] = static_cast<std::uint8_t>(label);
    for (std::size_t p = 0; p < kPixels; p += 4) {
      const Philox::Block noise = rng.block(sample, 1 + p / 4);
      for (std::size_t j = 0; j < 4; ++j) {
        // Half pattern, half noise: classes overlap, so accuracy stays < 100%.
        const int value = patterns[label][p + j] / 2 + static_cast<int>(noise[j] % 128);
        data.images[i * kPixels + p + j] = static_cast<std::uint8_t>(std::min(value, 255));
      }
    }
  }
  return data;
}

}  // namespace sparsecomm
