#pragma once
// How a data-parallel rank turns its local gradient into a parameter update
// around the synchronization (docs/algorithms.md, "Optimizers and
// compression"). Two places for the optimizer's state:
//
//   compress gradient  the method synchronizes the local gradient; one
//                      optimizer (SGD or AdamW) then steps on the average,
//                      with the same state on every rank.
//   compress update    (AdamW only) every rank runs AdamW's moments on its
//                      own gradient and the method synchronizes the
//                      resulting direction m^ / (sqrt(v^) + eps); the
//                      average is applied as p -= lr * (u + wd * p). Error
//                      feedback then keeps back what the optimizer would
//                      have applied, not a raw gradient whose scale Adam's
//                      per-coordinate normalization undoes. The moments
//                      differ between ranks; the parameters do not.
//
// Usage per step: before_sync(local gradient) -> synchronize -> apply().

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/core/state_io.h"
#include "sparsecomm/optim/adamw.h"
#include "sparsecomm/optim/optimizer.h"

namespace sparsecomm {

enum class Compress { kGradient, kUpdate };

// "gradient" | "update"; InvalidArgument otherwise.
Compress parse_compress(std::string_view name);
std::string_view compress_name(Compress compress);

class UpdateRule {
 public:
  // InvalidArgument for invalid optimizer options, or kUpdate with an
  // optimizer other than AdamW.
  UpdateRule(const OptimizerOptions& options, Compress compress);

  // In place: the local gradient becomes what the method synchronizes. A
  // gradient with a NaN or inf is left as it is (and the moments are not
  // advanced), so that the method's non-finite policy stops or skips the step.
  void before_sync(std::span<float> local);
  // One step with the synchronized vector.
  void apply(std::span<float> parameters, std::span<const float> synchronized,
             double learning_rate);

  Compress compress() const { return compress_; }
  std::string_view optimizer_name() const { return optimizer_name_; }

  // Both halves' state: the step's optimizer, then the local moments (kUpdate).
  void save(StateWriter& writer) const;
  void load(StateReader& reader);

 private:
  Compress compress_;
  std::string optimizer_name_;
  std::unique_ptr<FlatOptimizer> step_;       // applies the synchronized vector
  std::unique_ptr<FlatAdamW> local_moments_;  // kUpdate: this rank's moments
};

}  // namespace sparsecomm
