// Communicator: sparsecomm's collectives over a torch ProcessGroup
// (process_group_communicator.h) or over a world of one rank; allreduce.

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "conversions.h"
#include "process_group_communicator.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/errors.h"

namespace py = pybind11;

namespace sparsecomm::python {
namespace {

// The communicator of a Sparsifier used without torch.distributed: a world of
// one rank, whose collectives never send.
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "single"; }
  Request isend(std::span<const std::byte>, int dst, int) override {
    throw CommError("[single] a world of one rank has no rank " + std::to_string(dst));
  }
  Request irecv(std::span<std::byte>, int src, int) override {
    throw CommError("[single] a world of one rank has no rank " + std::to_string(src));
  }
};

}  // namespace

void bind_communicator(py::module_& m) {
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def(py::init([](c10::intrusive_ptr<c10d::ProcessGroup> group) {
             return std::shared_ptr<Communicator>(
                 std::make_shared<ProcessGroupCommunicator>(std::move(group)));
           }),
           py::arg("group"))
      .def_static(
          "single",
          [] { return std::shared_ptr<Communicator>(std::make_shared<SingleRankCommunicator>()); })
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size);

  m.def(
      "allreduce",
      [](Communicator& comm, const at::Tensor& tensor) {
        const std::span<float> values = floats_of(tensor, "the tensor");
        const py::gil_scoped_release release;
        allreduce(comm, values);
      },
      py::arg("comm"), py::arg("tensor"));
}

}  // namespace sparsecomm::python
