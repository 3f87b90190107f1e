#pragma once
// train's --outer-overlap: a round's pseudo-gradient synchronized on a thread
// of its own while the next round's local steps run (docs/algorithms.md,
// "Local steps"). One exchange at a time; the caller's thread must not use
// the communicator while one is in flight (settle() first: evaluations,
// checkpoints).

#include <exception>
#include <span>
#include <thread>
#include <vector>

#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sync/step_metrics.h"
#include "sparsecomm/train/data_parallel.h"

namespace sparsecomm {

class OverlappedExchange {
 public:
  explicit OverlappedExchange(DataParallel& ddp);
  ~OverlappedExchange();  // waits for an exchange in flight
  OverlappedExchange(const OverlappedExchange&) = delete;
  OverlappedExchange& operator=(const OverlappedExchange&) = delete;

  // The exchange's buffer (numel floats): the drift before start(), the
  // ranks' mean once it has arrived.
  std::span<float> values() { return values_; }
  // Synchronizes values() through the DataParallel's method on a thread.
  // InvalidArgument while a mean is pending.
  void start(double epoch);
  // Waits for the exchange in flight, if any (rethrows what it threw); the
  // mean stays pending.
  void settle();
  // Whether a mean has not been taken yet (in flight, or arrived).
  bool pending() const { return pending_; }
  // Waits; the mean is then in values() and no longer pending. Returns the
  // exchange's metrics.
  StepMetrics take();

  // The pending mean and its metrics (settle() first: called by the
  // checkpoint, which waits for the exchange).
  void save(StateWriter& writer);
  void load(StateReader& reader);

 private:
  DataParallel& ddp_;
  std::vector<float> values_;
  std::thread thread_;
  std::exception_ptr failure_;
  StepMetrics metrics_;
  bool pending_ = false;
};

}  // namespace sparsecomm
