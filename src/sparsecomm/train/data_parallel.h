#pragma once
// DataParallel: the public C++ API for users' own LibTorch code, in the
// spirit of PyTorch's DistributedDataParallel. Wraps any torch::nn::Module
// (float32 parameters on the CPU) and a synchronization method:
//
//   sparsecomm::run_world(world, [&](sparsecomm::Communicator& comm) {
//     auto model = std::make_shared<MyNet>();
//     torch::optim::SGD optimizer(model->parameters(), 0.05);
//     sparsecomm::DataParallel ddp(*model, comm, sparsecomm::make_gradient_sync("exdyna", opts));
//     for (...) {
//       ddp.zero_grad();
//       loss_fn(model->forward(x), y).backward();
//       ddp.synchronize();        // every param.grad() now holds the synchronized average
//       optimizer.step();         // any optimizer (or FlatSgd on ddp.parameters())
//     }
//   });
//
// The constructor moves every parameter into one flat buffer and points
// every gradient at a slice of a second flat buffer (no copies per step, no
// allocation per step), then broadcasts rank 0's parameters and buffers so
// all replicas start equal. Every rank must call synchronize() every step.
// If user code replaces a gradient tensor (zero_grad with set_to_none), the
// next synchronize() copies it back into the flat buffer.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sync/gradient_sync.h"

namespace sparsecomm {

// A module's parameters moved into one flat buffer, and its gradients
// pointed at slices of a second one (from_blob aliases without autograd view
// metadata, keeping the buffers alive), so a step costs no copy and no
// allocation. No communication: DataParallel and the parameter-server worker
// build on it. NotSupported for parameters that are not float32 CPU tensors.
class FlatModule {
 public:
  explicit FlatModule(torch::nn::Module& module);

  std::span<float> parameters() { return {flat_parameters_.data_ptr<float>(), numel_}; }
  std::span<float> gradients() { return {flat_gradients_.data_ptr<float>(), numel_}; }
  std::span<const LayerSpan> layers() const { return layers_; }
  std::size_t numel() const { return numel_; }
  const std::vector<torch::Tensor>& parameter_tensors() const { return params_; }

  // Zeroes the flat gradient (and points every grad at its slice again).
  void zero_grad();
  // Makes every parameter's grad its slice of the flat gradient again,
  // copying in a gradient user code put elsewhere (zero_grad with
  // set_to_none) and zeroing the slice of a parameter with no gradient.
  void reattach_gradients();

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> grad_views_;
  std::vector<LayerSpan> layers_;
  torch::Tensor flat_parameters_;
  torch::Tensor flat_gradients_;
  std::size_t numel_ = 0;
};

// Builds one synchronization instance (one per bucket when pipelined).
using GradientSyncFactory = std::function<std::unique_ptr<GradientSync>()>;

struct DataParallelOptions {
  // Pipelining: parameters are grouped, in reverse registration order (the
  // order backward produces them), into buckets of at least this many bytes
  // of whole tensors; each bucket is synchronized on a communication thread
  // as soon as all its gradients are accumulated, while backward goes on.
  // 0: no pipelining (one synchronization after backward). Methods that are
  // not bucketable (MiCRO, ExDyna) always run unpipelined.
  std::size_t bucket_bytes = 0;
};

class DataParallel {
 public:
  // NotSupported for parameters that are not float32 CPU tensors.
  DataParallel(torch::nn::Module& module, Communicator& comm, std::unique_ptr<GradientSync> sync);
  // Pipelined when options.bucket_bytes > 0 and the method is bucketable:
  // then call zero_grad() before each forward (it starts the step), and
  // synchronize() after backward (it finishes buckets whose parameters got
  // no gradient, waits for all, and returns the step's combined metrics).
  DataParallel(torch::nn::Module& module, Communicator& comm, const GradientSyncFactory& make_sync,
               DataParallelOptions options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  void zero_grad();

  // Synchronizes the gradients of this step across all ranks (a collective).
  // `epoch` is the fractional epoch (DGC's warm-up follows it).
  StepMetrics synchronize(double epoch = 0.0);
  // The same for `values` (numel() floats of the caller's, not the module's
  // gradients: a pseudo-gradient exchanged while the next steps' backward
  // fills the gradients, train's --outer-overlap). Not pipelined. Must not
  // run while another call uses the communicator.
  StepMetrics synchronize(std::span<float> values, double epoch);

  // Copies rank `root`'s parameters / buffers (BatchNorm statistics) to all.
  void broadcast_parameters(int root = 0);
  void broadcast_buffers(int root = 0);

  std::span<float> parameters() { return flat_.parameters(); }
  std::span<float> gradients() { return flat_.gradients(); }
  std::span<const LayerSpan> layers() const { return flat_.layers(); }
  std::size_t numel() const { return flat_.numel(); }
  std::int64_t step() const { return step_; }
  GradientSync& sync() { return *syncs_.front(); }
  Communicator& communicator() { return comm_; }
  // Buckets in synchronization order (one covering everything when not
  // pipelined), as ranges of the flat vector.
  std::span<const Range> buckets() const { return bucket_ranges_; }
  bool pipelined() const { return pipeline_ != nullptr; }
  // Pipelined: how many parameters the backward hooks announced in the last
  // step (the others were completed when synchronize() was called).
  std::size_t hook_arrivals() const;

  // Step counter, synchronization state (residuals, thresholds, layouts)
  // and the module's buffers: with the parameters, what resuming needs.
  void save(StateWriter& writer) const;
  void load(StateReader& reader);

 private:
  class Pipeline;
  void start();
  StepContext context(std::int64_t bucket, double epoch) const;

  torch::nn::Module& module_;
  Communicator& comm_;
  FlatModule flat_;
  std::vector<std::unique_ptr<GradientSync>> syncs_;  // one per bucket
  std::vector<Range> bucket_ranges_;
  std::vector<std::vector<LayerSpan>> bucket_layers_;  // offsets relative to the bucket
  std::unique_ptr<Pipeline> pipeline_;
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators_;  // keep hooks alive
  std::vector<std::uintptr_t> hook_keys_;
  std::int64_t step_ = 0;
  double epoch_hint_ = 0.0;  // the last step's epoch, for a pipelined step's buckets
};

}  // namespace sparsecomm
