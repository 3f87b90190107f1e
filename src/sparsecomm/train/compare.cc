// run_comparison and compare_item (compare.h).

#include "sparsecomm/train/compare.h"

#include <exception>

#include "sparsecomm/comm/backend.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/ps/sync_model.h"
#include "sparsecomm/sync/sparsify_sequence.h"

namespace sparsecomm {

CompareRun compare_item(const TrainConfig& base, const std::string& item) {
  CompareRun run{base, item};
  TrainConfig& config = run.config;
  const auto at = item.find('@');
  config.method = item.substr(0, at);
  if (at != std::string::npos) {
    const std::string sync = item.substr(at + 1);
    if (sync.find(':') != std::string::npos) {
      const SyncModel model = parse_sync_model(sync);
      config.sync = sync.substr(0, sync.find(':'));
      config.staleness = model.kind == SyncModelKind::kSsp ? model.staleness : 0;
      config.staleness_low = model.kind == SyncModelKind::kDssp ? model.staleness : 0;
      config.staleness_high = model.kind == SyncModelKind::kDssp ? model.staleness_upper : 0;
    } else {
      config.sync = sync;
      if (sync != "ssp") config.staleness = 0;
      if (sync != "dssp") config.staleness_low = config.staleness_high = 0;
    }
    for (char& ch : run.label) {
      if (ch == ':') ch = '-';
    }
  }
  return run;
}

CompareResult run_comparison(
    std::span<const CompareRun> runs,
    const std::function<std::unique_ptr<TrainObserver>(const std::string& label)>& observer) {
  CompareResult result;
  for (const CompareRun& run : runs) {
    const std::unique_ptr<TrainObserver> watcher = observer ? observer(run.label) : nullptr;
    result.dirs.emplace_back(run.config.out);
    try {
      const nlohmann::json summary = run_training(run.config, watcher.get());
      result.rank0 = !summary.is_null();
    } catch (const NonFiniteGradient& e) {
      result.failed.push_back(run.label + ": " + e.what());
    } catch (const Error& e) {
      if (resolve_backend(parse_backend(run.config.backend)) == BackendKind::kMpi) throw;
      result.failed.push_back(run.label + ": " + e.what());
    }
  }
  return result;
}

}  // namespace sparsecomm
