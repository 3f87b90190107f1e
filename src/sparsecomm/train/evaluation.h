#pragma once
// Test-set evaluation for the trainers (internal to train/): counts over a
// range of the test split, and deferred evaluation: the model's parameters
// and buffers kept at each evaluation point and evaluated after training,
// so that evaluation takes none of the training's wall time
// (TrainConfig::eval_deferred).

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <torch/torch.h>

#include "sparsecomm/train/models.h"
#include "sparsecomm/train/trainer.h"
#include "sparsecomm/train/training_data.h"

namespace sparsecomm {

// Where an evaluation happens in the run, and this rank's training loss
// since the previous one.
struct EvalPoint {
  std::int64_t step = 0;  // steps completed
  double epoch = 0.0;
  double wall_s = 0.0;
  double train_loss_sum = 0.0;
  std::int64_t train_loss_count = 0;
};

struct EvalCounts {
  std::int64_t correct = 0;
  double loss_sum = 0.0;  // summed cross-entropy
};

// The model (switched to eval mode and back) on test samples [begin, end).
EvalCounts evaluate_range(Model& model, const TensorSplit& test, std::int64_t begin,
                          std::int64_t end);

// The TrainEval of `at` from totals over the whole test set (`test_count`
// samples) and over every rank's training loss.
TrainEval make_train_eval(const EvalPoint& at, std::int64_t test_count, const EvalCounts& counts,
                          double train_loss_sum, std::int64_t train_loss_count);

class EvalSnapshots {
 public:
  // Keeps a copy of `parameters` (the model's flat parameters) and of the
  // model's buffers (BatchNorm statistics).
  void take(const EvalPoint& point, std::span<const float> parameters, torch::nn::Module& model);
  std::size_t size() const { return snapshots_.size(); }

  // For each point in order: loads its parameters and buffers into the
  // model (`parameters` is the model's flat parameter storage) and calls
  // evaluate(point); then restores the model's own parameters and buffers
  // and forgets the points.
  void replay(torch::nn::Module& model, std::span<float> parameters,
              const std::function<void(const EvalPoint&)>& evaluate);

 private:
  struct Snapshot {
    EvalPoint point;
    std::vector<float> parameters;
    std::vector<torch::Tensor> buffers;
  };
  std::vector<Snapshot> snapshots_;
};

}  // namespace sparsecomm
