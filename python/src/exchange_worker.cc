#include "exchange_worker.h"

#include <algorithm>

namespace sparsecomm::python {

ExchangeWorker::ExchangeWorker(bool overlap, ErrorFactory make_error)
    : overlap_(overlap), make_error_(std::move(make_error)) {
  if (overlap_) thread_ = std::thread([this] { run_loop(); });
}

ExchangeWorker::~ExchangeWorker() {
  // Joining from the worker's own thread cannot work; the class keeps
  // Python's garbage collector off that thread (see the header).
  TORCH_CHECK(!thread_.joinable() || thread_.get_id() != std::this_thread::get_id(),
              "sparsecomm: the hook's exchange worker was destroyed on its own thread");
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
    // Exchanges still queued belong to a step that backward abandoned (an
    // exception in the model); running them could wait on peers forever.
    queue_.clear();
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

c10::intrusive_ptr<c10::ivalue::Future> ExchangeWorker::bucket_future(
    c10::IValue value, std::vector<WeakStorage> storages, std::vector<c10::Device> devices,
    std::vector<std::int64_t> groups) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(value.type(), std::move(devices));
  std::exception_ptr error;
  std::vector<c10::IValue> released;  // destroyed here, on the caller's thread
  {
    const std::lock_guard lock(mutex_);
    released.swap(failed_values_);
    error = error_;
    if (!error) {
      buckets_.push_back({future, std::move(value), std::move(storages), std::move(groups)});
    }
  }
  if (error) future->setError(error);
  return future;
}

void ExchangeWorker::submit(std::int64_t group, std::int64_t step, Exchange exchange,
                            std::vector<at::Tensor> gradients, bool ends_step) {
  Job job{group, step, std::move(exchange), std::move(gradients), ends_step};
  {
    const std::lock_guard lock(mutex_);
    if (error_) return;
    if (ends_step) last_handed_in_ = Clock::now();
    if (overlap_) {
      queue_.push_back(std::move(job));
      work_.notify_one();
      return;
    }
  }
  run(job);  // inline: on the caller's (backward's) thread
}

std::optional<std::vector<StepMetrics>> ExchangeWorker::finished_step() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && !running_job_; });
  return std::exchange(finished_, std::nullopt);
}

ExchangeWorker::StepTimes ExchangeWorker::finished_times() const {
  const std::lock_guard lock(mutex_);
  return finished_times_;
}

void ExchangeWorker::run_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    Job job = std::move(queue_.front());
    queue_.pop_front();
    running_job_ = true;
    lock.unlock();
    run(job);
    job = {};  // its tensors and closure go before the lock is taken again
    lock.lock();
    running_job_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

void ExchangeWorker::run(Job& job) {
  const Clock::time_point start = Clock::now();
  StepMetrics metrics;
  try {
    metrics = job.exchange();
  } catch (...) {
    fail(std::current_exception(), job.step);
    return;
  }
  step_runs_.emplace_back(start, Clock::now());
  step_skipped_ = step_skipped_ || metrics.skipped_nonfinite;
  step_metrics_.push_back(std::move(metrics));
  step_gradients_.insert(step_gradients_.end(), job.gradients.begin(), job.gradients.end());
  if (job.ends_step && step_skipped_) {
    // One group's NaN or inf skips the whole step on every rank. DDP reads
    // every bucket after the last future, so this reaches the buckets
    // whose futures completed already too.
    for (at::Tensor& gradient : step_gradients_) gradient.zero_();
  }

  std::vector<PendingBucket> completed;
  {
    const std::lock_guard lock(mutex_);
    if (job.ends_step) {
      StepTimes times;
      for (const auto& [begin, end] : step_runs_) {
        times.exchange_s += std::chrono::duration<double>(end - begin).count();
        if (overlap_ && begin < last_handed_in_) {
          times.overlapped_s +=
              std::chrono::duration<double>(std::min(end, last_handed_in_) - begin).count();
        }
      }
      finished_ = std::move(step_metrics_);
      finished_times_ = times;
      step_metrics_.clear();
      step_gradients_.clear();
      step_runs_.clear();
      step_skipped_ = false;
    }
    std::vector<PendingBucket> waiting;
    for (PendingBucket& bucket : buckets_) {
      std::erase(bucket.groups, job.group);
      (bucket.groups.empty() ? completed : waiting).push_back(std::move(bucket));
    }
    buckets_ = std::move(waiting);
  }
  exchanged_groups_.fetch_add(1);
  // Outside the lock: completing runs the future's callbacks.
  for (PendingBucket& bucket : completed) {
    bucket.future->markCompleted(std::move(bucket.value), std::move(bucket.storages));
  }
}

void ExchangeWorker::fail(std::exception_ptr error, std::int64_t step) {
  const std::exception_ptr converted = make_error_(std::move(error), step);
  std::vector<PendingBucket> failed;
  std::deque<Job> dropped;
  {
    const std::lock_guard lock(mutex_);
    error_ = converted;
    failed = std::move(buckets_);
    buckets_.clear();
    for (PendingBucket& bucket : failed) failed_values_.push_back(std::move(bucket.value));
    dropped = std::move(queue_);  // the ranks are out of step: exchange nothing more
    queue_.clear();
  }
  step_metrics_.clear();
  step_gradients_.clear();
  step_runs_.clear();
  step_skipped_ = false;
  for (PendingBucket& bucket : failed) bucket.future->setError(converted);
}

}  // namespace sparsecomm::python
