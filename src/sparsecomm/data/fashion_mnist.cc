#include "sparsecomm/data/fashion_mnist.h"

#include <filesystem>
#include <numeric>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/data/idx.h"

namespace sparsecomm {
namespace {

constexpr std::uint64_t kShuffleSalt = 0x5eed5a4d1e0ull;

IdxArray read_part(const std::string& directory, const char* name) {
  const std::string path = (std::filesystem::path(directory) / name).string();
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    throw InvalidArgument(fmt::format(
        "[data] Fashion-MNIST file {} is missing: install the Debian package with "
        "`apt-get install dataset-fashion-mnist` (scripts/setup.sh does), or point the data "
        "directory at a copy of the four *-ubyte.gz files",
        path));
  }
  return read_idx(path);
}

}  // namespace

ImageDataset load_fashion_mnist(DatasetSplit split, const std::string& directory) {
  const bool train = split == DatasetSplit::kTrain;
  const IdxArray images =
      read_part(directory, train ? "train-images-idx3-ubyte.gz" : "t10k-images-idx3-ubyte.gz");
  const IdxArray labels =
      read_part(directory, train ? "train-labels-idx1-ubyte.gz" : "t10k-labels-idx1-ubyte.gz");
  if (images.shape.size() != 3 || labels.shape.size() != 1) {
    throw InvalidArgument(
        fmt::format("[data] {}: expected images of 3 dimensions and labels of 1, got {} and {}",
                    directory, images.shape.size(), labels.shape.size()));
  }
  if (images.shape[0] != labels.shape[0]) {
    throw InvalidArgument(fmt::format("[data] {}: {} images but {} labels", directory,
                                      images.shape[0], labels.shape[0]));
  }
  ImageDataset dataset;
  dataset.count = images.shape[0];
  dataset.rows = images.shape[1];
  dataset.cols = images.shape[2];
  dataset.images = std::move(images.data);
  dataset.labels = std::move(labels.data);
  for (std::size_t i = 0; i < dataset.count; ++i) {
    if (dataset.labels[i] >= dataset.classes) {
      throw InvalidArgument(fmt::format("[data] {}: label {} of sample {} is not a class 0..9",
                                        directory, dataset.labels[i], i));
    }
  }
  return dataset;
}

std::vector<std::uint32_t> epoch_shard(std::size_t count, int rank, int world, std::size_t batch,
                                       std::uint64_t seed, std::int64_t epoch) {
  if (world < 1 || rank < 0 || rank >= world || batch < 1) {
    throw InvalidArgument(fmt::format(
        "[data] epoch_shard: rank {} of {} with batch {} (need 0 <= rank < world, batch >= 1)",
        rank, world, batch));
  }
  std::vector<std::uint32_t> order(count);
  std::iota(order.begin(), order.end(), 0u);
  // Fisher-Yates driven by a counter-based RNG keyed by (seed, epoch).
  const Philox rng(seed ^ kShuffleSalt);
  for (std::size_t i = count; i > 1; --i) {
    const auto j = static_cast<std::size_t>(rng.below(i, static_cast<std::uint64_t>(epoch), i));
    std::swap(order[i - 1], order[j]);
  }
  const std::size_t per_rank = count / static_cast<std::size_t>(world) / batch * batch;
  const auto begin =
      order.begin() + static_cast<std::ptrdiff_t>(per_rank * static_cast<std::size_t>(rank));
  return {begin, begin + static_cast<std::ptrdiff_t>(per_rank)};
}

}  // namespace sparsecomm
