// OuterLoop: the outer step of local steps (optim/outer_loop.h) on one flat
// parameter vector; sparsecomm.LocalSteps builds on it.

#include <cstdint>
#include <span>
#include <string>

#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "conversions.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/outer_loop.h"

namespace py = pybind11;

namespace sparsecomm::python {
namespace {

// optim/outer_loop.h over float32 tensors (sparsecomm.LocalSteps builds on it).
class PyOuterLoop {
 public:
  PyOuterLoop(const at::Tensor& parameters, std::int64_t local_steps, double lr, double momentum,
              bool nesterov)
      : loop_(OuterOptions{local_steps, lr, momentum, nesterov},
              floats_of(parameters, "the parameters")) {}

  bool ends_round(std::int64_t step) const { return loop_.ends_round(step); }
  void mark_nonfinite() { loop_.mark_nonfinite(); }
  void pseudo_gradient(const at::Tensor& parameters, const at::Tensor& out) const {
    loop_.pseudo_gradient(sized(parameters, "the parameters"), sized(out, "the output"));
  }
  void finish_round(const at::Tensor& parameters, const at::Tensor& mean, bool skipped) {
    loop_.finish_round(sized(parameters, "the parameters"), sized(mean, "the mean"), skipped);
  }
  at::Tensor anchor() const { return tensor_copy(loop_.anchor()); }
  py::bytes state() const { return state_of(loop_); }
  void load_state(const py::bytes& state) { load_state_into(loop_, state); }

 private:
  // A float32 vector of the anchor's length.
  std::span<float> sized(const at::Tensor& tensor, const char* what) const {
    const std::span<float> values = floats_of(tensor, what);
    if (values.size() != loop_.anchor().size()) {
      throw InvalidArgument("[python] OuterLoop: " + std::string(what) + " has " +
                            std::to_string(values.size()) + " elements, the anchor " +
                            std::to_string(loop_.anchor().size()));
    }
    return values;
  }
  OuterLoop loop_;
};

}  // namespace

void bind_outer_loop(py::module_& m) {
  py::class_<PyOuterLoop>(m, "OuterLoop")
      .def(py::init<const at::Tensor&, std::int64_t, double, double, bool>(), py::arg("parameters"),
           py::arg("local_steps"), py::arg("lr") = OuterOptions{}.lr,
           py::arg("momentum") = OuterOptions{}.momentum,
           py::arg("nesterov") = OuterOptions{}.nesterov)
      .def("ends_round", &PyOuterLoop::ends_round, py::arg("step"))
      .def("mark_nonfinite", &PyOuterLoop::mark_nonfinite)
      .def("pseudo_gradient", &PyOuterLoop::pseudo_gradient, py::arg("parameters"), py::arg("out"))
      .def("finish_round", &PyOuterLoop::finish_round, py::arg("parameters"), py::arg("mean"),
           py::arg("skipped") = false)
      .def("anchor", &PyOuterLoop::anchor)
      .def("state", &PyOuterLoop::state)
      .def("load_state", &PyOuterLoop::load_state, py::arg("state"));
}

}  // namespace sparsecomm::python
