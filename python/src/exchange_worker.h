#pragma once
// The DDP hook's exchanges off backward's thread (docs/python.md, "Overlap
// with backward"). DDP hands the hook its buckets while backward still
// runs; the hook submits each group whose gradients are all in, and this
// worker runs the groups' exchanges on one thread of its own, strictly in
// submission order (so every rank exchanges in the same order), completing
// the futures DDP waits for after backward. Nothing here touches Python:
// the one exception is the error factory, which the caller supplies and
// which must take the GIL itself. A future's value (a Python object) is
// handed to DDP or, when the bucket fails, released on the caller's thread,
// never on the worker's: a Python reference dropped there could run the
// garbage collector there, and that could destroy this worker on its own
// thread.
//
// Inline mode (overlap off) runs each exchange inside submit(), on the
// caller's thread: the same code path, without the thread.

#include <ATen/core/ivalue.h>
#include <ATen/core/ivalue_inl.h>
#include <ATen/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sparsecomm/sync/step_metrics.h"

namespace sparsecomm::python {

class ExchangeWorker {
 public:
  // One group's exchange: reads and rewrites that group's gradients in the
  // buckets, returns the step's metrics of the group.
  using Exchange = std::function<StepMetrics()>;
  // Turns an exchange's exception (of the step given) into the error every
  // pending and later future fails with. Called once, on the thread that ran
  // the exchange.
  using ErrorFactory = std::function<std::exception_ptr(std::exception_ptr, std::int64_t step)>;

  ExchangeWorker(bool overlap, ErrorFactory make_error);
  // Joins the thread after the exchanges already submitted.
  ~ExchangeWorker();
  ExchangeWorker(const ExchangeWorker&) = delete;
  ExchangeWorker& operator=(const ExchangeWorker&) = delete;

  // A future that completes with `value` (made by the caller: DDP's Python
  // hook wants a Python object) once the groups listed (indices of
  // submit()) are exchanged; at once when the worker has failed. Call before
  // submitting any of those groups. `storages`: those of the tensors in
  // `value`, so that completing it never inspects a Python object.
  using WeakStorage = c10::ivalue::Future::WeakStorage;
  // `devices`: where those tensors are (none: the CPU); completing the
  // future then marks the worker's streams on them for its waiters.
  c10::intrusive_ptr<c10::ivalue::Future> bucket_future(c10::IValue value,
                                                        std::vector<WeakStorage> storages,
                                                        std::vector<c10::Device> devices,
                                                        std::vector<std::int64_t> groups);

  // Queues group `group`'s exchange of step `step`. `gradients`: the views
  // it writes, zeroed when any group of the step skips it (a non-finite
  // gradient under nonfinite=skip). `ends_step`: the step's last group.
  // After a failure, exchanges are dropped (the ranks are out of step).
  void submit(std::int64_t group, std::int64_t step, Exchange exchange,
              std::vector<at::Tensor> gradients, bool ends_step);

  // Waits until every submitted exchange has run (the caller should not
  // hold the GIL), then returns the last completed step's metrics, one per
  // group in submission order, once: nullopt when no step completed since
  // the last call or the worker failed.
  std::optional<std::vector<StepMetrics>> finished_step();

  bool overlap() const { return overlap_; }

  // Groups exchanged since the worker was made (any thread may ask).
  std::int64_t exchanged_groups() const { return exchanged_groups_.load(); }

  // The last completed step's exchanges: the seconds they ran (on the
  // worker, one after another) and, of those, the seconds before the
  // step's last group was handed in, that is while backward still ran.
  struct StepTimes {
    double exchange_s = 0.0;
    double overlapped_s = 0.0;
  };
  StepTimes finished_times() const;

 private:
  struct Job {
    std::int64_t group;
    std::int64_t step;
    Exchange exchange;
    std::vector<at::Tensor> gradients;
    bool ends_step;
  };
  struct PendingBucket {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    c10::IValue value;
    std::vector<WeakStorage> storages;
    std::vector<std::int64_t> groups;  // not exchanged yet
  };

  void run_loop();
  void run(Job& job);
  // Completes the buckets whose groups are all exchanged (mutex held).
  void complete_ready_buckets(std::int64_t group);
  void fail(std::exception_ptr error, std::int64_t step);

  const bool overlap_;
  const ErrorFactory make_error_;

  mutable std::mutex mutex_;
  std::condition_variable work_;  // a job queued, or stopping
  std::condition_variable idle_;  // the queue ran empty
  std::deque<Job> queue_;
  bool running_job_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::vector<PendingBucket> buckets_;
  std::vector<c10::IValue> failed_values_;  // released by the caller's thread
  // This step so far (worker thread only) and the last whole one.
  std::vector<StepMetrics> step_metrics_;
  std::vector<at::Tensor> step_gradients_;
  bool step_skipped_ = false;
  using Clock = std::chrono::steady_clock;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> step_runs_;
  Clock::time_point last_handed_in_;  // when the step's last group was submitted
  std::optional<std::vector<StepMetrics>> finished_;
  StepTimes finished_times_;

  std::atomic<std::int64_t> exchanged_groups_{0};

  std::thread thread_;  // last: started after everything above exists
};

}  // namespace sparsecomm::python
