#pragma once
// The trainer's data (internal to train/): Fashion-MNIST or the synthetic
// images as normalized tensors, or the fortunes text as character ids, and
// each rank's batches, epoch by epoch.

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "sparsecomm/train/train_config.h"

namespace sparsecomm {

struct TensorSplit {
  torch::Tensor inputs;  // images: [N, 1, 28, 28] float, normalized; text: [N, T] int64 ids
  torch::Tensor labels;  // [N] int64 (text: the id of the character after each window)
  std::int64_t count() const { return labels.size(0); }
};

struct Datasets {
  TensorSplit train;
  TensorSplit test;
};

// The configured dataset (`train_samples` / `test_samples` cut it to its
// first N; the synthetic one has 16,384 / 4,096 by default; fortunes: see
// load_fortunes in src/sparsecomm/data/text_corpus.h). The click log is
// generated on the fly by the click trainer: empty splits for it.
Datasets load_datasets(const TrainConfig& config);

// The batches one trainer (an all-reduce rank or a PS worker) of `trainers`
// takes: per epoch its shard of a fresh permutation (epoch_shard), cut into
// steps of `batch` samples. Identical on every backend.
class EpochBatches {
 public:
  EpochBatches(const TensorSplit& train, int trainer, int trainers, std::int64_t batch,
               std::uint64_t seed, std::int64_t steps_per_epoch);

  struct Batch {
    torch::Tensor inputs;
    torch::Tensor labels;
  };
  // The batch of global step `step` (0-based).
  Batch at(std::int64_t step);

 private:
  const TensorSplit& train_;
  int trainer_;
  int trainers_;
  std::int64_t batch_;
  std::uint64_t seed_;
  std::int64_t steps_per_epoch_;
  std::vector<std::uint32_t> shard_;
  std::int64_t shard_epoch_ = -1;
};

}  // namespace sparsecomm
