// sparsecomm._sparsecomm: the Python binding (docs/python.md). Thin: every
// call converts its arguments and runs the C++ layers with the GIL released.
//
//   Communicator(group)            sparsecomm's collectives over a torch
//                                  ProcessGroup (process_group_communicator.h)
//   Synchronizer(comm, method, options)
//     .synchronize(tensor, step, epoch, bucket, layers) -> metrics (a JSON line)
//     .kept() -> what error feedback kept (the residual), a tensor
//     .applies_momentum              True for DGC's momentum correction
//     .bucketable                    False for schemes that span the whole
//                                    gradient (MiCRO, ExDyna)
//     .state() -> bytes, .load_state(bytes)
//   Sparsifier(comm, method, options, nonfinite)   selection without the
//     exchange, for callers with their own transport (selection_step.h)
//     .select(tensor, step, epoch, layers) -> (indices int64, values float32)
//     .kept(), .counts, .skipped, .state(), .load_state(bytes)
//   UpdateDirection(beta1, beta2, eps)  one rank's AdamW moments for
//     compress="update" (optim/update_rule.h)
//     .direction(tensor)             in place: gradient -> AdamW direction
//     .state() -> bytes, .load_state(bytes)
//   OuterLoop(parameters, local_steps, lr, momentum, nesterov)  the outer
//     step of local steps (optim/outer_loop.h) on one flat parameter vector
//     .ends_round(step), .mark_nonfinite(), .pseudo_gradient(params, out),
//     .finish_round(params, mean, skipped), .anchor(), .state(), .load_state()
//   Communicator.single()          a world of one rank (no torch.distributed)
//   allreduce(comm, tensor)        sparsecomm's ring all-reduce, in place
//   methods() -> [names]           the CLI's synchronization methods
//   method_options(name) -> [names]  the options a method takes
//   _fail_future(future, exception)  completes a torch Future with an error
//                                  that torch's C++ side rethrows as that
//                                  very Python exception (the DDP hook's
//                                  failures; docs/python.md)
//   _HookWorker(overlap, on_error)  runs the DDP hook's group exchanges on
//                                  a thread of its own, completing DDP's
//                                  futures (exchange_worker.h)
//
// sparsecomm's errors become Python exceptions: InvalidArgument ->
// ValueError, CommError -> RuntimeError, both with the C++ message.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/python/python_ivalue.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>
#include <nlohmann/json.hpp>

#include "device_sync.h"
#include "exchange_worker.h"
#include "group_sync.h"
#include "process_group_communicator.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/optim/outer_loop.h"
#include "sparsecomm/optim/update_rule.h"
#include "sparsecomm/perf/convergence.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/sync/dense_layers.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/sync/selection_step.h"
#include "sparsecomm/sync/step_metrics.h"
#include "sparsecomm/sync/tensor_buckets.h"

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

// The tensors a flat gradient is made of, from their sizes (in order, summing
// to `numel`) and, where given, their first dimensions (0 for vectors; one
// per size); none: one tensor. DEFT selects per tensor, PowerSGD views each
// as rows x size/rows.
std::vector<LayerSpan> layer_spans(const std::optional<std::vector<std::int64_t>>& sizes,
                                   std::size_t numel,
                                   const std::optional<std::vector<std::int64_t>>& rows = {}) {
  std::vector<LayerSpan> spans;
  if (!sizes) return spans;
  if (rows && rows->size() != sizes->size()) {
    throw InvalidArgument("layers: " + std::to_string(rows->size()) + " first dimensions for " +
                          std::to_string(sizes->size()) + " tensors; pass one per tensor");
  }
  std::size_t offset = 0;
  for (const std::int64_t size : *sizes) {
    if (size < 0)
      throw InvalidArgument("layers: a tensor size is negative (" + std::to_string(size) + ")");
    const std::int64_t first = rows ? (*rows)[spans.size()] : 0;
    if (first < 0 || (first > 0 && size % first != 0)) {
      throw InvalidArgument("layers: tensor " + std::to_string(spans.size()) + " of " +
                            std::to_string(size) + " elements cannot have a first dimension of " +
                            std::to_string(first));
    }
    spans.push_back({"tensor" + std::to_string(spans.size()), offset,
                     static_cast<std::size_t>(size), static_cast<std::size_t>(first)});
    offset += static_cast<std::size_t>(size);
  }
  if (offset != numel) {
    throw InvalidArgument("layers: the tensor sizes sum to " + std::to_string(offset) +
                          " but the gradient has " + std::to_string(numel) +
                          " elements; pass each tensor's numel(), in the gradient's order");
  }
  return spans;
}

StepContext context_of(const Communicator& comm, std::int64_t step, double epoch,
                       std::int64_t bucket) {
  StepContext ctx;
  ctx.step = step;
  ctx.epoch = epoch;
  ctx.bucket = bucket;
  ctx.rank = comm.rank();
  ctx.world = comm.size();
  return ctx;
}

// One group's step, its tensors checked against the gradient's length.
GroupStep group_step_of(std::int64_t numel, std::int64_t step, double epoch, std::int64_t bucket,
                        const std::optional<std::vector<std::int64_t>>& layers,
                        const std::optional<std::vector<std::int64_t>>& rows) {
  return {step, epoch, bucket, layer_spans(layers, static_cast<std::size_t>(numel), rows)};
}

// A copy of `values` as a float32 tensor.
at::Tensor tensor_copy(std::span<const float> values) {
  return torch::from_blob(const_cast<float*>(values.data()),
                          {static_cast<std::int64_t>(values.size())})
      .clone();
}

py::bytes state_of(const auto& step) {
  StateWriter writer;
  step.save(writer);
  const auto& bytes = writer.bytes();
  return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void load_state_into(auto& step, const py::bytes& state) {
  const std::string_view view = state;
  StateReader reader(std::as_bytes(std::span<const char>(view.data(), view.size())));
  step.load(reader);
}

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

// One flat gradient's synchronization by any of the CLI's methods (dense,
// skipreduce, or a registry scheme with its error feedback), with the CLI's
// names and -o options.
class Synchronizer final : public GroupSync {
 public:
  Synchronizer(std::shared_ptr<Communicator> comm, const std::string& method,
               const std::map<std::string, std::string>& options, const std::string& nonfinite)
      : comm_(std::move(comm)),
        sync_(make_gradient_sync(method, SchemeOptions(options),
                                 parse_nonfinite_policy(nonfinite))) {}

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

// One rank's AdamW moments over one flat gradient, for the hook's
// compress="update": the gradient is replaced by the direction AdamW would
// apply (without lr and weight decay), which the method then synchronizes.
class UpdateDirection {
 public:
  UpdateDirection(double beta1, double beta2, double eps)
      : rule_(options_of(beta1, beta2, eps), Compress::kUpdate) {}

  void direction(const at::Tensor& gradient) {
    const std::span<float> values = floats_of(gradient, "the gradient");
    const py::gil_scoped_release release;
    apply(values);
  }
  void apply(std::span<float> gradient) { rule_.before_sync(gradient); }
  py::bytes state() const { return state_of(rule_); }
  void load_state(const py::bytes& state) { load_state_into(rule_, state); }

 private:
  static OptimizerOptions options_of(double beta1, double beta2, double eps) {
    OptimizerOptions options;
    options.name = "adamw";
    options.adamw.beta1 = beta1;
    options.adamw.beta2 = beta2;
    options.adamw.eps = eps;
    options.adamw.weight_decay = 0.0;  // the optimizer applies it (docs/python.md)
    return options;
  }
  UpdateRule rule_;
};

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
  HookWorker(bool overlap, py::object on_error)
      : on_error_(std::move(on_error)),
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
    c10::IValue value(c10::ivalue::ConcretePyObjectHolder::create(buffer));
    std::vector<ExchangeWorker::WeakStorage> storages{
        tensor.storage().getWeakStorageImpl()};
    // A device's future: DDP's wait then waits for the worker's stream.
    std::vector<c10::Device> devices;
    if (!tensor.device().is_cpu()) devices.push_back(tensor.device());
    return py::cast(std::make_shared<torch::jit::PythonFutureWrapper>(worker_->bucket_future(
        std::move(value), std::move(storages), std::move(devices), std::move(groups))));
  }

  // Group `group` of step `step`: `flat` holds the concatenated `views`
  // (its gradients in DDP's buckets); `moments` turns it into the AdamW
  // direction first (None: the gradient itself); the average goes back
  // into the views.
  void submit(std::int64_t group, std::int64_t step, double epoch,
              std::shared_ptr<GroupSync> synchronizer, std::shared_ptr<UpdateDirection> moments,
              const at::Tensor& flat, std::vector<at::Tensor> views,
              const std::optional<std::vector<std::int64_t>>& layers,
              const std::optional<std::vector<std::int64_t>>& rows, bool ends_step,
              std::optional<at::Tensor> staging) {
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
    ExchangeWorker::Exchange exchange = [synchronizer, moments, flat, views, handed_in, staging,
                                         group_step = std::move(group_step)] {
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
      if (staging) flat.copy_(*staging);  // and back
      std::int64_t offset = 0;
      for (const at::Tensor& view : views) {
        view.copy_(flat.narrow(0, offset, view.numel()).view_as(view));
        offset += view.numel();
      }
      return metrics;
    };
    const py::gil_scoped_release release;  // inline mode exchanges here
    worker_->submit(group, step, std::move(exchange), std::move(views), ends_step);
  }

  // After every submitted exchange: the last whole step's metrics (JSON
  // lines, one per group in submission order), once; None otherwise.
  py::object finished_step() {
    std::optional<std::vector<StepMetrics>> metrics;
    {
      const py::gil_scoped_release release;
      metrics = worker_->finished_step();
    }
    if (!metrics) return py::none();
    py::list lines;
    for (const StepMetrics& m : *metrics) lines.append(to_json_line(m));
    return lines;
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
  std::unique_ptr<ExchangeWorker> worker_;
};

// The trainer's rules, so that the DDP hook groups tensors as the CLI does.
void bind_grouping_rules(py::module_& m) {
  m.def(
      "dense_tensors",
      [](const std::vector<std::string>& names, const std::vector<std::size_t>& numels,
         std::size_t min_numel, const std::vector<std::string>& patterns) {
        if (names.size() != numels.size()) {
          throw InvalidArgument("dense_tensors: names and numels differ in length");
        }
        std::vector<LayerSpan> layers;
        for (std::size_t i = 0; i < names.size(); ++i) layers.push_back({names[i], 0, numels[i]});
        const DenseLayerRule rule{min_numel, patterns};
        dense_numel(rule, layers, "DDP",
                    {.min_numel = "min_numel",
                     .exclude = "exclude pattern",
                     .all_dense = "or use DDP's own all-reduce"});
        std::vector<bool> dense;
        for (const LayerSpan& layer : layers) dense.push_back(rule.matches(layer));
        return dense;
      },
      py::arg("names"), py::arg("numels"), py::arg("min_numel"), py::arg("patterns"),
      "Which tensors min_numel and the exclude patterns send densely (the CLI's --min-numel "
      "and --exclude); ValueError for a pattern that matches nothing or a rule that leaves "
      "nothing to sparsify.");
  m.def(
      "tensor_buckets",
      [](const std::vector<std::size_t>& tensor_bytes, std::size_t bucket_bytes) {
        std::vector<std::pair<std::size_t, std::size_t>> out;
        for (const Range& r : tensor_buckets(tensor_bytes, bucket_bytes)) {
          out.emplace_back(r.begin, r.end);
        }
        return out;
      },
      py::arg("tensor_bytes"), py::arg("bucket_bytes"),
      "Buckets of whole tensors as the CLI's --bucket-mb forms them: in reverse order, each "
      "closed at bucket_bytes or more; (begin, end) index ranges, in backward order.");
}

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

  using Sizes = std::optional<std::vector<std::int64_t>>;
  py::class_<GroupSync, std::shared_ptr<GroupSync>>(m, "_GroupSync");
  py::class_<Synchronizer, GroupSync, std::shared_ptr<Synchronizer>>(m, "Synchronizer")
      .def(py::init<std::shared_ptr<Communicator>, const std::string&,
                    const std::map<std::string, std::string>&, const std::string&>(),
           py::arg("comm"), py::arg("method"), py::arg("options"), py::arg("nonfinite") = "stop")
      .def("synchronize", &Synchronizer::synchronize, py::arg("gradient"), py::arg("step"),
           py::arg("epoch") = 0.0, py::arg("bucket") = 0, py::arg("layers") = Sizes{},
           py::arg("rows") = Sizes{})
      .def("kept", &Synchronizer::kept)
      .def_property_readonly("applies_momentum", &Synchronizer::applies_momentum)
      .def_property_readonly("bucketable", &Synchronizer::bucketable)
      .def("state", &Synchronizer::state)
      .def("load_state", &Synchronizer::load_state, py::arg("state"));

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

  py::class_<UpdateDirection, std::shared_ptr<UpdateDirection>>(m, "UpdateDirection")
      .def(py::init<double, double, double>(), py::arg("beta1") = 0.9, py::arg("beta2") = 0.999,
           py::arg("eps") = 1e-8)
      .def("direction", &UpdateDirection::direction, py::arg("gradient"))
      .def("state", &UpdateDirection::state)
      .def("load_state", &UpdateDirection::load_state, py::arg("state"));

  py::class_<PyOuterLoop>(m, "OuterLoop")
      .def(py::init<const at::Tensor&, std::int64_t, double, double, bool>(), py::arg("parameters"),
           py::arg("local_steps"), py::arg("lr") = 0.7, py::arg("momentum") = 0.9,
           py::arg("nesterov") = true)
      .def("ends_round", &PyOuterLoop::ends_round, py::arg("step"))
      .def("mark_nonfinite", &PyOuterLoop::mark_nonfinite)
      .def("pseudo_gradient", &PyOuterLoop::pseudo_gradient, py::arg("parameters"), py::arg("out"))
      .def("finish_round", &PyOuterLoop::finish_round, py::arg("parameters"), py::arg("mean"),
           py::arg("skipped") = false)
      .def("anchor", &PyOuterLoop::anchor)
      .def("state", &PyOuterLoop::state)
      .def("load_state", &PyOuterLoop::load_state, py::arg("state"));

  m.def(
      "allreduce",
      [](Communicator& comm, const at::Tensor& tensor) {
        const std::span<float> values = floats_of(tensor, "the tensor");
        const py::gil_scoped_release release;
        allreduce(comm, values);
      },
      py::arg("comm"), py::arg("tensor"));

  m.def("_fail_future", &fail_future, py::arg("future"), py::arg("exception"));

  py::class_<HookWorker>(m, "_HookWorker")
      .def(py::init<bool, py::object>(), py::arg("overlap"), py::arg("on_error"))
      .def("bucket_future", &HookWorker::bucket_future, py::arg("buffer"), py::arg("groups"))
      .def("submit", &HookWorker::submit, py::arg("group"), py::arg("step"), py::arg("epoch"),
           py::arg("synchronizer"), py::arg("moments").none(true), py::arg("flat"),
           py::arg("views"), py::arg("layers") = Sizes{}, py::arg("rows") = Sizes{},
           py::arg("ends_step") = false, py::arg("staging") = std::optional<at::Tensor>{})
      .def("finished_step", &HookWorker::finished_step)
      .def("finished_times", &HookWorker::finished_times)
      .def_property_readonly("overlap", &HookWorker::overlap)
      .def_property_readonly("exchanged_groups", &HookWorker::exchanged_groups);

  bind_grouping_rules(m);

  // sparsecomm.choose_density (planning.py): train's --density auto for a
  // loop of one's own.
  m.def(
      "_choose_configuration",
      [](const std::string& convergence, const std::string& method,
         std::optional<double> target_loss, std::optional<double> target_accuracy, double link_gbit,
         double latency_us, const std::string& network_profile, std::optional<double> compute_s,
         int ranks, double numel, int local_steps, const std::string& options) {
        const perf::ConvergenceProfile profile = perf::load_convergence_profile(convergence);
        const perf::Target target =
            perf::target_from_flags(target_loss, target_accuracy, "choose_density");
        const std::vector<perf::ConfigurationOutcome> outcomes = perf::outcomes(profile, target);
        const perf::Scenario base{.ranks = ranks > 0 ? ranks : profile.ranks,
                                  .numel = numel,
                                  .compute_s = compute_s.value_or(profile.compute_s)};
        const perf::CostProfile network = network_profile.empty()
                                              ? perf::network_profile(link_gbit, latency_us)
                                              : perf::load_profile(network_profile);
        // Any method (method ""): every configuration of these rounds, with
        // its own options, which the result names.
        const std::optional<perf::DensityChoice> choice =
            method.empty() ? perf::choose_configuration(
                                 outcomes,
                                 [&](const perf::ConfigurationOutcome& o) {
                                   return o.local_steps == local_steps && !o.overlap;
                                 },
                                 base, network)
                           : perf::choose_configuration(outcomes, method, local_steps, false,
                                                        options, base, network);
        if (!choice) {
          throw InvalidArgument("choose_density: " + convergence + " has no configuration of " +
                                (method.empty() ? std::string("any method") : method) +
                                " with these rounds and options that reached " +
                                perf::describe(target) + " on every seed");
        }
        py::dict out;
        out["method"] = choice->outcome->method;
        out["density"] = choice->outcome->density;
        out["options"] = choice->outcome->options;
        out["configuration"] = choice->outcome->label;
        out["steps"] = choice->outcome->steps;
        out["step_s"] = choice->step_s;
        out["time_s"] = choice->time_s;
        out["profile_model"] = profile.model;
        return out;
      },
      py::arg("convergence"), py::arg("method"), py::arg("target_loss"), py::arg("target_accuracy"),
      py::arg("link_gbit"), py::arg("latency_us"), py::arg("network_profile"), py::arg("compute_s"),
      py::arg("ranks"), py::arg("numel"), py::arg("local_steps"), py::arg("options"));

  // sparsecomm.write_convergence_profile (planning.py): the checks
  // `plan` and --density auto apply when they read the file.
  m.def(
      "_check_convergence_profile",
      [](const std::string& text, const std::string& origin) {
        nlohmann::json json;
        try {
          json = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
          throw InvalidArgument(origin + ": not JSON: " + e.what());
        }
        perf::convergence_profile_from_json(json, origin);
      },
      py::arg("text"), py::arg("origin"));

  m.def("methods", [] {
    std::vector<std::string> names;
    for (const SyncMethodInfo& info : sync_methods()) names.push_back(info.name);
    return names;
  });

  m.def(
      "method_options",
      [](const std::string& method) {
        std::vector<std::string> names;
        for (const OptionSpec& option : sync_method(method).options) names.push_back(option.name);
        return names;
      },
      py::arg("method"));
}
