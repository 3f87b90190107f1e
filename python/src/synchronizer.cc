// Synchronizer: one flat gradient's synchronization on the host, by any of
// the CLI's methods; and _GroupSync, the base it shares with
// DeviceSynchronizer (what the DDP hook's worker runs: group_sync.h).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "conversions.h"
#include "group_sync.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/sync/sparsify_sequence.h"
#include "sparsecomm/sync/step_metrics.h"
#include "sparsecomm/sync/two_level.h"

namespace py = pybind11;

namespace sparsecomm::python {
namespace {

// One flat gradient's synchronization by any of the CLI's methods (dense,
// skipreduce, or a registry scheme with its error feedback), with the CLI's
// names and -o options.
class Synchronizer final : public GroupSync {
 public:
  // ranks_per_host > 1: two levels (sync/two_level.h), hosts of that many
  // consecutive ranks of `comm`; 0: from the ranks' host names (collective).
  Synchronizer(std::shared_ptr<Communicator> comm, const std::string& method,
               const std::map<std::string, std::string>& options, const std::string& nonfinite,
               int ranks_per_host)
      : comm_(std::move(comm)),
        sync_(with_two_levels(
            make_gradient_sync(method, SchemeOptions(options), parse_nonfinite_policy(nonfinite)),
            resolve_host_topology(ranks_per_host, *comm_))) {}

  // `gradient` (this rank's) is replaced by the average over ranks of the
  // sparsified gradients; returns the step's metrics as one JSON line.
  // `bucket`: which piece of the step this is when a step is synchronized
  // in pieces (Skip-Reduce varies its schedule by it, as the CLI's buckets).
  std::string synchronize(const at::Tensor& gradient, std::int64_t step, double epoch,
                          std::int64_t bucket,
                          const std::optional<std::vector<std::int64_t>>& layers,
                          const std::optional<std::vector<std::int64_t>>& rows) {
    check(gradient);
    const GroupStep group_step = group_step_of(gradient.numel(), step, epoch, bucket, layers, rows);
    const py::gil_scoped_release release;
    return to_json_line(run(gradient, group_step));
  }

  void check(const at::Tensor& gradient) const override { floats_of(gradient, "the gradient"); }

  StepMetrics run(const at::Tensor& gradient, const GroupStep& step) override {
    StepContext ctx = context_of(*comm_, step.step, step.epoch, step.bucket);
    ctx.layers = step.layers;
    return sync_->synchronize(
        {gradient.data_ptr<float>(), static_cast<std::size_t>(gradient.numel())}, ctx, *comm_);
  }

  // A copy of what error feedback kept after the last step (the
  // residual), float32; empty for methods without memory and before the
  // first step.
  at::Tensor kept() const { return tensor_copy(sync_->kept()); }

  bool applies_momentum() const { return sync_->applies_momentum(); }
  bool bucketable() const { return sync_->bucketable(); }

  py::bytes state() const { return state_of(*sync_); }
  void load_state(const py::bytes& state) { load_state_into(*sync_, state); }

 private:
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<GradientSync> sync_;
};

}  // namespace

void bind_synchronizer(py::module_& m) {
  using Sizes = std::optional<std::vector<std::int64_t>>;
  py::class_<GroupSync, std::shared_ptr<GroupSync>>(m, "_GroupSync");
  py::class_<Synchronizer, GroupSync, std::shared_ptr<Synchronizer>>(m, "Synchronizer")
      .def(py::init<std::shared_ptr<Communicator>, const std::string&,
                    const std::map<std::string, std::string>&, const std::string&, int>(),
           py::arg("comm"), py::arg("method"), py::arg("options"), py::arg("nonfinite") = "stop",
           py::arg("ranks_per_host") = 1)
      .def("synchronize", &Synchronizer::synchronize, py::arg("gradient"), py::arg("step"),
           py::arg("epoch") = 0.0, py::arg("bucket") = 0, py::arg("layers") = Sizes{},
           py::arg("rows") = Sizes{})
      .def("kept", &Synchronizer::kept)
      .def_property_readonly("applies_momentum", &Synchronizer::applies_momentum)
      .def_property_readonly("bucketable", &Synchronizer::bucketable)
      .def("state", &Synchronizer::state)
      .def("load_state", &Synchronizer::load_state, py::arg("state"));
}

}  // namespace sparsecomm::python
