// sparsecomm._sparsecomm: the Python binding (docs/python.md). Thin: every
// call converts its arguments and runs the C++ layers with the GIL released.
//
//   Communicator(group)            sparsecomm's collectives over a torch
//                                  ProcessGroup (process_group_communicator.h)
//   Synchronizer(comm, method, options)
//     .synchronize(tensor, step, epoch, bucket) -> metrics (a JSON line)
//     .kept() -> what error feedback kept (the residual), a tensor
//     .applies_momentum              True for DGC's momentum correction
//     .bucketable                    False for schemes that span the whole
//                                    gradient (MiCRO, ExDyna)
//     .state() -> bytes, .load_state(bytes)
//   allreduce(comm, tensor)        sparsecomm's ring all-reduce, in place
//   methods() -> [names]           the CLI's synchronization methods
//   method_options(name) -> [names]  the options a method takes
//
// sparsecomm's errors become Python exceptions: InvalidArgument ->
// ValueError, CommError -> RuntimeError, both with the C++ message.

#include <map>
#include <memory>
#include <string>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "process_group_communicator.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/sync/step_metrics.h"

namespace py = pybind11;

namespace sparsecomm::python {
namespace {

// The tensor's floats, which must be a contiguous float32 CPU tensor.
std::span<float> floats_of(const at::Tensor& tensor, const char* what) {
  if (tensor.device().type() != c10::DeviceType::CPU || tensor.scalar_type() != at::kFloat ||
      !tensor.is_contiguous()) {
    throw InvalidArgument(std::string(what) +
                          " must be a contiguous float32 CPU tensor (call .float().contiguous() "
                          "on it, or copy it to the CPU)");
  }
  return {tensor.data_ptr<float>(), static_cast<std::size_t>(tensor.numel())};
}

// One flat gradient's synchronization by any of the CLI's methods (dense,
// skipreduce, or a registry scheme with its error feedback), with the CLI's
// names and -o options.
class Synchronizer {
 public:
  Synchronizer(std::shared_ptr<ProcessGroupCommunicator> comm, const std::string& method,
               const std::map<std::string, std::string>& options, const std::string& nonfinite)
      : comm_(std::move(comm)),
        sync_(make_gradient_sync(method, SchemeOptions(options),
                                 parse_nonfinite_policy(nonfinite))) {}

  // `gradient` (this rank's) is replaced by the average over ranks of the
  // sparsified gradients; returns the step's metrics as one JSON line.
  // `bucket`: which piece of the step this is when a step is synchronized
  // in pieces (Skip-Reduce varies its schedule by it, as the CLI's buckets).
  std::string synchronize(const at::Tensor& gradient, std::int64_t step, double epoch,
                          std::int64_t bucket) {
    const std::span<float> values = floats_of(gradient, "the gradient");
    StepContext ctx;
    ctx.step = step;
    ctx.epoch = epoch;
    ctx.bucket = bucket;
    ctx.rank = comm_->rank();
    ctx.world = comm_->size();
    const py::gil_scoped_release release;
    return to_json_line(sync_->synchronize(values, ctx, *comm_));
  }

  // A copy of what error feedback kept after the last step (the
  // residual), float32; empty for methods without memory and before the
  // first step.
  at::Tensor kept() const {
    const std::span<const float> kept = sync_->kept();
    return torch::from_blob(const_cast<float*>(kept.data()),
                            {static_cast<std::int64_t>(kept.size())})
        .clone();
  }

  bool applies_momentum() const { return sync_->applies_momentum(); }
  bool bucketable() const { return sync_->bucketable(); }

  py::bytes state() const {
    StateWriter writer;
    sync_->save(writer);
    const auto& bytes = writer.bytes();
    return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

  void load_state(const py::bytes& state) {
    const std::string_view view = state;
    StateReader reader(std::as_bytes(std::span<const char>(view.data(), view.size())));
    sync_->load(reader);
  }

 private:
  std::shared_ptr<ProcessGroupCommunicator> comm_;
  std::unique_ptr<GradientSync> sync_;
};

}  // namespace
}  // namespace sparsecomm::python

PYBIND11_MODULE(_sparsecomm, m) {
  using namespace sparsecomm;
  using namespace sparsecomm::python;
  m.doc() = "sparsecomm: sparsified gradient synchronization over torch.distributed";
  static py::exception<InvalidArgument> invalid(m, "InvalidArgument", PyExc_ValueError);
  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const InvalidArgument& e) {
      invalid(e.what());
    } catch (const CommError& e) {
      comm_error(e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  py::class_<ProcessGroupCommunicator, std::shared_ptr<ProcessGroupCommunicator>>(m, "Communicator")
      .def(py::init<c10::intrusive_ptr<c10d::ProcessGroup>>(), py::arg("group"))
      .def_property_readonly("rank", &ProcessGroupCommunicator::rank)
      .def_property_readonly("size", &ProcessGroupCommunicator::size);

  py::class_<Synchronizer>(m, "Synchronizer")
      .def(py::init<std::shared_ptr<ProcessGroupCommunicator>, const std::string&,
                    const std::map<std::string, std::string>&, const std::string&>(),
           py::arg("comm"), py::arg("method"), py::arg("options"), py::arg("nonfinite") = "stop")
      .def("synchronize", &Synchronizer::synchronize, py::arg("gradient"), py::arg("step"),
           py::arg("epoch") = 0.0, py::arg("bucket") = 0)
      .def("kept", &Synchronizer::kept)
      .def_property_readonly("applies_momentum", &Synchronizer::applies_momentum)
      .def_property_readonly("bucketable", &Synchronizer::bucketable)
      .def("state", &Synchronizer::state)
      .def("load_state", &Synchronizer::load_state, py::arg("state"));

  m.def(
      "allreduce",
      [](ProcessGroupCommunicator& comm, const at::Tensor& tensor) {
        const std::span<float> values = floats_of(tensor, "the tensor");
        const py::gil_scoped_release release;
        allreduce(comm, values);
      },
      py::arg("comm"), py::arg("tensor"));

  m.def("methods", [] {
    std::vector<std::string> names;
    for (const SyncMethodInfo& info : sync_methods()) names.push_back(info.name);
    return names;
  });

  m.def(
      "method_options",
      [](const std::string& method) {
        for (const SyncMethodInfo& info : sync_methods()) {
          if (info.name != method) continue;
          std::vector<std::string> names;
          for (const OptionSpec& option : info.options) names.push_back(option.name);
          return names;
        }
        throw InvalidArgument("unknown synchronization method '" + method +
                              "'; valid: " + sync_method_names());
      },
      py::arg("method"));
}
