#pragma once
// GradientSync: what a trainer calls once per step with its flat local
// gradient, whichever method synchronizes it. gradient_sync.h builds one by
// name; SparsifyExchangeStep (the registry's sparsifiers) implements it, as
// do dense and Skip-Reduce in gradient_sync.cc.

#include <memory>
#include <span>
#include <string_view>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sparsify/sparsifier.h"
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

// A GradientSync around another (the dense warm-up, dense layers, two
// levels): the method, its momentum, whether it buckets and what it kept
// are the inner one's unless the decorator says otherwise. `inner` is not
// null.
class GradientSyncDecorator : public GradientSync {
 public:
  explicit GradientSyncDecorator(std::unique_ptr<GradientSync> inner) : inner_(std::move(inner)) {}

  std::string_view method() const override { return inner_->method(); }
  bool applies_momentum() const override { return inner_->applies_momentum(); }
  bool bucketable() const override { return inner_->bucketable(); }
  std::span<const float> kept() const override { return inner_->kept(); }

 protected:
  std::unique_ptr<GradientSync> inner_;
};

}  // namespace sparsecomm
