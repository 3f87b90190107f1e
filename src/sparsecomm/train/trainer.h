#pragma once
// The training loop behind `sparsecomm train` (no LibTorch in this header).
//
// One step on every rank: forward/backward on the rank's batch -> gradients
// in DataParallel's persistent flat buffer -> the configured synchronization
// -> FlatSgd step with the synchronized gradient (momentum and weight decay
// applied after synchronization; DGC's momentum correction replaces the
// optimizer's momentum) -> metrics. The run directory (config.json,
// metrics.jsonl, summary.json, checkpoints/, plots) is written by rank 0.

#include <string>

#include <nlohmann/json.hpp>

#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/train_records.h"

namespace sparsecomm {

// Runs the whole training on the configured world (threads in this process,
// or this process's rank under mpirun). `resume_dir` non-empty: continue
// from its latest checkpoint (the configuration must match what defines
// the run: model, method and options, workers, batch, seed, data). Returns
// summary.json's content (rank 0's; under MPI the other processes return
// null, or {"stopped": true}). A run that stopped on a request
// (core/stop_request.h) returns normally after checkpointing, its summary
// with "stopped" (docs/architecture.md, "Stopping on a signal").
nlohmann::json run_training(const TrainConfig& config, TrainObserver* observer = nullptr,
                            const std::string& resume_dir = "");

}  // namespace sparsecomm
