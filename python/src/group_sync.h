#pragma once
// What the DDP hook's worker (exchange_worker.h) runs for one group: a
// synchronization of one flat gradient, on the host (synchronizer.cc's
// Synchronizer: every method of the CLI, float32 CPU tensors) or on the
// gradient's device (device_sync.h).

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/sync/step_metrics.h"

namespace sparsecomm::python {

// One step of one group: StepContext without the rank (the synchronization
// knows it), owning its tensors' spans.
struct GroupStep {
  std::int64_t step = 0;
  double epoch = 0.0;
  std::int64_t bucket = 0;
  std::vector<LayerSpan> layers;  // empty: one tensor
};

class GroupSync {
 public:
  virtual ~GroupSync() = default;
  // InvalidArgument when `gradient` is not one this synchronization takes
  // (called on the caller's thread, before the exchange is queued).
  virtual void check(const at::Tensor& gradient) const = 0;
  // Replaces `gradient` by the average over ranks; may run on any thread
  // (without the GIL).
  virtual StepMetrics run(const at::Tensor& gradient, const GroupStep& step) = 0;
};

}  // namespace sparsecomm::python
