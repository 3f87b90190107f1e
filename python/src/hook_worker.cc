// _HookWorker: the DDP hook's group exchanges on a thread of their own,
// completing DDP's futures (exchange_worker.h); _fail_future, which fails a
// torch Future with a Python exception that torch rethrows as itself.

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/python/python_ivalue.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "conversions.h"
#include "exchange_worker.h"
#include "group_sync.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timeline.h"
#include "sparsecomm/core/timeline_file.h"
#include "sparsecomm/sync/step_metrics.h"
#include "update_direction.h"

namespace py = pybind11;

namespace sparsecomm::python {
namespace {

// torch.futures.Future.set_exception (torch 1.13) stores the exception as the
// future's *value* and raises it only when Python unwraps it; DDP's reducer
// reads the value in C++ and casts it to a tensor, so the user saw "Unable
// to cast <message> to Tensor" as a RuntimeError. Here the future fails as a
// C++ future: its error is torch's python_error holding `exception`, which
// the reducer rethrows and torch's binding restores, so backward() raises
// the exception itself, type and message.
//
// The error a future fails with so that torch rethrows `exception` (GIL held).
std::exception_ptr rethrown_as(const py::object& exception) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
  python_error error;
  error.persist();  // takes (and clears) the error indicator set above
  return std::make_exception_ptr(error);
}

void fail_future(const py::object& future, const py::object& exception) {
  if (!PyExceptionInstance_Check(exception.ptr())) {
    throw InvalidArgument("_fail_future: the second argument must be an exception instance");
  }
  const auto wrapper = future.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>();
  wrapper->fut->setError(rethrown_as(exception));
}

// The DDP hook's exchanges (exchange_worker.h) for Python: groups are
// submitted with their Synchronizer, AdamW moments and gradient views;
// futures are torch.futures.Future. `on_error(cause, step)` makes the
// exception every pending and later future fails with (the hook's
// HookError), from the Python exception `cause` the exchange raised.
class HookWorker {
 public:
  HookWorker(bool overlap, py::object on_error, std::shared_ptr<TimelineRecorder> timeline)
      : on_error_(std::move(on_error)),
        timeline_(std::move(timeline)),
        worker_(std::make_unique<ExchangeWorker>(
            overlap, [this](std::exception_ptr error, std::int64_t step) {
              return python_error_of(std::move(error), step);
            })) {}

  // The worker's thread may be waiting for the GIL (a failing exchange):
  // it is joined without it. on_error_ goes after, with the GIL.
  ~HookWorker() {
    const py::gil_scoped_release release;
    worker_.reset();
  }

  // The future of a DDP bucket: completes with `buffer` (the Python
  // object: DDP's Python hook reads the result as one).
  py::object bucket_future(const py::object& buffer, std::vector<std::int64_t> groups) {
    const auto tensor = buffer.cast<at::Tensor>();
    if (!step_open_) {  // the step's first bucket: backward is under way
      step_open_ = true;
      first_bucket_ = Clock::now();
    }
    c10::IValue value(c10::ivalue::ConcretePyObjectHolder::create(buffer));
    std::vector<ExchangeWorker::WeakStorage> storages{tensor.storage().getWeakStorageImpl()};
    // A device's future: DDP's wait then waits for the worker's stream.
    std::vector<c10::Device> devices;
    if (!tensor.device().is_cpu()) devices.push_back(tensor.device());
    return py::cast(std::make_shared<torch::jit::PythonFutureWrapper>(worker_->bucket_future(
        std::move(value), std::move(storages), std::move(devices), std::move(groups))));
  }

  // Group `group` of step `step`: `flat` holds the concatenated `views`
  // (its gradients in DDP's buckets); `moments` turns it into the AdamW
  // direction first (None: the gradient itself); the average goes back
  // into the views. `beside_method`: the group holds parameters averaged
  // densely beside the method (exclude, min_numel), counted in the step's
  // metrics as dense_numel rather than as the method's k (as
  // sync/dense_layers.h counts them in the CLI).
  void submit(std::int64_t group, std::int64_t step, double epoch,
              std::shared_ptr<GroupSync> synchronizer, std::shared_ptr<UpdateDirection> moments,
              const at::Tensor& flat, std::vector<at::Tensor> views,
              const std::optional<std::vector<std::int64_t>>& layers,
              const std::optional<std::vector<std::int64_t>>& rows, bool ends_step,
              std::optional<at::Tensor> staging, bool beside_method) {
    // `staging`: a CPU buffer of flat's size where a host synchronization
    // of a device's gradient runs (the gradient crosses to the host and back).
    const at::Tensor& synchronized = staging ? *staging : flat;
    if (staging && staging->numel() != flat.numel()) {
      throw InvalidArgument("[python] the hook's staging buffer has " +
                            std::to_string(staging->numel()) + " elements, the gradient " +
                            std::to_string(flat.numel()));
    }
    synchronizer->check(synchronized);
    if (moments) floats_of(synchronized, "the gathered gradient of compress='update'");
    std::int64_t numel = 0;
    for (const at::Tensor& view : views) numel += view.numel();
    if (numel != flat.numel()) {
      throw InvalidArgument("[python] the hook's views hold " + std::to_string(numel) +
                            " elements, the gathered gradient " + std::to_string(flat.numel()));
    }
    GroupStep group_step = group_step_of(flat.numel(), step, epoch, group, layers, rows);
    // A device's work is queued on streams: the worker's stream waits for
    // what backward's had queued when the group was handed in.
    std::shared_ptr<c10::Event> handed_in;
    if (!flat.device().is_cpu()) {
      const c10::impl::VirtualGuardImpl guard(flat.device().type());
      handed_in = std::make_shared<c10::Event>(flat.device().type());
      handed_in->record(guard.getStream(flat.device()));
    }
    if (ends_step && timeline_) {
      // Backward as the hook sees it: from the step's first bucket to its last group.
      timeline_->events().add_span("buckets ready", "compute", first_bucket_, Clock::now());
    }
    if (ends_step) step_open_ = false;
    ExchangeWorker::Exchange exchange = [synchronizer, moments, flat, views, handed_in, staging,
                                         beside_method, group_step = std::move(group_step),
                                         timeline = timeline_, ends_step] {
      const BindTimeline bind(timeline ? &timeline->events() : nullptr);
      if (timeline) timeline->events().set_step(group_step.step);
      TimedSpan span("group exchange", "sync");
      if (handed_in) {
        const c10::impl::VirtualGuardImpl guard(flat.device().type());
        handed_in->block(guard.getStream(flat.device()));
      }
      if (staging) staging->copy_(flat);  // to the host (waits for the copy)
      const at::Tensor& on_host_or_device = staging ? *staging : flat;
      if (moments) {
        moments->apply({on_host_or_device.data_ptr<float>(),
                        static_cast<std::size_t>(on_host_or_device.numel())});
      }
      StepMetrics metrics = synchronizer->run(on_host_or_device, group_step);
      if (beside_method) {
        metrics.dense_numel = metrics.numel;
        metrics.target = metrics.selected = metrics.union_size = 0;
        metrics.density_ratio = 0.0;
      }
      if (staging) flat.copy_(*staging);  // and back
      std::int64_t offset = 0;
      for (const at::Tensor& view : views) {
        view.copy_(flat.narrow(0, offset, view.numel()).view_as(view));
        offset += view.numel();
      }
      span.stop();
      if (timeline && ends_step) timeline->end_step();
      return metrics;
    };
    const py::gil_scoped_release release;  // inline mode exchanges here
    worker_->submit(group, step, std::move(exchange), std::move(views), ends_step);
  }

  // After every submitted exchange: the last whole step's metrics over its
  // groups (sync/step_metrics.h, combined: the CLI's rule for buckets), as
  // a JSON line, once; None otherwise.
  py::object finished_step() {
    std::optional<std::vector<StepMetrics>> metrics;
    {
      const py::gil_scoped_release release;
      metrics = worker_->finished_step();
    }
    if (!metrics) return py::none();
    return py::str(to_json_line(combined(*metrics)));
  }

  py::tuple finished_times() const {
    const ExchangeWorker::StepTimes times = worker_->finished_times();
    return py::make_tuple(times.exchange_s, times.overlapped_s);
  }

  bool overlap() const { return worker_->overlap(); }
  std::int64_t exchanged_groups() const { return worker_->exchanged_groups(); }

 private:
  // On the thread of the failed exchange: the Python exception it maps to
  // (the module's translators) handed to on_error_.
  std::exception_ptr python_error_of(std::exception_ptr error, std::int64_t step) {
    const py::gil_scoped_acquire gil;
    try {
      py::object cause;
      try {
        // A pybind11 function that rethrows: its call translates the C++
        // exception as every binding's does.
        const py::cpp_function rethrow([error] { std::rethrow_exception(error); });
        rethrow();
      } catch (py::error_already_set& translated) {
        cause = translated.value();
      }
      return rethrown_as(on_error_(cause, step));
    } catch (py::error_already_set& failed) {
      return std::make_exception_ptr(std::runtime_error(
          "sparsecomm: the hook's exchange failed at step " + std::to_string(step) +
          ", and making its error failed too: " + failed.what()));
    }
  }

  py::object on_error_;
  std::shared_ptr<TimelineRecorder> timeline_;  // null: no timeline
  bool step_open_ = false;                      // a bucket of the current step came
  Clock::time_point first_bucket_;
  std::unique_ptr<ExchangeWorker> worker_;
};

}  // namespace

void bind_hook_worker(py::module_& m) {
  using Sizes = std::optional<std::vector<std::int64_t>>;
  m.def("_fail_future", &fail_future, py::arg("future"), py::arg("exception"));

  // The hook's timeline=PATH (docs/timeline.md): made on every rank right
  // after a barrier; each step's events go to the rank's part at the step's
  // last group, and merge() joins the parts on rank 0.
  py::class_<TimelineRecorder, std::shared_ptr<TimelineRecorder>>(m, "_HookTimeline")
      .def(py::init<const std::string&, int>(), py::arg("trace"), py::arg("rank"))
      .def("merge", &TimelineRecorder::merge, py::arg("world"));
  py::class_<HookWorker>(m, "_HookWorker")
      .def(py::init<bool, py::object, std::shared_ptr<TimelineRecorder>>(), py::arg("overlap"),
           py::arg("on_error"), py::arg("timeline").none(true) = nullptr)
      .def("bucket_future", &HookWorker::bucket_future, py::arg("buffer"), py::arg("groups"))
      .def("submit", &HookWorker::submit, py::arg("group"), py::arg("step"), py::arg("epoch"),
           py::arg("synchronizer"), py::arg("moments").none(true), py::arg("flat"),
           py::arg("views"), py::arg("layers") = Sizes{}, py::arg("rows") = Sizes{},
           py::arg("ends_step") = false, py::arg("staging") = std::optional<at::Tensor>{},
           py::arg("beside_method") = false)
      .def("finished_step", &HookWorker::finished_step)
      .def("finished_times", &HookWorker::finished_times)
      .def_property_readonly("overlap", &HookWorker::overlap)
      .def_property_readonly("exchanged_groups", &HookWorker::exchanged_groups);
}

}  // namespace sparsecomm::python
