#include "sparsecomm/train/run_plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"
#include "sparsecomm/core/stop_request.h"
#include "sparsecomm/core/timeline_file.h"
#include "sparsecomm/report/plots.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/sync/dense_warmup.h"
#include "sparsecomm/sync/two_level.h"
#include "sparsecomm/train/checkpoint.h"

namespace sparsecomm {

StepPlan plan_steps(const TrainConfig& config, std::int64_t train_count, int trainers,
                    std::string_view trainer_name) {
  StepPlan plan;
  const std::int64_t shard = train_count / trainers;
  plan.steps_per_epoch = shard / config.batch;
  if (plan.steps_per_epoch < 1) {
    throw InvalidArgument(fmt::format(
        "--batch {} is larger than each {}'s share of the data ({} of {} samples over {} {}s): "
        "lower --batch or --workers, or use more --train-samples",
        config.batch, trainer_name, shard, train_count, trainers, trainer_name));
  }
  plan.total_steps = config.max_steps > 0 ? config.max_steps : config.epochs * plan.steps_per_epoch;
  const auto per_epoch = static_cast<double>(plan.steps_per_epoch);
  plan.lr.base = config.lr;
  plan.lr.warmup_steps = std::llround(config.warmup_epochs * per_epoch);
  plan.lr.decay = parse_lr_decay(config.lr_decay);
  for (const double epoch : config.lr_milestones) {
    plan.lr.milestones.push_back(std::llround(epoch * per_epoch));
  }
  plan.lr.gamma = config.lr_gamma;
  plan.lr.total_steps = plan.total_steps;
  return plan;
}

TrainerSteps::TrainerSteps(const RunPlan& run, int trainer, int trainers,
                           std::string_view trainer_name)
    : plan(plan_steps(run.config, run.data->train.count(), trainers, trainer_name)),
      lr(plan.lr),
      batches(run.data->train, trainer, trainers, run.config.batch, run.config.seed,
              plan.steps_per_epoch) {}

Straggler::Straggler(const TrainConfig& config, int worker, int workers, int intra_op_threads)
    : slowdowns_(parse_slowdowns(config)),
      worker_(worker),
      workers_(workers),
      cpu_time_(intra_op_threads == 1) {}

void Straggler::begin_compute(std::int64_t step) {
  factor_ = slowdowns_.factor(worker_, workers_, step);
  if (factor_ <= 1.0) return;
  wall_.restart();
  cpu_start_ = thread_cpu_seconds();
}

void Straggler::end_compute() {
  if (factor_ <= 1.0) return;
  const double compute = cpu_time_ ? thread_cpu_seconds() - cpu_start_ : wall_.seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>((factor_ - 1.0) * compute));
}

std::mutex& model_build_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::shared_ptr<Model> make_seeded_model(const TrainConfig& config) {
  std::lock_guard lock(model_build_mutex());
  torch::manual_seed(config.seed);
  return make_model(config.model, dataset_classes(config.dataset));
}

std::size_t model_numel(const TrainConfig& config) {
  std::size_t numel = 0;
  for (const auto& p : make_seeded_model(config)->parameters()) {
    numel += static_cast<std::size_t>(p.numel());
  }
  return numel;
}

DenseLayerRule dense_layer_rule(const TrainConfig& config) {
  DenseLayerRule rule;
  rule.min_numel = static_cast<std::size_t>(config.min_numel);
  rule.patterns = config.exclude;
  return rule;
}

void check_dense_layer_rule(const TrainConfig& config, std::span<const LayerSpan> layers) {
  if (config.method == "dense") return;
  dense_numel(dense_layer_rule(config), layers, config.model);
}

std::unique_ptr<DataParallel> make_data_parallel(torch::nn::Module& module, Communicator& comm,
                                                 const RunPlan& plan) {
  const TrainConfig& config = plan.config;
  DataParallelOptions parallel;
  parallel.bucket_bytes = static_cast<std::size_t>(config.bucket_mb * 1024.0 * 1024.0);
  if (config.bucket_mb > 0 && parallel.bucket_bytes == 0) parallel.bucket_bytes = 1;
  const SchemeOptions method_options(plan.method_options);
  const NonFinitePolicy nonfinite = parse_nonfinite_policy(config.nonfinite);
  const DenseLayerRule dense = dense_layer_rule(config);
  const HostTopology hosts = resolve_host_topology(config.ranks_per_host, comm);
  if (config.ranks_per_host == kDetectRanksPerHost && comm.rank() == 0) {
    logger().info("hosts: {} of {} rank(s) each, from the ranks' host names{}",
                  hosts.hosts(comm.size()), hosts.ranks_per_host,
                  hosts.ranks_per_host == 1 ? " (one rank per host: one level)" : "");
  }
  auto parallel_module = std::make_unique<DataParallel>(
      module, comm,
      [&] {
        return with_two_levels(
            with_dense_layers(
                with_dense_warmup(make_gradient_sync(config.method, method_options, nonfinite),
                                  config.freeze_variance_after, nonfinite),
                dense, nonfinite),
            hosts);
      },
      parallel);
  check_dense_layer_rule(config, parallel_module->layers());
  return parallel_module;
}

namespace {

// Why a method applies momentum itself, for the refusals below.
std::string_view momentum_owner(std::string_view method) {
  return method == "demo" ? "DeMo keeps each rank's own momentum and sends the sign of a mean"
                          : "memory=momentum, DGC's momentum correction";
}

}  // namespace

OptimizerOptions optimizer_options(const TrainConfig& config, bool method_applies_momentum) {
  OptimizerOptions options;
  options.name = config.optimizer;
  options.sgd.momentum = method_applies_momentum ? 0.0 : config.momentum;
  options.sgd.nesterov = config.nesterov && options.sgd.momentum > 0.0;
  options.sgd.weight_decay = config.weight_decay;
  options.adamw.beta1 = config.beta1;
  options.adamw.beta2 = config.beta2;
  options.adamw.eps = config.adam_eps;
  options.adamw.weight_decay = config.weight_decay;
  options.adamw.freeze_variance_after = config.freeze_variance_after;
  if (method_applies_momentum && options.name == "muon") {
    // The method's momentum is the only one: Muon orthogonalizes what
    // arrives, and the rest's AdamW normalizes it without a first moment.
    options.muon.momentum = 0.0;
    options.muon.nesterov = false;
    options.adamw.beta1 = 0.0;
  }
  if (method_applies_momentum && options.name == "adamw") {
    throw InvalidArgument(fmt::format(
        "--method {} applies momentum itself ({}), which only SGD without momentum can follow; "
        "{}",
        config.method, momentum_owner(config.method),
        config.method == "demo"
            ? "run it with --optimizer sgd (its lr is the size of each sign step: start near "
              "AdamW's)"
            : fmt::format("with --optimizer {} give the method -o memory=ef", options.name)));
  }
  return options;
}

std::unique_ptr<UpdateRule> make_update_rule(const TrainConfig& config, GradientSync& sync,
                                             std::vector<MatrixBlock> matrices) {
  if (config.local_steps > 0 && sync.applies_momentum()) {
    throw InvalidArgument(fmt::format(
        "--method {} applies momentum to what it sends ({}); with --local-steps it would send "
        "pseudo-gradients, which carry the inner optimizer's momentum already: {}",
        config.method, momentum_owner(config.method),
        config.method == "demo" ? "use a sparsifier (topk, exdyna) on the pseudo-gradient"
                                : "give the method -o memory=ef"));
  }
  OptimizerOptions options = optimizer_options(config, sync.applies_momentum());
  options.muon.matrices = std::move(matrices);
  return std::make_unique<UpdateRule>(options, parse_compress(config.compress));
}

nlohmann::json fingerprint(const RunPlan& plan, int world, std::size_t numel) {
  const TrainConfig& c = plan.config;
  nlohmann::json out = {{"model", c.model},
                        {"method", c.method},
                        {"method_options", plan.method_options},
                        {"workers", world},
                        {"batch", c.batch},
                        {"seed", c.seed},
                        {"dataset", c.dataset},
                        {"train_samples", c.train_samples},
                        {"numel", numel}};
  // Present only when set, so checkpoints written before these options existed still match.
  if (c.min_numel > 0) out["min_numel"] = c.min_numel;
  if (!c.exclude.empty()) out["exclude"] = c.exclude;
  if (c.ranks_per_host > 1) out["ranks_per_host"] = c.ranks_per_host;
  if (c.ranks_per_host == kDetectRanksPerHost) out["ranks_per_host"] = "auto";
  if (c.optimizer != "sgd") out["optimizer"] = c.optimizer;
  if (c.compress != "gradient") out["compress"] = c.compress;
  if (c.freeze_variance_after > 0) out["freeze_variance_after"] = c.freeze_variance_after;
  if (ps_mode(c)) {
    out["servers"] = c.servers;
    out["sync"] = sync_model_name(c);
  }
  if (model_reads_clicks(c.model)) {
    out["embedding"] = {{"cap", c.embedding_cap},           {"dim", c.embedding_dim},
                        {"exchange", c.embedding_exchange}, {"optimizer", c.embedding_optimizer},
                        {"values", c.embedding_values},     {"lr", c.embedding_lr}};
  }
  if (c.local_steps > 0) {
    out["local_steps"] = c.local_steps;
    out["outer"] = {c.outer_lr, c.outer_momentum, c.outer_nesterov};
    if (c.outer_overlap) out["outer_overlap"] = true;
  }
  return out;
}

void save_rank_checkpoint(Communicator& comm, const std::filesystem::path& run_dir,
                          std::int64_t step, const nlohmann::json& fingerprint, double wall_s,
                          const std::function<void(StateWriter&)>& write_state) {
  StateWriter state;
  write_checkpoint_header(state, fingerprint, step, wall_s);
  write_state(state);
  write_rank_checkpoint(run_dir, step, comm.rank(), state.bytes());
  run_checkpoint_fault_hook(step, comm.rank());
  comm.barrier();
  if (comm.rank() == 0) commit_checkpoint(run_dir, step, comm.size(), fingerprint);
}

double load_rank_checkpoint(const std::filesystem::path& run_dir, std::int64_t step, int rank,
                            const nlohmann::json& fingerprint,
                            const std::function<void(StateReader&)>& read_state) {
  const std::vector<std::byte> bytes = read_rank_checkpoint(run_dir, step, rank);
  StateReader state(bytes);
  const double wall_s = read_checkpoint_header(state, fingerprint, step, rank);
  read_state(state);
  if (!state.at_end()) throw Error("the checkpoint has trailing data: a different version?");
  return wall_s;
}

void save_replica(StateWriter& state, DataParallel& ddp, const UpdateRule& update) {
  state.array<float>(ddp.parameters());
  update.save(state);
  ddp.save(state);
}

void load_replica(StateReader& state, DataParallel& ddp, UpdateRule& update) {
  state.array_into<float>(ddp.parameters());
  update.load(state);
  ddp.load(state);
}

void TrainLossSum::save(StateWriter& state) const {
  state.value<double>(sum);
  state.value<std::int64_t>(count);
}

void TrainLossSum::load(StateReader& state) {
  sum = state.value<double>();
  count = state.value<std::int64_t>();
}

namespace {

bool evaluates_after(const TrainConfig& config, const StepPlan& steps, std::int64_t done) {
  return done % steps.steps_per_epoch == 0 || done == steps.total_steps ||
         (config.eval_every > 0 && done % config.eval_every == 0);
}

// Whether any rank was asked to stop: the same answer on every rank.
bool ranks_agree_to_stop(Communicator& comm) {
  std::int64_t requests = stop_requested() ? 1 : 0;
  allreduce(comm, std::span<std::int64_t>(&requests, 1));
  return requests > 0;
}

}  // namespace

std::optional<StopRecord> run_steps(Communicator& comm, const TrainConfig& config,
                                    const StepPlan& steps, std::int64_t first_step,
                                    const RunLoopSteps& loop) {
  const std::int64_t end = config.stop_at_step > 0
                               ? std::min(steps.total_steps, config.stop_at_step)
                               : steps.total_steps;
  RankTimeline timeline(comm, config.timeline);
  std::optional<StopRecord> stopped;
  for (std::int64_t step = first_step; step < end && !stopped; ++step) {
    timeline.begin_step(step);
    loop.train(step);
    const std::int64_t done = step + 1;
    if (evaluates_after(config, steps, done)) {
      TimedSpan span("evaluate", "evaluate");
      loop.evaluate(done);
    }
    if (loop.after_step) loop.after_step(done);
    const bool stop =
        done < end && loop.may_stop_after && loop.may_stop_after(step) && ranks_agree_to_stop(comm);
    const bool periodic = config.checkpoint_every > 0 &&
                          (done % config.checkpoint_every == 0 || done == steps.total_steps);
    // Ending early (stopped, or --stop-at-step) leaves a checkpoint to resume from.
    if (periodic || stop || (done == end && end < steps.total_steps)) {
      TimedSpan span("checkpoint", "checkpoint");
      loop.checkpoint(done);
    }
    if (stop) stopped = StopRecord{done, steps.total_steps};
    timeline.end_step();
  }
  timeline.finish();
  return stopped;
}

RankTimeline::RankTimeline(Communicator& comm, const std::string& trace)
    : comm_(comm), trace_(trace) {
  if (trace_.empty()) return;
  comm_.barrier();  // the ranks' common origin
  recorder_.emplace(trace_, comm_.rank());
  bind_.emplace(&recorder_->events());
}

void RankTimeline::begin_step(std::int64_t step) {
  if (recorder_) recorder_->events().set_step(step);
}

void RankTimeline::end_step() {
  if (recorder_) recorder_->end_step();
}

void RankTimeline::finish() {
  if (!recorder_) return;
  recorder_->end_step();
  bind_.reset();
  if (const std::uint64_t dropped = recorder_->events().dropped(); dropped > 0) {
    logger().warn("timeline: {} events of rank {} were dropped (more than fit between two steps)",
                  dropped, comm_.rank());
  }
  comm_.barrier();  // every part is written
  const std::vector<int> missing = recorder_->merge(comm_.size());
  recorder_.reset();
  if (comm_.rank() != 0) return;
  if (missing.empty()) {
    logger().info("timeline: {} (open it in https://ui.perfetto.dev or chrome://tracing)",
                  trace_.string());
  } else {
    logger().warn(
        "timeline: {} lacks ranks {} (their parts are on their hosts' disks: copy them into "
        "{}.parts/ and run sparsecomm report --timeline {})",
        trace_.string(), fmt::join(missing, ", "), trace_.string(), trace_.string());
  }
}

RunInfo run_info(const RunPlan& plan, int workers, std::size_t numel, const StepPlan& steps,
                 std::int64_t first_step) {
  RunInfo info;
  info.backend = std::string(backend_name(plan.backend));
  info.workers = workers;
  info.threads = plan.threads;
  info.numel = numel;
  info.steps_per_epoch = steps.steps_per_epoch;
  info.total_steps = steps.total_steps;
  info.first_step = first_step;
  info.run_dir = plan.run_dir.string();
  return info;
}

void start_run(const RunPlan& plan, const RunInfo& info) {
  if (plan.observer) plan.observer->on_start(info);
}

void record_stop(RunPlan& plan, const StopRecord& stop, nlohmann::json& extra) {
  plan.stopped = true;
  const std::string reason = stop_reason();
  nlohmann::json record = {
      {"reason", reason.empty() ? std::string("another rank's request") : reason},
      {"step", stop.step},
      {"total_steps", stop.total_steps},
      {"checkpoint", checkpoint_dir(plan.run_dir, stop.step).string()},
      {"resume", fmt::format("sparsecomm train --resume {}", plan.run_dir.string())}};
  extra["stopped"] = std::move(record);
}

void finish_run(RunPlan& plan, const RunInfo& info, double wall_s, const nlohmann::json& extra) {
  plan.summary = plan.writer->finish(info, wall_s, extra);
  if (plan.config.plots) {
    try {
      const std::vector<report::RunData> runs = {report::load_run(plan.run_dir)};
      report::write_plots(runs, plan.run_dir);
    } catch (const std::exception& e) {
      logger().warn("plots were not drawn: {}", e.what());
    }
  }
  if (plan.observer) plan.observer->on_finish(plan.summary);
}

}  // namespace sparsecomm
