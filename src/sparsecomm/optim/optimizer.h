#pragma once
// The optimizers that apply a synchronized gradient to one flat parameter
// vector, FlatSgd (sgd.h), FlatAdamW (adamw.h) and FlatMuon (muon.h), behind one interface so
// that the trainers, the parameter servers and the checkpoints hold either.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/core/state_io.h"

namespace sparsecomm {

class FlatOptimizer {
 public:
  virtual ~FlatOptimizer() = default;
  virtual std::string_view name() const = 0;

  // One step on `parameters` with the synchronized `gradient` (same length).
  // `share` in (0, 1]: this update is that share of one synchronous step (a
  // parameter server's asynchronous push of one of W workers has share
  // 1/W); each optimizer says how it weighs a share.
  virtual void step(std::span<float> parameters, std::span<const float> gradient,
                    double learning_rate, double share = 1.0) = 0;

  // Everything the next step depends on, for checkpoints (bit-exact resume).
  virtual void save(StateWriter& writer) const = 0;
  virtual void load(StateReader& reader) = 0;
};

struct SgdOptions {
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: p -= lr * wd * p
  // > 0: the second moment stops changing after this many steps (adamw.h).
  std::int64_t freeze_variance_after = 0;
};

// A matrix inside a flat parameter vector: rows x cols, row-major from offset.
struct MatrixBlock {
  std::size_t offset = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
};

// Muon (muon.h): the matrices it orthogonalizes; AdamW's options (weight
// decay included) serve every other element and the matrices' weight decay.
struct MuonOptions {
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  std::vector<MatrixBlock> matrices;  // in order of offset, apart
};

struct OptimizerOptions {
  std::string name = "sgd";  // sgd | adamw | muon
  SgdOptions sgd;
  AdamWOptions adamw;
  MuonOptions muon;
};

// The optimizers by name, in a fixed order.
const std::vector<std::string>& optimizer_names();

// The optimizer `options.name` with its options; InvalidArgument for an
// unknown name (listing the valid ones) or options out of range.
std::unique_ptr<FlatOptimizer> make_flat_optimizer(const OptimizerOptions& options);

}  // namespace sparsecomm
