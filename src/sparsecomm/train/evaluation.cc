#include "sparsecomm/train/evaluation.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace sparsecomm {
namespace {

constexpr std::int64_t kEvalBatch = 1000;

std::vector<torch::Tensor> buffer_copies(torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& buffer : model.buffers()) out.push_back(buffer.clone());
  return out;
}

void load_buffers(torch::nn::Module& model, const std::vector<torch::Tensor>& saved) {
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> buffers = model.buffers();
  for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
}

EvalSnapshot snapshot_of(const EvalPoint& point, std::span<const float> parameters,
                         torch::nn::Module& model) {
  return {point, std::vector<float>(parameters.begin(), parameters.end()), buffer_copies(model)};
}

// Loads a snapshot into `model`, whose flat parameter storage is `parameters`.
void load_snapshot(const EvalSnapshot& snapshot, torch::nn::Module& model,
                   std::span<float> parameters) {
  std::copy(snapshot.parameters.begin(), snapshot.parameters.end(), parameters.begin());
  load_buffers(model, snapshot.buffers);
}

std::function<void()>& evaluation_hook() {
  static std::function<void()> hook;
  return hook;
}

}  // namespace

void set_evaluation_hook(std::function<void()> hook) { evaluation_hook() = std::move(hook); }

EvalCounts evaluate_range(Model& model, const TensorSplit& test, std::int64_t begin,
                          std::int64_t end) {
  if (evaluation_hook()) evaluation_hook()();
  const bool was_training = model.is_training();
  model.eval();
  EvalCounts counts;
  {
    torch::NoGradGuard no_grad;
    for (std::int64_t first = begin; first < end; first += kEvalBatch) {
      const std::int64_t count = std::min(kEvalBatch, end - first);
      const torch::Tensor labels = test.labels.narrow(0, first, count);
      const Model::Scores scores = model.score(test.inputs.narrow(0, first, count), labels);
      counts.loss_sum += scores.losses.sum().item<double>();
      counts.correct += scores.logits.argmax(1).eq(labels).sum().item<std::int64_t>();
    }
  }
  if (was_training) model.train();
  return counts;
}

TrainEval make_train_eval(const EvalPoint& at, std::int64_t test_count, const EvalCounts& counts,
                          double train_loss_sum, std::int64_t train_loss_count) {
  TrainEval eval;
  eval.step = at.step;
  eval.epoch = at.epoch;
  eval.wall_s = at.wall_s;
  const auto n = static_cast<double>(test_count);
  eval.test_accuracy = test_count > 0 ? static_cast<double>(counts.correct) / n : 0.0;
  eval.test_loss = test_count > 0 ? counts.loss_sum / n : 0.0;
  eval.train_loss =
      train_loss_count > 0 ? train_loss_sum / static_cast<double>(train_loss_count) : std::nan("");
  return eval;
}

BackgroundEvaluation::BackgroundEvaluation(std::shared_ptr<Model> replica,
                                           std::span<float> replica_parameters,
                                           const TensorSplit& test)
    : replica_(std::move(replica)),
      replica_parameters_(replica_parameters),
      test_(test),
      thread_([this] { work(); }) {}

BackgroundEvaluation::~BackgroundEvaluation() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void BackgroundEvaluation::submit(const EvalPoint& point, std::span<const float> parameters,
                                  torch::nn::Module& model) {
  EvalSnapshot snapshot = snapshot_of(point, parameters, model);
  {
    std::lock_guard lock(mutex_);
    queued_.push_back(std::move(snapshot));
  }
  changed_.notify_all();
}

std::vector<BackgroundEvaluation::Result> BackgroundEvaluation::finished() {
  std::lock_guard lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  return std::exchange(done_, {});
}

std::vector<BackgroundEvaluation::Result> BackgroundEvaluation::drain() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return failure_ || (queued_.empty() && !busy_); });
  if (failure_) std::rethrow_exception(failure_);
  return std::exchange(done_, {});
}

void BackgroundEvaluation::work() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !queued_.empty(); });
    if (stopping_) return;
    EvalSnapshot snapshot = std::move(queued_.front());
    queued_.pop_front();
    busy_ = true;
    lock.unlock();
    Result result{snapshot.point, {}};
    std::exception_ptr failure;
    try {
      load_snapshot(snapshot, *replica_, replica_parameters_);
      result.counts = evaluate_range(*replica_, test_, 0, test_.count());
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (failure) {
      failure_ = failure;
      queued_.clear();
    } else {
      done_.push_back(result);
    }
    changed_.notify_all();
  }
}

void EvalSnapshots::take(const EvalPoint& point, std::span<const float> parameters,
                         torch::nn::Module& model) {
  snapshots_.push_back(snapshot_of(point, parameters, model));
}

void EvalSnapshots::replay(torch::nn::Module& model, std::span<float> parameters,
                           const std::function<void(const EvalPoint&)>& evaluate) {
  if (snapshots_.empty()) return;
  const std::vector<float> own_parameters(parameters.begin(), parameters.end());
  const std::vector<torch::Tensor> own_buffers = buffer_copies(model);
  for (const EvalSnapshot& snapshot : snapshots_) {
    load_snapshot(snapshot, model, parameters);
    evaluate(snapshot.point);
  }
  std::copy(own_parameters.begin(), own_parameters.end(), parameters.begin());
  load_buffers(model, own_buffers);
  snapshots_.clear();
}

double histogram_auc(std::span<const std::int64_t> negatives,
                     std::span<const std::int64_t> positives) {
  double below = 0.0;  // negatives in lower bins
  double pairs = 0.0;
  double total_negative = 0.0;
  double total_positive = 0.0;
  for (std::size_t b = 0; b < negatives.size(); ++b) {
    const auto neg = static_cast<double>(negatives[b]);
    const auto pos = static_cast<double>(positives[b]);
    pairs += pos * (below + 0.5 * neg);
    below += neg;
    total_negative += neg;
    total_positive += pos;
  }
  if (total_negative == 0.0 || total_positive == 0.0) return std::nan("");
  return pairs / (total_negative * total_positive);
}

}  // namespace sparsecomm
