#include "host_levels.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "sparsecomm/comm/host_names.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sync/step_metrics.h"
#include "sparsecomm/sync/two_level.h"

namespace py = pybind11;

namespace sparsecomm::python {
namespace {

// What a leader tells its host after the exchange between hosts.
enum class HostOutcome : std::uint8_t { kDone = 0, kSkipped = 1, kStopped = 2 };

}  // namespace

HostLevels::HostLevels(c10::intrusive_ptr<c10d::ProcessGroup> host,
                       std::shared_ptr<GroupSync> between)
    : host_(std::move(host)), between_(std::move(between)) {
  if (!host_) throw InvalidArgument("[python] two levels need the host's process group");
  const bool leads = host_->getRank() == 0;
  if (leads != (between_ != nullptr)) {
    throw InvalidArgument(
        leads ? "[python] the host's leader (rank 0 of its host group) needs the synchronization "
                "between hosts"
              : "[python] only the host's leader synchronizes between hosts");
  }
}

void HostLevels::check(const at::Tensor& gradient) const {
  if (gradient.scalar_type() != at::kFloat || !gradient.is_contiguous()) {
    throw InvalidArgument(
        fmt::format("[python] two levels take a contiguous float32 gradient, got {} {}",
                    gradient.is_contiguous() ? "contiguous" : "strided",
                    c10::toString(gradient.scalar_type())));
  }
}

StepMetrics HostLevels::run(const at::Tensor& gradient, const GroupStep& step) {
  const Stopwatch watch;
  // 1. The host's mean, on the gradient's device.
  std::vector<at::Tensor> tensors{gradient};
  host_->allreduce(tensors)->wait();
  gradient.div_(static_cast<double>(host_->getSize()));

  // 2. Between hosts, on the leader, on the host.
  StepMetrics metrics;
  HostOutcome outcome = HostOutcome::kDone;
  std::string stopped_because;
  if (between_ != nullptr) {
    at::Tensor on_host = gradient;
    if (!gradient.device().is_cpu()) {
      if (!staging_ || staging_->numel() != gradient.numel()) {
        staging_ = at::empty({gradient.numel()}, gradient.options().device(at::kCPU));
      }
      staging_->copy_(gradient);
      on_host = *staging_;
    }
    try {
      metrics = between_->run(on_host, step);
      if (metrics.skipped_nonfinite) outcome = HostOutcome::kSkipped;
    } catch (const NonFiniteGradient& e) {
      outcome = HostOutcome::kStopped;
      stopped_because = e.what();
    }
    if (!gradient.device().is_cpu()) gradient.copy_(on_host);
  } else {
    metrics.step = step.step;
    metrics.numel = static_cast<std::size_t>(gradient.numel());
  }

  // 3. The outcome, then the result, to the host.
  std::vector<at::Tensor> code{
      at::full({1}, static_cast<std::uint8_t>(outcome), gradient.options().dtype(at::kByte))};
  host_->broadcast(code)->wait();
  outcome = static_cast<HostOutcome>(code.front().item<std::uint8_t>());
  if (outcome == HostOutcome::kStopped) {
    if (between_ != nullptr) throw NonFiniteGradient(stopped_because);
    throw NonFiniteGradient(fmt::format(
        "[python] step {}: this host's leader stopped on a non-finite gradient between hosts "
        "(its message says which)",
        step.step));
  }
  metrics.skipped_nonfinite = outcome == HostOutcome::kSkipped;
  host_->broadcast(tensors)->wait();
  metrics.exchange_s = watch.seconds() - metrics.selection_s - metrics.accumulate_s;
  return metrics;
}

void bind_host_levels(py::module_& m) {
  py::class_<HostLevels, GroupSync, std::shared_ptr<HostLevels>>(m, "_HostLevels")
      .def(py::init<c10::intrusive_ptr<c10d::ProcessGroup>, std::shared_ptr<GroupSync>>(),
           py::arg("host"), py::arg("between").none(true))
      .def(
          "synchronize",
          [](HostLevels& self, const at::Tensor& gradient, std::int64_t step) {
            self.check(gradient);
            const py::gil_scoped_release release;
            return to_json_line(self.run(gradient, GroupStep{step, 0.0, 0, {}}));
          },
          py::arg("gradient"), py::arg("step"));
  // The hosts' rule of sync/two_level.h and comm/host_names.h, for the hook.
  m.def("_this_host_name", &this_host_name);
  m.def(
      "_topology_of_hosts",
      [](const std::vector<int>& host_of_rank) {
        return topology_of_hosts(host_of_rank).ranks_per_host;
      },
      py::arg("host_of_rank"));
}

}  // namespace sparsecomm::python
