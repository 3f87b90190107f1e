#pragma once
// The parts of the module (module.cc), each registering its Python names on
// `m`. A file holds the class it binds (synchronizer.cc: Synchronizer) or,
// named *_binding.cc, binds a class that lives without Python beside it
// (communicator_binding.cc: process_group_communicator.h). module.cc calls
// them in this order: a type is registered before a signature names it.

#include <pybind11/pybind11.h>

namespace sparsecomm::python {

// Communicator (over a ProcessGroup, or .single()) and allreduce.
void bind_communicator(pybind11::module_& m);  // communicator_binding.cc
// _GroupSync, the base the hook's worker runs, and the host Synchronizer.
void bind_synchronizer(pybind11::module_& m);  // synchronizer.cc
// _HostLevels (host_levels.h), after bind_synchronizer's _GroupSync.
void bind_host_levels(pybind11::module_& m);  // host_levels.cc
// DeviceSynchronizer (device_sync.h), after bind_synchronizer's _GroupSync.
void bind_device_synchronizer(pybind11::module_& m);  // device_sync_binding.cc
// Sparsifier: a scheme's selection without the exchange.
void bind_sparsifier(pybind11::module_& m);  // sparsifier.cc
// UpdateDirection: compress="update"'s AdamW moments.
void bind_update_direction(pybind11::module_& m);  // update_direction.cc
// OuterLoop: the outer step of local steps.
void bind_outer_loop(pybind11::module_& m);  // outer_loop.cc
// _HookWorker (the DDP hook's exchanges) and _fail_future.
void bind_hook_worker(pybind11::module_& m);  // hook_worker.cc
// dense_tensors and tensor_buckets: the CLI's rules for the hook's groups.
void bind_grouping_rules(pybind11::module_& m);  // grouping_rules.cc
// methods, method_options, _choose_configuration, _check_convergence_profile.
void bind_planning(pybind11::module_& m);  // planning.cc

}  // namespace sparsecomm::python
