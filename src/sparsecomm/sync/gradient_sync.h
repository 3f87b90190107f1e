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
#include <map>
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
  // Has a path on the gradients' own device (the DDP hook's
  // selection='device', python/src/device_sync.cc): dense, and the schemes
  // whose registry entry names device options (SchemeTraits::device_options).
  bool device_path = false;
  // What that path implements: "name" takes any value, "name=value" that
  // value only.
  std::vector<std::string> device_options = {};
  // Whether the device path runs `option`=`value`.
  bool device_takes(std::string_view option, std::string_view value) const;
};

// dense, skipreduce, then the registry's sparsifiers, in a fixed order.
const std::vector<SyncMethodInfo>& sync_methods();
// "dense, skipreduce, topk, ..." for messages.
std::string sync_method_names();
// The method called `name`, or null.
const SyncMethodInfo* find_sync_method(std::string_view name);
// The method called `name`; InvalidArgument naming the valid ones otherwise.
const SyncMethodInfo& sync_method(std::string_view name);

// `options` as `method` runs with them on local steps' rounds (their
// pseudo-gradients; docs/algorithms.md, "Local steps"): the spike clip off
// unless clip_ratio is named, since a pseudo-gradient's norm follows the
// learning rate (a round sums H steps of it) and a clip against the recent
// rounds would fire on the warm-up's growth, not on spikes. The CLI's
// --local-steps and Python's LocalSteps both take this rule.
std::map<std::string, std::string> round_options(std::string_view method,
                                                 std::map<std::string, std::string> options);

std::unique_ptr<GradientSync> make_gradient_sync(
    std::string_view method, const SchemeOptions& options,
    NonFinitePolicy nonfinite = NonFinitePolicy::kStop);

}  // namespace sparsecomm
