#pragma once
// The DDP hook on two levels through torch.distributed subgroups
// (docs/python.md, "Two levels"): the ranks of a host average a group's
// gradient on its own device through the host's process group (NCCL inside
// a GPU host, gloo on CPUs), the host's leader runs the method between hosts
// (`between`: a Synchronizer over the leaders' gloo group) on a CPU copy, and
// the leader hands its host the outcome (done, skipped, stopped) and the
// result through the host's group. Only leaders keep the method's state, as
// sync/two_level.h does with thread and MPI ranks, whose steps this mirrors.

#include <ATen/Tensor.h>

#include <memory>
#include <optional>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "group_sync.h"

namespace sparsecomm::python {

class HostLevels final : public GroupSync {
 public:
  // `host`: this rank's host group, its leader rank 0 of it; `between`: the
  // leaders' synchronization on the leader, null on the others.
  // InvalidArgument when `host` is null, or `between` is given on a rank
  // that does not lead (or missing on one that does).
  HostLevels(c10::intrusive_ptr<c10d::ProcessGroup> host, std::shared_ptr<GroupSync> between);

  // A float32 contiguous tensor on any device.
  void check(const at::Tensor& gradient) const override;
  // Host average, the leader's exchange, the host's broadcast. Throws
  // NonFiniteGradient on every rank of a host whose leader stopped.
  StepMetrics run(const at::Tensor& gradient, const GroupStep& step) override;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> host_;
  std::shared_ptr<GroupSync> between_;
  std::optional<at::Tensor> staging_;  // the leader's CPU copy of a device's gradient
};

}  // namespace sparsecomm::python
