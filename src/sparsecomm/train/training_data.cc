#include "sparsecomm/train/training_data.h"

#include <algorithm>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/data/fashion_mnist.h"
#include "sparsecomm/data/synthetic_images.h"
#include "sparsecomm/data/text_corpus.h"

namespace sparsecomm {
namespace {

// Fashion-MNIST's pixel mean and standard deviation (of x / 255).
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;

TensorSplit to_tensors(const ImageDataset& data, std::int64_t limit) {
  const auto n = static_cast<std::int64_t>(
      limit > 0 ? std::min<std::size_t>(data.count, static_cast<std::size_t>(limit)) : data.count);
  const auto rows = static_cast<std::int64_t>(data.rows);
  const auto cols = static_cast<std::int64_t>(data.cols);
  torch::Tensor raw = torch::from_blob(const_cast<std::uint8_t*>(data.images.data()),
                                       {n, 1, rows, cols}, torch::kUInt8);
  TensorSplit split;
  split.inputs = (raw.to(torch::kFloat32) / 255.0f - kPixelMean) / kPixelStd;
  split.labels = torch::from_blob(const_cast<std::uint8_t*>(data.labels.data()), {n}, torch::kUInt8)
                     .to(torch::kInt64);
  return split;
}

TensorSplit to_tensors(const TextSamples& data, std::int64_t limit) {
  const auto n = static_cast<std::int64_t>(
      limit > 0 ? std::min<std::size_t>(data.count, static_cast<std::size_t>(limit)) : data.count);
  const auto window = static_cast<std::int64_t>(data.window);
  TensorSplit split;
  split.inputs =
      torch::from_blob(const_cast<std::uint8_t*>(data.inputs.data()), {n, window}, torch::kUInt8)
          .to(torch::kInt64);
  split.labels = torch::from_blob(const_cast<std::uint8_t*>(data.labels.data()), {n}, torch::kUInt8)
                     .to(torch::kInt64);
  return split;
}

// The image models (mlp, cnn, resnet18, wide-mlp) take Fashion-MNIST's
// 28x28 pixels; another size would end in a LibTorch shape error mid-run.
ImageDataset checked_image_size(ImageDataset data, const std::string& directory) {
  if (data.rows != 28 || data.cols != 28) {
    throw InvalidArgument(fmt::format(
        "[data] {} holds images of {}x{} pixels; the image models take 28x28 (Fashion-MNIST's "
        "size): give --data-dir a directory of 28x28 images",
        directory, data.rows, data.cols));
  }
  return data;
}

}  // namespace

Datasets load_datasets(const TrainConfig& config) {
  Datasets out;
  if (dataset_input(config.dataset) == InputKind::kClicks) {
    return out;  // generated on the fly by the click trainer (data/click_log.h)
  } else if (config.dataset == "fortunes") {
    const TextCorpus corpus = load_fortunes(data_dir_of(config));
    out.train = to_tensors(corpus.train, config.train_samples);
    out.test = to_tensors(corpus.test, config.test_samples);
  } else if (config.dataset == "synthetic") {
    const std::size_t train = config.train_samples > 0 ? config.train_samples : 16384;
    const std::size_t test = config.test_samples > 0 ? config.test_samples : 4096;
    out.train = to_tensors(make_synthetic_images(train, config.seed, 0), 0);
    out.test = to_tensors(make_synthetic_images(test, config.seed, 1ull << 40), 0);
  } else {
    const std::string dir = data_dir_of(config);
    out.train = to_tensors(checked_image_size(load_fashion_mnist(DatasetSplit::kTrain, dir), dir),
                           config.train_samples);
    out.test = to_tensors(checked_image_size(load_fashion_mnist(DatasetSplit::kTest, dir), dir),
                          config.test_samples);
  }
  return out;
}

EpochBatches::EpochBatches(const TensorSplit& train, int trainer, int trainers, std::int64_t batch,
                           std::uint64_t seed, std::int64_t steps_per_epoch)
    : train_(train),
      trainer_(trainer),
      trainers_(trainers),
      batch_(batch),
      seed_(seed),
      steps_per_epoch_(steps_per_epoch) {}

EpochBatches::Batch EpochBatches::at(std::int64_t step) {
  const std::int64_t epoch = step / steps_per_epoch_;
  if (epoch != shard_epoch_) {
    shard_ = epoch_shard(static_cast<std::size_t>(train_.count()), trainer_, trainers_,
                         static_cast<std::size_t>(batch_), seed_, epoch);
    shard_epoch_ = epoch;
  }
  const std::int64_t first = (step % steps_per_epoch_) * batch_;
  std::vector<std::int64_t> indices(shard_.begin() + first, shard_.begin() + first + batch_);
  const torch::Tensor index = torch::tensor(indices, torch::kInt64);
  return {train_.inputs.index_select(0, index), train_.labels.index_select(0, index)};
}

}  // namespace sparsecomm
