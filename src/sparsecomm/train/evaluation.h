#pragma once
// Test-set evaluation for the trainers (internal to train/): counts over a
// range of the test split, and deferred evaluation: the model's parameters
// and buffers kept at each evaluation point and evaluated after training,
// so that evaluation takes none of the training's wall time
// (TrainConfig::eval_deferred).

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "sparsecomm/train/models.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/train_records.h"
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

// The area under the ROC curve from per-label histograms of the predicted
// probability over increasing bins (ties within a bin count half); NaN
// without both labels.
double histogram_auc(std::span<const std::int64_t> negatives,
                     std::span<const std::int64_t> positives);

// A model's parameters and buffers at an evaluation point.
struct EvalSnapshot {
  EvalPoint point;
  std::vector<float> parameters;
  std::vector<torch::Tensor> buffers;  // BatchNorm statistics
};

// Test hook: called at the start of every evaluate_range() (on the thread
// that evaluates), e.g. to make an evaluation slow. nullptr removes it.
void set_evaluation_hook(std::function<void()> hook);

// Evaluations on a thread of their own, on a replica of the model, in the
// order they were asked for: the caller hands over a copy of the parameters
// and goes on training at once (the copies queue while an evaluation runs).
// The parameter-server trainer's rank 0 evaluates this way, so the workers
// waiting for its pushes never wait on an evaluation (a long one would look
// like a dead rank to their timeout).
class BackgroundEvaluation {
 public:
  struct Result {
    EvalPoint point;
    EvalCounts counts;
  };
  // `replica`: a model of the same architecture, used only by this object
  // (on its thread); `replica_parameters`: its flat parameter storage.
  BackgroundEvaluation(std::shared_ptr<Model> replica, std::span<float> replica_parameters,
                       const TensorSplit& test);
  ~BackgroundEvaluation();  // stops after the running evaluation; queued ones are dropped
  BackgroundEvaluation(const BackgroundEvaluation&) = delete;
  BackgroundEvaluation& operator=(const BackgroundEvaluation&) = delete;

  // Queues an evaluation of `parameters` with `model`'s buffers at `point`.
  void submit(const EvalPoint& point, std::span<const float> parameters, torch::nn::Module& model);
  // The evaluations finished since the last call, in order, without
  // waiting. Rethrows what an evaluation threw.
  std::vector<Result> finished();
  // Waits until every queued evaluation is done; returns them in order.
  std::vector<Result> drain();

 private:
  void work();

  std::shared_ptr<Model> replica_;
  std::span<float> replica_parameters_;
  const TensorSplit& test_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<EvalSnapshot> queued_;  // guarded by mutex_
  std::vector<Result> done_;         // guarded by mutex_
  std::exception_ptr failure_;       // guarded by mutex_
  bool busy_ = false;                // guarded by mutex_: an evaluation runs
  bool stopping_ = false;            // guarded by mutex_
  std::thread thread_;               // last: starts after the members above exist
};

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
  std::vector<EvalSnapshot> snapshots_;
};

}  // namespace sparsecomm
