// Sparsifier: a scheme's selection with its error feedback, without the
// exchange, for callers with their own transport (selection_step.h).

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/types.h>

#include "bindings.h"
#include "conversions.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/sync/selection_step.h"
#include "sparsecomm/sync/sparsify_sequence.h"

namespace py = pybind11;

namespace sparsecomm::python {
namespace {

// The exchange options, which a Sparsifier leaves to the caller's transport.
constexpr const char* kExchangeOptions[] = {"exchange", "values", "encode_indices"};

// A scheme's selection with its error feedback, without the exchange: the
// caller moves each rank's (indices, values) and sums them (selection_step.h).
class StandaloneSparsifier {
 public:
  StandaloneSparsifier(std::shared_ptr<Communicator> comm, const std::string& method,
                       const std::map<std::string, std::string>& options,
                       const std::string& nonfinite)
      : comm_(std::move(comm)),
        step_(make_selection_parts(method, options), parse_nonfinite_policy(nonfinite)) {}

  // This rank's selection from gradient + what was kept: (indices, values),
  // indices ascending (int64), values float32.
  py::tuple select(const at::Tensor& gradient, std::int64_t step, double epoch,
                   const std::optional<std::vector<std::int64_t>>& layers) {
    const std::span<float> values = floats_of(gradient, "the gradient");
    const std::vector<LayerSpan> spans = layer_spans(layers, values.size());
    StepContext ctx = context_of(*comm_, step, epoch, 0);
    ctx.layers = spans;
    const SparseSelection* selection = nullptr;
    {
      const py::gil_scoped_release release;
      selection = &step_.select(values, ctx, *comm_);
    }
    const auto count = static_cast<std::int64_t>(selection->size());
    at::Tensor indices = torch::empty({count}, torch::kInt64);
    std::copy(selection->indices.begin(), selection->indices.end(),
              indices.data_ptr<std::int64_t>());
    return py::make_tuple(indices, tensor_copy(selection->values));
  }

  at::Tensor kept() const { return tensor_copy(step_.kept()); }
  std::vector<std::size_t> counts() const { return {step_.counts().begin(), step_.counts().end()}; }
  bool skipped() const { return step_.skipped(); }
  std::int64_t target(std::int64_t numel, std::int64_t step, double epoch) const {
    return static_cast<std::int64_t>(step_.sparsifier().target(static_cast<std::size_t>(numel),
                                                               context_of(*comm_, step, epoch, 0)));
  }
  py::bytes state() const { return state_of(step_); }
  void load_state(const py::bytes& state) { load_state_into(step_, state); }

 private:
  static SchemeParts make_selection_parts(const std::string& method,
                                          const std::map<std::string, std::string>& options) {
    for (const char* key : kExchangeOptions) {
      if (options.count(key) != 0) {
        throw InvalidArgument(std::string("[python] Sparsifier: '") + key +
                              "' is an option of the exchange, which a Sparsifier leaves to your "
                              "transport; use a Synchronizer for sparsecomm's exchange");
      }
    }
    if (find_sync_method(method) != nullptr && find_scheme(method) == nullptr) {
      throw InvalidArgument(
          "[python] Sparsifier: '" + method +
          "' is an exchange, not a sparsification scheme; valid schemes: " + scheme_names());
    }
    return make_scheme(method, SchemeOptions(options));  // unknown names: the registry's message
  }

  std::shared_ptr<Communicator> comm_;
  SelectionStep step_;
};

}  // namespace

void bind_sparsifier(py::module_& m) {
  using Sizes = std::optional<std::vector<std::int64_t>>;
  py::class_<StandaloneSparsifier>(m, "Sparsifier")
      .def(py::init<std::shared_ptr<Communicator>, const std::string&,
                    const std::map<std::string, std::string>&, const std::string&>(),
           py::arg("comm"), py::arg("method"), py::arg("options"), py::arg("nonfinite") = "stop")
      .def("select", &StandaloneSparsifier::select, py::arg("gradient"), py::arg("step"),
           py::arg("epoch") = 0.0, py::arg("layers") = Sizes{})
      .def("kept", &StandaloneSparsifier::kept)
      .def_property_readonly("counts", &StandaloneSparsifier::counts)
      .def_property_readonly("skipped", &StandaloneSparsifier::skipped)
      .def("target", &StandaloneSparsifier::target, py::arg("numel"), py::arg("step") = 0,
           py::arg("epoch") = 0.0)
      .def("state", &StandaloneSparsifier::state)
      .def("load_state", &StandaloneSparsifier::load_state, py::arg("state"));
}

}  // namespace sparsecomm::python
