#pragma once
// Every synchronization method by name, behind one interface: what a trainer
// calls once per step with its flat local gradient.
//
//   dense       all-reduce of the whole gradient (our ring, or MPI's native)
//   skipreduce  Skip-Reduce: index-free pruning inside the ring
//   <scheme>    any sparsifier of the registry (topk, exdyna, ...) with its
//               exchange pattern and memory (SparsifyExchangeStep)
//
// Methods are built from key=value options (SchemeOptions); unknown names
// and options are InvalidArgument errors that list what is valid.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/sparsifier.h"
#include "sparsecomm/sync/gradient_sync_interface.h"
#include "sparsecomm/sync/sparsify_exchange_step.h"
#include "sparsecomm/sync/step_metrics.h"

namespace sparsecomm {

struct SyncMethodInfo {
  std::string name;
  std::string summary;
  std::vector<OptionSpec> options;
  // Keeps a share of the coordinates set by the density (the sparsifiers);
  // false for dense, Skip-Reduce, PowerSGD and the dense quantizers, whose
  // compression another option sets.
  bool has_density = false;
};

// dense, skipreduce, then the registry's sparsifiers, in a fixed order.
const std::vector<SyncMethodInfo>& sync_methods();
// "dense, skipreduce, topk, ..." for messages.
std::string sync_method_names();
// The method called `name`, or null.
const SyncMethodInfo* find_sync_method(std::string_view name);
// The method called `name`; InvalidArgument naming the valid ones otherwise.
const SyncMethodInfo& sync_method(std::string_view name);

std::unique_ptr<GradientSync> make_gradient_sync(
    std::string_view method, const SchemeOptions& options,
    NonFinitePolicy nonfinite = NonFinitePolicy::kStop);

}  // namespace sparsecomm
