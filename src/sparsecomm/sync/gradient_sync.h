#pragma once
// Every synchronization method by name, behind one interface: what a trainer
// calls once per step with its flat local gradient.
//
//   dense       all-reduce of the whole gradient (our ring, or MPI's native)
//   skipreduce  Skip-Reduce: index-free pruning inside the ring
//   <scheme>    any sparsifier of the registry (topk, exdyna, ...) with its
//               exchange pattern and memory (SparsifyExchangeStep)
//
// Methods are built from key=value options (SchemeOptions); unknown names
// and options are InvalidArgument errors that list what is valid.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/sparsifier.h"
#include "sparsecomm/sync/sparsify_exchange_step.h"
#include "sparsecomm/sync/step_metrics.h"

namespace sparsecomm {

// The interface trainers use: one synchronization method (dense,
// skipreduce or a sparse scheme) on one flat gradient, once per step.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual std::string_view method() const = 0;

  // In: this rank's local gradient (same length every step and on every
  // rank). Out: `gradient` replaced by the synchronized average to apply.
  // Every rank calls it every step, in the same order as other collectives.
  virtual StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                                  Communicator& comm) = 0;

  // True when the method applies momentum itself (DGC's momentum
  // correction): the optimizer must then run without momentum.
  virtual bool applies_momentum() const { return false; }

  // True when the method may synchronize a gradient in independent pieces
  // (pipelined buckets, one instance per bucket). False for the global
  // schemes whose partitions and threshold span the whole vector (MiCRO,
  // ExDyna): they run once on the whole gradient after backward.
  virtual bool bucketable() const { return true; }

  // What error feedback kept back after the last step (the residual, one
  // value per element of the gradient); empty for methods without memory
  // and before the first step.
  virtual std::span<const float> kept() const { return {}; }

  // Everything needed to resume bit-exactly (residuals, thresholds, ...).
  virtual void save(StateWriter& writer) const = 0;
  virtual void load(StateReader& reader) = 0;
};

struct SyncMethodInfo {
  std::string name;
  std::string summary;
  std::vector<OptionSpec> options;
};

// dense, skipreduce, then the registry's sparsifiers, in a fixed order.
const std::vector<SyncMethodInfo>& sync_methods();
// "dense, skipreduce, topk, ..." for messages.
std::string sync_method_names();
// The method called `name`, or null.
const SyncMethodInfo* find_sync_method(std::string_view name);
// The method called `name`; InvalidArgument naming the valid ones otherwise.
const SyncMethodInfo& sync_method(std::string_view name);

std::unique_ptr<GradientSync> make_gradient_sync(
    std::string_view method, const SchemeOptions& options,
    NonFinitePolicy nonfinite = NonFinitePolicy::kStop);

}  // namespace sparsecomm
