// sparsecomm._sparsecomm: the Python binding (docs/python.md). Thin: every
// call converts its arguments and runs the C++ layers with the GIL released.
// Each part is bound in a file of its own (bindings.h), with the
// conversions of conversions.h:
//
// communicator_binding.cc
//   Communicator(group)            sparsecomm's collectives over a torch
//                                  ProcessGroup (process_group_communicator.h)
//   Communicator.single()          a world of one rank (no torch.distributed)
//   allreduce(comm, tensor)        sparsecomm's ring all-reduce, in place
// synchronizer.cc: Synchronizer(comm, method, options, nonfinite)
//     .synchronize(tensor, step, epoch, bucket, layers, rows) -> metrics (a JSON line)
//     .kept() -> what error feedback kept (the residual), a tensor
//     .applies_momentum (DGC's momentum correction), .bucketable (False for
//     schemes that span the whole gradient), .state() -> bytes, .load_state(bytes)
// device_sync_binding.cc: DeviceSynchronizer(group, method, options,
//     nonfinite), the same on the gradient's device (device_sync.h)
// sparsifier.cc: Sparsifier(comm, method, options, nonfinite)  selection
//     without the exchange, for callers with their own transport
//     .select(tensor, step, epoch, layers) -> (indices int64, values float32)
//     .kept(), .counts, .skipped, .target(), .state(), .load_state(bytes)
// update_direction.h/.cc: UpdateDirection(beta1, beta2, eps)  one rank's
//     AdamW moments for compress="update" (optim/update_rule.h)
//     .direction(tensor) (in place: gradient -> AdamW direction), .state(), .load_state()
// outer_loop.cc: OuterLoop(parameters, local_steps, lr, momentum, nesterov)
//     the outer step of local steps (optim/outer_loop.h) on one flat vector
//     .ends_round(step), .mark_nonfinite(), .pseudo_gradient(params, out),
//     .finish_round(params, mean, skipped), .anchor(), .state(), .load_state()
// hook_worker.cc
//   _HookWorker(overlap, on_error)  runs the DDP hook's group exchanges on a
//                                  thread of its own (exchange_worker.h)
//   _fail_future(future, exception)  fails a torch Future so that torch
//                                  rethrows that very Python exception
// grouping_rules.cc: dense_tensors(...), tensor_buckets(...)  the CLI's
//     --min-numel, --exclude and --bucket-mb for the hook's groups
// planning.cc: methods(), method_options(name), and for planning.py
//     _choose_configuration(...), _check_convergence_profile(text, origin)
//
// sparsecomm's errors become Python exceptions: InvalidArgument ->
// ValueError, CommError -> RuntimeError, both with the C++ message.

#include <exception>

#include <pybind11/pybind11.h>

#include "bindings.h"
#include "sparsecomm/core/errors.h"

namespace py = pybind11;

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

  bind_communicator(m);
  bind_synchronizer(m);
  bind_host_levels(m);
  bind_device_synchronizer(m);
  bind_sparsifier(m);
  bind_update_direction(m);
  bind_outer_loop(m);
  bind_hook_worker(m);
  bind_grouping_rules(m);
  bind_planning(m);
}
