#pragma once
// What a training run reports as it goes: the run's description, each step,
// each evaluation, and the observer that receives them on rank 0. The
// trainers (trainer.h) produce them; the run directory (run_writer.h), the
// comparison (compare.h) and the CLI's progress line read them.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparsecomm/sync/step_metrics.h"

namespace sparsecomm {

// What the run is, once the world and the data are known.
struct RunInfo {
  std::string backend;    // thread | mpi
  int workers = 0;        // all-reduce: ranks; parameter-server mode: workers (W)
  int servers = 0;        // parameter-server mode: S (the world is W + S ranks); 0: all-reduce
  std::string sync;       // parameter-server mode: "bsp", "ssp:2", ...; all-reduce: "allreduce"
  int threads = 0;        // LibTorch intra-op threads per rank
  std::size_t numel = 0;  // what DataParallel synchronizes
  std::size_t embedding_numel = 0;  // the click model's tables (not in numel)
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;
  std::int64_t first_step = 0;  // > 0 when resumed
  std::size_t buckets = 1;      // > 1: pipelined with backward
  std::string pipelining;       // what the run does about pipelining, in words
  std::string run_dir;
};

// The click model's embedding tables in one step (rank 0's view).
struct EmbeddingStep {
  bool present = false;                    // the model has tables
  std::string exchange;                    // the exchange this step used
  std::size_t touched_rows = 0;            // this rank's unique rows, all tables
  std::vector<std::size_t> table_touched;  // per table
  std::size_t union_rows = 0;              // rows of the sum over ranks
  std::uint64_t bytes_sent = 0;            // this rank's, for the tables
  std::uint64_t bytes_received = 0;
  double exchange_s = 0.0;  // in TrainStep::exchange_s
  double update_s = 0.0;    // in TrainStep::update_s
};

// Rank 0's view of one step (its own phase times; K/k and imbalance are the
// same on every rank).
struct TrainStep {
  std::int64_t step = 0;  // 0-based index of the step just done
  double epoch = 0.0;     // fractional epochs completed after this step
  double wall_s = 0.0;    // since the run began (resumed runs continue)
  double lr = 0.0;
  double loss = 0.0;         // rank 0's training loss on its batch
  double compute_s = 0.0;    // data, forward, backward
  double selection_s = 0.0;  // forming a = g + e and the sparsifier's selection
  double exchange_s = 0.0;
  double update_s = 0.0;  // optimizer step
  double wait_s = 0.0;    // parameter-server mode: blocked in begin_step (the sync model)
  StepMetrics sync;       // the dense parameters' synchronization
  EmbeddingStep embedding;
  // False for a local step inside a round (--local-steps): nothing was sent,
  // and `sync` is empty; the round's last step carries its synchronization.
  bool synchronized = true;
};

struct TrainEval {
  std::int64_t step = 0;  // steps completed
  double epoch = 0.0;
  double wall_s = 0.0;
  double test_accuracy = 0.0;  // fraction in [0, 1], over the whole test set
  double test_loss = 0.0;
  double test_auc = std::nan("");  // click model: area under the ROC curve of the test set
  double train_loss = 0.0;         // mean over all ranks' steps since the last evaluation
  bool deferred = false;           // evaluated after training on the parameters of `step`
};

// Called on rank 0 only, from its thread, in order (with eval_deferred,
// every on_eval comes after the last on_step).
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_start(const RunInfo&) {}
  virtual void on_step(const TrainStep&) {}
  virtual void on_eval(const TrainEval&) {}
  virtual void on_finish(const nlohmann::json& /*summary*/) {}
};

}  // namespace sparsecomm
