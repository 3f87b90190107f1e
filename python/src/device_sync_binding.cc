// DeviceSynchronizer (device_sync.h): synchronization on the gradient's own
// device, for the DDP hook's selection="device".

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "device_sync.h"
#include "group_sync.h"
#include "sparsecomm/sync/step_metrics.h"

namespace py = pybind11;

namespace sparsecomm::python {

void bind_device_synchronizer(py::module_& m) {
  py::class_<DeviceSynchronizer, GroupSync, std::shared_ptr<DeviceSynchronizer>>(
      m, "DeviceSynchronizer")
      .def(py::init([](c10::intrusive_ptr<c10d::ProcessGroup> group, const std::string& method,
                       const std::map<std::string, std::string>& options,
                       const std::string& nonfinite) {
             return std::make_shared<DeviceSynchronizer>(std::move(group), method, options,
                                                         nonfinite);
           }),
           py::arg("group").none(true), py::arg("method"), py::arg("options"),
           py::arg("nonfinite") = "stop")
      .def(
          "synchronize",
          [](DeviceSynchronizer& self, const at::Tensor& gradient, std::int64_t step,
             double epoch) {
            self.check(gradient);
            const py::gil_scoped_release release;
            return to_json_line(self.run(gradient, GroupStep{step, epoch, 0, {}}));
          },
          py::arg("gradient"), py::arg("step"), py::arg("epoch") = 0.0)
      .def("_select", &DeviceSynchronizer::select, py::arg("accumulated"), py::arg("k"))
      .def("kept", &DeviceSynchronizer::kept)
      .def_property_readonly("method", &DeviceSynchronizer::method)
      .def("state", &DeviceSynchronizer::state)
      .def("load_state", &DeviceSynchronizer::load_state, py::arg("state"));
}

}  // namespace sparsecomm::python
