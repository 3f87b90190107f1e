#pragma once
// A Communicator over a torch.distributed process group (c10d; gloo on
// CPU), so that every sparsecomm collective and scheme runs wherever DDP
// runs. Only point-to-point is mapped (ProcessGroup::send / recv, which
// gloo offers for any size); every collective is sparsecomm's own, built on
// it (comm/communicator.h), because gloo in torch 1.13 has no uneven
// all_gather or alltoallv.

#include <memory>
#include <span>
#include <string_view>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm::python {

class ProcessGroupCommunicator final : public Communicator {
 public:
  // The group must outlive this communicator; InvalidArgument when null.
  explicit ProcessGroupCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> group);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "torch"; }

  // A message is one uint8 tensor wrapping the caller's bytes (no copy); an
  // empty message travels as one byte, so every send has a matching recv.
  Request isend(std::span<const std::byte> data, int dst, int tag) override;
  Request irecv(std::span<std::byte> data, int src, int tag) override;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace sparsecomm::python
