#include "update_direction.h"

#include <memory>

#include <torch/csrc/utils/pybind.h>

#include "bindings.h"

namespace py = pybind11;

namespace sparsecomm::python {

void bind_update_direction(py::module_& m) {
  py::class_<UpdateDirection, std::shared_ptr<UpdateDirection>>(m, "UpdateDirection")
      .def(py::init<double, double, double>(), py::arg("beta1") = 0.9, py::arg("beta2") = 0.999,
           py::arg("eps") = 1e-8)
      .def("direction", &UpdateDirection::direction, py::arg("gradient"))
      .def("state", &UpdateDirection::state)
      .def("load_state", &UpdateDirection::load_state, py::arg("state"));
}

}  // namespace sparsecomm::python
