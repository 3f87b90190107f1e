#pragma once
// `sparsecomm train --compare`: several runs on the same seed and data, one
// after another, each in its own directory. A failed run is recorded and
// the comparison goes on (see run_comparison).

#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/train_records.h"

namespace sparsecomm {

struct CompareRun {
  TrainConfig config;  // config.out: the run's directory
  std::string label;   // the item as the table names it
};

// One --compare item: "METHOD" or "METHOD@SYNC" (SYNC: bsp | asp | ssp |
// dssp, taking the bounds of --staleness / --staleness-low/-high, or ssp:S |
// dssp:L:U with its own bounds), on top of `base`. config.out is left as
// base's. InvalidArgument for a malformed SYNC.
CompareRun compare_item(const TrainConfig& base, const std::string& item);

struct CompareResult {
  std::vector<std::filesystem::path> dirs;  // every run's directory, in order
  std::vector<std::string> failed;          // "LABEL: error" of each failed run
  bool rank0 = true;                        // this process wrote the run directories
};

// Trains each run in turn. A run that fails is recorded in its directory
// (failure.json, written by the trainer) and the next one starts: on the
// thread backend after any error (every rank thread has ended with it);
// under MPI only after a non-finite gradient, which every rank raises at
// the same step. Any other error under MPI (a lost rank, a timeout) ends
// the comparison: the ranks may no longer agree on what comes next.
// `observer(label)` makes each run's observer (it may return null).
CompareResult run_comparison(
    std::span<const CompareRun> runs,
    const std::function<std::unique_ptr<TrainObserver>(const std::string& label)>& observer);

}  // namespace sparsecomm
