#pragma once
// What the two trainers share (internal to train/): the plan every rank of a
// run reads, the run's length and learning-rate schedule, the seeded model,
// checkpoint fingerprints and the end of a run. run_training() (trainer.cc)
// builds the plan and calls, on each rank, train_allreduce_rank()
// (allreduce_trainer.cc) or, in parameter-server mode, train_ps_rank()
// (ps_trainer.cc), or for the click model train_click_rank()
// (click_trainer.cc).

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparsecomm/comm/backend.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/core/timeline.h"
#include "sparsecomm/core/timeline_file.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/optim/lr_schedule.h"
#include "sparsecomm/optim/update_rule.h"
#include "sparsecomm/ps/layout.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/sync/dense_layers.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/models.h"
#include "sparsecomm/train/run_writer.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/train_records.h"
#include "sparsecomm/train/training_data.h"

namespace sparsecomm {

// What every rank shares: the configuration and derived run constants.
struct RunPlan {
  TrainConfig config;
  std::map<std::string, std::string> method_options;
  const Datasets* data = nullptr;
  BackendKind backend = BackendKind::kThread;
  int threads = 1;
  std::filesystem::path run_dir;
  std::optional<std::int64_t> resume_step;  // completed steps of the checkpoint
  TrainObserver* observer = nullptr;
  RunWriter* writer = nullptr;       // rank 0 only
  nlohmann::json summary;            // rank 0's, filled at the end
  std::atomic<bool> stopped{false};  // the ranks stopped on a request (record_stop)
};

// The run's length and learning-rate schedule when `trainers` ranks (or
// workers) share the training data, each `config.batch` samples per step.
struct StepPlan {
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;
  LrScheduleOptions lr;
  double epoch_at(std::int64_t steps_done) const {
    return static_cast<double>(steps_done) / static_cast<double>(steps_per_epoch);
  }
};
StepPlan plan_steps(const TrainConfig& config, std::int64_t train_count, int trainers,
                    std::string_view trainer_name);

// One training rank's steps: the run's length and learning-rate schedule,
// and this rank's batches, for `trainer` of the `trainers` ranks (or
// workers, named so in errors) that share the training data.
struct TrainerSteps {
  TrainerSteps(const RunPlan& run, int trainer, int trainers, std::string_view trainer_name);
  StepPlan plan;
  LrSchedule lr;
  EpochBatches batches;
};

// --slowdown on this worker: at a step where it is slowed (Slowdowns::factor)
// it sleeps (not spins) factor - 1 times that step's compute after
// computing. With one intra-op thread the compute is the thread's CPU time,
// so that ranks sharing cores do not change how slow the straggler is (its
// wall time would include waiting for a core); with more threads, wall time.
class Straggler {
 public:
  // `worker` of `workers`: this rank's place among the ranks that train.
  Straggler(const TrainConfig& config, int worker, int workers, int intra_op_threads);
  void begin_compute(std::int64_t step);
  void end_compute();

 private:
  Slowdowns slowdowns_;
  int worker_ = 0;
  int workers_ = 1;
  bool cpu_time_ = true;
  double factor_ = 1.0;  // this step's
  Stopwatch wall_;
  double cpu_start_ = 0.0;
};

// Held while a model is built: LibTorch's generator is process-wide, so
// models are built one at a time to draw the same initial weights.
std::mutex& model_build_mutex();

// The configured model for the dataset's classes with the seed's initial
// weights (identical on every rank: models are built one at a time per
// process).
std::shared_ptr<Model> make_seeded_model(const TrainConfig& config);
// Its parameter count.
std::size_t model_numel(const TrainConfig& config);

// --min-numel and --exclude as a rule (sync/dense_layers.h).
DenseLayerRule dense_layer_rule(const TrainConfig& config);
// InvalidArgument when a pattern of --exclude matches none of `layers` (the
// message lists their names) or the rule leaves no tensor to sparsify.
void check_dense_layer_rule(const TrainConfig& config, std::span<const LayerSpan> layers);

// The configured synchronization of `module`'s parameters (--method, its
// options, --nonfinite, --bucket-mb, --min-numel, --exclude,
// --freeze-variance-after's dense steps) on `comm`.
std::unique_ptr<DataParallel> make_data_parallel(torch::nn::Module& module, Communicator& comm,
                                                 const RunPlan& plan);
// The optimizer's options (--optimizer and its flags). SGD and Muon run
// without momentum of their own when the method applies momentum itself,
// as DGC and DeMo do (Muon's AdamW half then with beta1 0); InvalidArgument
// for such a method with AdamW.
OptimizerOptions optimizer_options(const TrainConfig& config, bool method_applies_momentum);
// The update around `sync` (--optimizer, --compress; optim/update_rule.h).
// `matrices`: what Muon orthogonalizes (hidden_matrices in models.h); unused
// by the other optimizers.
std::unique_ptr<UpdateRule> make_update_rule(const TrainConfig& config, GradientSync& sync,
                                             std::vector<MatrixBlock> matrices);

// What defines a run's future: a checkpoint only resumes a run that agrees
// (train/checkpoint.h).
nlohmann::json fingerprint(const RunPlan& plan, int world, std::size_t numel);

// This rank's part of checkpoint `step` (a collective): writes the header
// (the run's fingerprint, the step, `wall_s`) and what `write_state` adds,
// waits at the world's barrier for every rank's, and rank 0 commits the
// checkpoint (train/checkpoint.h).
void save_rank_checkpoint(Communicator& comm, const std::filesystem::path& run_dir,
                          std::int64_t step, const nlohmann::json& fingerprint, double wall_s,
                          const std::function<void(StateWriter&)>& write_state);
// Reads back this rank's part of checkpoint `step`: checks its header
// against `fingerprint` and lets `read_state` take the rest, which must
// leave nothing behind (else an Error). Returns the header's wall time.
double load_rank_checkpoint(const std::filesystem::path& run_dir, std::int64_t step, int rank,
                            const nlohmann::json& fingerprint,
                            const std::function<void(StateReader&)>& read_state);

// A data-parallel replica's part of a checkpoint, as the all-reduce and
// click trainers write it: the parameters, the update's state, then the
// synchronization's (DataParallel::save).
void save_replica(StateWriter& state, DataParallel& ddp, const UpdateRule& update);
void load_replica(StateReader& state, DataParallel& ddp, UpdateRule& update);

// The training loss summed since the last evaluation (each trainer reports
// its mean there), carried by the checkpoints.
struct TrainLossSum {
  double sum = 0.0;
  std::int64_t count = 0;
  void add(double loss) {
    sum += loss;
    count += 1;
  }
  void clear() { *this = TrainLossSum{}; }
  void save(StateWriter& state) const;
  void load(StateReader& state);
};

// What every trainer tells the observer at the start (rank 0): the
// backend, `workers` (the ranks that train), the threads, `numel`, the
// run's length, `first_step` (> 0 when resumed) and the run directory. The
// trainer adds its own fields, then calls start_run.
RunInfo run_info(const RunPlan& plan, int workers, std::size_t numel, const StepPlan& steps,
                 std::int64_t first_step);
// Rank 0: hands `info` to the observer, if any.
void start_run(const RunPlan& plan, const RunInfo& info);

// A run that stopped on a request after `step` of its `total_steps`, with a
// checkpoint there.
struct StopRecord {
  std::int64_t step = 0;
  std::int64_t total_steps = 0;
};

// What a trainer does at each point of the run loop (run_steps).
struct RunLoopSteps {
  std::function<void(std::int64_t step)> train;  // step `step` (0-based)
  // An evaluation after `done` steps, at the schedule: each epoch's end,
  // the run's end, and every --eval-every steps.
  std::function<void(std::int64_t done)> evaluate;
  // After every step and its evaluation (optional).
  std::function<void(std::int64_t done)> after_step = {};
  // This rank's part of checkpoint `done` (a collective).
  std::function<void(std::int64_t done)> checkpoint;
  // Whether the run may stop on a request after step `step` (a round of
  // local steps only at its end). Empty: the trainer takes no stop request
  // and the loop runs no collective for it.
  std::function<bool(std::int64_t step)> may_stop_after = {};
};

// --timeline FILE on one rank (core/timeline.h): binds the rank's
// timeline to the calling thread from construction (after a barrier: the
// ranks' common origin) to finish(), appends each step's events to the
// rank's part after end_step(), and at finish() (collective) rank 0 merges
// the parts into FILE. Does nothing for an empty FILE.
class RankTimeline {
 public:
  RankTimeline(Communicator& comm, const std::string& trace);
  void begin_step(std::int64_t step);
  void end_step();
  void finish();

 private:
  Communicator& comm_;
  std::filesystem::path trace_;
  std::optional<TimelineRecorder> recorder_;
  std::optional<BindTimeline> bind_;
};

// The run loop of the three trainers, from `first_step` (0, or a resumed
// checkpoint's) to the run's end or --stop-at-step: each step, then the
// evaluation schedule, then a stop request (core/stop_request.h) that every
// rank agrees on after the same step (one all-reduce), then a checkpoint
// every --checkpoint-every steps, at the run's end, and wherever the loop
// ends early (a stop request or --stop-at-step), so that it resumes. Returns
// the stop when a request ended the run.
std::optional<StopRecord> run_steps(Communicator& comm, const TrainConfig& config,
                                    const StepPlan& steps, std::int64_t first_step,
                                    const RunLoopSteps& loop);
// Marks the run as stopped on every rank (plan.stopped) and, for rank 0's
// summary.json, adds "stopped" to `extra`: what asked, the step, the
// checkpoint and the command that resumes.
void record_stop(RunPlan& plan, const StopRecord& stop, nlohmann::json& extra);

// Rank 0 at the end: summary.json (with `extra` fields), the plots, the
// observer. A plot that cannot be drawn is a warning: the run's results stand.
void finish_run(RunPlan& plan, const RunInfo& info, double wall_s,
                const nlohmann::json& extra = nlohmann::json::object());

// The parameter-server engine's options for this run (`layers`: the
// model's tensors, for layer-wise schemes; may be empty for validation).
PsOptions ps_options(const RunPlan& plan, const std::vector<LayerSpan>& layers);

// One rank of all-reduce data parallelism (DataParallel + UpdateRule).
void train_allreduce_rank(Communicator& comm, RunPlan& plan);
// One rank of the click model's training (model dlrm; click_trainer.cc).
void train_click_rank(Communicator& comm, RunPlan& plan);
// One rank of parameter-server mode: a worker or a server, by `layout`.
void train_ps_rank(Communicator& comm, RunPlan& plan, const ServerLayout& layout);

}  // namespace sparsecomm
