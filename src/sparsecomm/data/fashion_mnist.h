#pragma once
// Image datasets for training, without LibTorch: Fashion-MNIST from the
// Debian package dataset-fashion-mnist, and per-rank epoch shards.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsecomm {

// Where Debian's dataset-fashion-mnist puts its four gzip IDX files.
inline constexpr const char* kFashionMnistDirectory = "/usr/share/datasets/fashion-mnist";

struct ImageDataset {
  std::size_t count = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<std::uint8_t> images;  // count * rows * cols, row-major
  std::vector<std::uint8_t> labels;  // count, each < classes
  int classes = 10;
};

enum class DatasetSplit { kTrain, kTest };

// Loads the train (60,000) or test (10,000) split from `directory`. Checks
// magic numbers, shapes, that images and labels agree in count and that
// labels are < 10. A missing file names the package to install
// (`apt-get install dataset-fashion-mnist`); a corrupt one names the file.
ImageDataset load_fashion_mnist(DatasetSplit split,
                                const std::string& directory = kFashionMnistDirectory);

// The sample indices rank `rank` of `world` trains on in `epoch`: one
// permutation of [0, count) per (seed, epoch), identical on every rank, cut
// into `world` disjoint contiguous shards of floor(count / world / batch) *
// batch samples each (the last partial batch is dropped). Deterministic.
std::vector<std::uint32_t> epoch_shard(std::size_t count, int rank, int world, std::size_t batch,
                                       std::uint64_t seed, std::int64_t epoch);

}  // namespace sparsecomm
