#pragma once
// What the performance model needs to know about one of `sparsecomm
// train`'s models: its parameter count, its tensors' names and sizes, and
// the time of one forward + backward pass on this machine (LibTorch).

#include <cstdint>
#include <string>
#include <vector>

#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

struct ModelProbe {
  std::string model;
  std::int64_t batch = 0;
  int threads = 1;
  std::int64_t numel = 0;          // d
  std::vector<LayerSpan> tensors;  // named and laid out as the trainer packs them
  double compute_s = 0.0;          // median forward + backward of one batch
};

// Builds `model` (model_names() in train_config.h) and times forward,
// cross-entropy loss and backward on random inputs of `batch` samples with
// `threads` intra-op threads (the trainer's --threads-per-rank): `reps`
// timed passes after one warm-up, the median counts. InvalidArgument for an
// unknown model, batch < 1, threads < 1 or reps < 1.
ModelProbe probe_model(const std::string& model, std::int64_t batch, int threads, int reps);

}  // namespace sparsecomm
