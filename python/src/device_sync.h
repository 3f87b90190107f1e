#pragma once
// Synchronization on the gradient's own device (docs/python.md, "On the
// gradient's device"): the error feedback residual, the selection and the
// sum of the ranks' selections stay where the gradient is (a CUDA device, or
// the CPU); only the compact (indices, values) cross, through the process
// group's own collectives (all_gather of counted, padded buffers: NCCL for
// an NCCL group, gloo for a gloo one). Written in ATen operations, so the
// same code runs on any device torch has kernels for, and the tests run it
// on the CPU.
//
// Methods (the registry's: SyncMethodInfo::device_path and device_options,
// whose names device_method_names() lists):
//   topk       exact Top-k of |g + e| (k = round(density * d), at least 1):
//              a histogram of log2|a| over 64 bins finds the bin that holds
//              the k-th largest, the elements at or above its lower edge are
//              the candidates, and torch.topk picks exactly k among them
//              (the full-vector topk only when the histogram cannot split).
//   threshold  |g + e| >= lambda (option lambda; default 1/(2 sqrt(k)) as
//              the host scheme's).
//   dense      the process group's all_reduce (the hook's excluded tensors).
// Error feedback (memory=ef, the only one here): e <- a - selection.

#include <ATen/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "group_sync.h"
#include "sparsecomm/sync/sparsify_sequence.h"

namespace sparsecomm::python {

// "dense, topk, threshold": the methods with a device path, for messages and
// for the hook's choice (sparsecomm.device_methods()).
std::string device_method_names();

class DeviceSynchronizer final : public GroupSync {
 public:
  // `group` null: this process alone. InvalidArgument for another method,
  // an unknown option or a density outside (0, 1].
  DeviceSynchronizer(c10::intrusive_ptr<c10d::ProcessGroup> group, const std::string& method,
                     const std::map<std::string, std::string>& options,
                     const std::string& nonfinite);

  // `gradient` (float32, contiguous, on any device; the same device and
  // length every step) becomes the average over ranks of the selections.
  StepMetrics run(const at::Tensor& gradient, const GroupStep& step) override;
  void check(const at::Tensor& gradient) const override;

  // The residual (a copy on the CPU); empty before the first step and for dense.
  at::Tensor kept() const;
  const std::string& method() const { return method_; }
  // A copy of the residual, to save and restore (on its device; moved to
  // the gradient's at the next step).
  at::Tensor state() const { return residual_.defined() ? residual_.clone() : at::Tensor(); }
  void load_state(const at::Tensor& residual);

  // This step's selection of `accumulated` (|.| ranked): ascending int64
  // indices. Public for the tests of the selection itself.
  at::Tensor select(const at::Tensor& accumulated, std::int64_t k) const;

 private:
  std::int64_t target(std::int64_t numel) const;
  int world_size() const { return group_ ? group_->getSize() : 1; }
  // Every rank's gradient finite? (one all_reduce of a flag).
  bool all_finite(const at::Tensor& gradient, StepMetrics& metrics);
  // The sum over ranks of their (indices, values) into `out` (zeroed here).
  void sum_selections(const at::Tensor& indices, const at::Tensor& values, at::Tensor& out,
                      StepMetrics& metrics);

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::string method_;
  double density_ = 0.01;
  double lambda_ = -1.0;  // threshold: < 0 for the default
  NonFinitePolicy policy_;
  at::Tensor residual_;  // e, on the gradient's device
};

}  // namespace sparsecomm::python
