// Parameter-server mode: a worker's training loop (begin_step -> pull ->
// forward/backward -> push) and a server rank, over the engine in ps/.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/train/checkpoint.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/evaluation.h"
#include "sparsecomm/train/run_plan.h"
#include "sparsecomm/train/worker_phase_times.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

// A worker's (or server's) replica: the seeded model in flat buffers, with
// no broadcast (servers take part in no collective before training).
struct FlatModel {
  std::shared_ptr<Model> model;
  std::unique_ptr<FlatModule> flat;
};

std::unique_ptr<FlatModel> make_flat_model(const TrainConfig& config) {
  auto replica = std::make_unique<FlatModel>();
  replica->model = make_seeded_model(config);
  replica->flat = std::make_unique<FlatModule>(*replica->model);
  return replica;
}

// Totals every rank contributes to at the end (fixed point, one all-reduce
// over the whole world): per worker its wait (us) and blocked begins, per
// server the sum, count and maximum of its applied pushes' lag in shard
// versions, and the controller's sum, count and maximum of the steps a
// worker was ahead of the slowest running worker when granted a step.
struct PsTotals {
  enum Field { kSum = 0, kCount = 1, kMax = 2 };
  int workers = 0;
  int servers = 0;
  std::vector<std::int64_t> values;
  PsTotals(int w, int s) : workers(w), servers(s), values(2 * w + 3 * s + 3, 0) {}
  std::int64_t& wait_us(int worker) { return values[static_cast<std::size_t>(worker)]; }
  std::int64_t& blocked(int worker) { return values[static_cast<std::size_t>(workers + worker)]; }
  // Pushes applied to server s's shard between a worker's pull and its push.
  std::int64_t& push_lag(int s, Field field) {
    return values[static_cast<std::size_t>(2 * workers + 3 * s + field)];
  }
  // Steps ahead of the slowest running worker at each granted step: the
  // unit of --staleness (SSP grants at most s, DSSP at most s_U).
  std::int64_t& steps_ahead(Field field) {
    return values[static_cast<std::size_t>(2 * workers + 3 * servers + field)];
  }
};

void write_server_log(const fs::path& path, const ServerLog& log, const std::string& sync) {
  std::ofstream out(path, std::ios::trunc);
  const auto line = [&](const nlohmann::json& j) { out << j.dump() << '\n'; };
  for (const BeginGrant& g : log.grants) {
    line({{"kind", "begin"},
          {"worker", g.worker},
          {"clock", g.clock},
          {"min_clock", g.min_clock},
          {"blocked", g.blocked},
          {"extra", g.extra},
          {"dssp_r", g.dssp_r},
          {"wait_s", g.wait_s},
          {"time_s", g.time_s}});
  }
  for (const AppliedPush& a : log.applied) {
    line({{"kind", "push"},
          {"worker", a.worker},
          {"clock", a.clock},
          {"pulled_version", a.pulled_version},
          {"staleness", a.staleness},
          {"time_s", a.time_s},
          {"values", a.values},
          {"bytes", a.bytes}});
  }
  nlohmann::json waits = nlohmann::json::array();
  for (const WaitStats& w : log.waits)
    waits.push_back({{"count", w.count}, {"seconds", w.seconds}});
  line({{"kind", "server"},
        {"server", log.server},
        {"sync", sync},
        {"shard", {log.shard.begin, log.shard.end}},
        {"version", log.version},
        {"pushes", log.pushes},
        {"pulls", log.pulls},
        {"values", log.values},
        {"bytes_received", log.bytes_received},
        {"bytes_sent", log.bytes_sent},
        {"waits", waits},
        {"seconds", log.seconds}});
  if (!out) throw Error(fmt::format("cannot write {}", path.string()));
}

// One server rank: serves its shard of the seeded initial parameters (or
// of the checkpoint it resumes from), writes its state at each checkpoint's
// cut, its log (server<i>.jsonl in the run directory), joins the final
// totals.
void run_ps_server(Communicator& comm, RunPlan& plan, const ServerLayout& layout) {
  std::unique_ptr<FlatModel> flat = make_flat_model(plan.config);
  const int index = layout.server_index(comm.rank());
  const Range shard = layout.shard(index);
  const PsOptions options =
      ps_options(plan, {flat->flat->layers().begin(), flat->flat->layers().end()});
  const nlohmann::json run_fingerprint = fingerprint(plan, comm.size(), flat->flat->numel());
  std::vector<std::byte> resume;
  if (plan.resume_step) {
    load_rank_checkpoint(plan.run_dir, *plan.resume_step, comm.rank(), run_fingerprint,
                         [&](StateReader& state) {
                           state.array<float>();  // the shard, also in the server's own state
                           resume = state.array<std::byte>();
                         });
  }
  ServerCheckpoints checkpoints;
  checkpoints.resume = resume;
  checkpoints.at_cut = [&](std::int64_t done, std::span<const float> shard_values,
                           std::span<const std::byte> server_state) {
    save_rank_checkpoint(comm, plan.run_dir, done, run_fingerprint, 0.0, [&](StateWriter& state) {
      state.array<float>(shard_values);
      state.array<std::byte>(server_state);
    });
  };
  const ServerLog log =
      run_server(comm, layout, options, flat->flat->parameters().subspan(shard.begin, shard.size()),
                 checkpoints);
  write_server_log(plan.run_dir / fmt::format("server{}.jsonl", index), log, options.model.name());
  PsTotals totals(layout.workers(), layout.servers());
  for (const AppliedPush& a : log.applied) {
    totals.push_lag(index, PsTotals::kSum) += a.staleness;
    totals.push_lag(index, PsTotals::kMax) =
        std::max(totals.push_lag(index, PsTotals::kMax), a.staleness);
  }
  totals.push_lag(index, PsTotals::kCount) = static_cast<std::int64_t>(log.applied.size());
  for (const BeginGrant& g : log.grants) {  // the controller's log only
    const std::int64_t ahead = g.clock - g.min_clock;
    totals.steps_ahead(PsTotals::kSum) += ahead;
    totals.steps_ahead(PsTotals::kMax) = std::max(totals.steps_ahead(PsTotals::kMax), ahead);
  }
  totals.steps_ahead(PsTotals::kCount) = static_cast<std::int64_t>(log.grants.size());
  allreduce(comm, std::span<std::int64_t>(totals.values));
  WorkerPhaseTimes().gather(comm);  // a server trains no step: the workers' times only
}

// One worker rank: the same model, data order and learning-rate schedule as
// the all-reduce trainer (with W workers instead of W ranks), but each step
// is begin_step -> pull -> forward/backward -> push to the servers. Rank 0
// evaluates alone, on parameters it pulls right before evaluating, on a
// replica of the model on a thread of its own while it goes on training
// (BackgroundEvaluation), so no worker waits on an evaluation.
class PsRankWorker {
 public:
  PsRankWorker(Communicator& comm, RunPlan& plan, const ServerLayout& layout)
      : comm_(comm),
        plan_(plan),
        config_(plan.config),
        layout_(layout),
        steps_(plan, comm.rank(), layout.workers(), "worker"),
        straggler_(plan.config, comm.rank(), layout.workers(), plan.threads) {
    flat_ = make_flat_model(config_);
    options_ = ps_options(plan, {flat_->flat->layers().begin(), flat_->flat->layers().end()});
    worker_ = std::make_unique<PsWorker>(comm_, layout_, options_);
    fingerprint_ = fingerprint(plan_, comm_.size(), flat_->flat->numel());
  }

  void run() {
    std::int64_t step = 0;
    if (plan_.resume_step) {
      step = *plan_.resume_step;
      load_checkpoint(step);
    }
    if (comm_.rank() == 0) {
      info_ = run_info(plan_, layout_.workers(), flat_->flat->numel(), steps_.plan, step);
      info_.servers = layout_.servers();
      info_.sync = options_.model.name();
      info_.pipelining = "not pipelined (parameter-server mode)";
      start_run(plan_, info_);
    }
    clock_ = Stopwatch();
    flat_->model->train();
    // Every worker checkpoints after the same steps (a cut: parameter_server.h).
    // Evaluations are rank 0's; a stop request is not taken (the servers
    // are not in the loop to agree on it).
    run_steps(comm_, config_, steps_.plan, step,
              {.train = [this](std::int64_t at) { train_step(at); },
               .evaluate =
                   [this](std::int64_t done) {
                     if (comm_.rank() == 0) evaluate(done);
                   },
               .after_step =
                   [this](std::int64_t) {
                     if (comm_.rank() == 0 && background_) write_evals(background_->finished());
                   },
               .checkpoint = [this](std::int64_t done) { save_checkpoint(done); }});
    worker_->finish();
    PsTotals totals(layout_.workers(), layout_.servers());
    totals.wait_us(comm_.rank()) = std::llround(worker_->log().wait_s * 1e6);
    totals.blocked(comm_.rank()) = worker_->log().blocked;
    allreduce(comm_, std::span<std::int64_t>(totals.values));
    const nlohmann::json phase_times = phase_times_.gather(comm_);
    // The last evaluation may still run; the other ranks are done with
    // every collective, so nobody waits on it but rank 0.
    if (background_) write_evals(background_->drain());
    if (comm_.rank() == 0) finish(totals, phase_times);
  }

 private:
  double wall() const { return wall_offset_ + clock_.seconds(); }

  // A cut after `done` steps: rank 0 first records every evaluation taken so
  // far (a checkpoint leaves none pending), every worker pauses, saves its
  // part and joins the servers at the world's barrier; rank 0 commits.
  void save_checkpoint(std::int64_t done) {
    if (comm_.rank() == 0) {
      if (background_) write_evals(background_->drain());
      snapshots_.replay(*flat_->model, flat_->flat->parameters(),
                        [&](const EvalPoint& point) { evaluate_now(point); });
    }
    worker_->pause();
    save_rank_checkpoint(comm_, plan_.run_dir, done, fingerprint_, wall(), [&](StateWriter& state) {
      state.array<float>(flat_->flat->parameters());
      worker_->save(state);
      train_loss_.save(state);
      state.value<double>(bytes_pushed_);
      state.value<double>(bytes_pulled_);
      state.value<double>(bytes_to_workers_);
    });
  }

  void load_checkpoint(std::int64_t done) {
    wall_offset_ = load_rank_checkpoint(plan_.run_dir, done, comm_.rank(), fingerprint_,
                                        [&](StateReader& state) {
                                          state.array_into<float>(flat_->flat->parameters());
                                          worker_->load(state);
                                          train_loss_.load(state);
                                          bytes_pushed_ = state.value<double>();
                                          bytes_pulled_ = state.value<double>();
                                          bytes_to_workers_ = state.value<double>();
                                        });
  }

  void train_step(std::int64_t step) {
    TrainStep record;
    record.step = step;
    record.lr = steps_.lr.at(step);
    const double epoch = steps_.plan.epoch_at(step);

    Stopwatch wait;
    worker_->begin_step();
    record.wait_s = wait.seconds();

    Stopwatch pull;
    const std::size_t pulled_before = worker_->log().bytes_pulled;
    worker_->pull(flat_->flat->parameters());
    const double pull_s = pull.seconds();
    const std::size_t pulled = worker_->log().bytes_pulled - pulled_before;

    Stopwatch compute;
    straggler_.begin_compute(step);
    const EpochBatches::Batch batch = steps_.batches.at(step);
    flat_->flat->zero_grad();
    const torch::Tensor loss = flat_->model->score(batch.inputs, batch.labels).losses.mean();
    loss.backward();
    flat_->flat->reattach_gradients();
    record.loss = loss.item<double>();
    straggler_.end_compute();
    record.compute_s = compute.seconds();
    train_loss_.add(record.loss);

    const PushReport push = worker_->push(flat_->flat->gradients(), record.lr, epoch);
    record.selection_s = push.select_s;
    record.exchange_s = pull_s + push.send_s;
    // The grant's wait is communication too (BSP waits for the slowest).
    phase_times_.add_step(record.compute_s, record.exchange_s + record.wait_s);

    StepMetrics& m = record.sync;
    m.step = step;
    m.numel = flat_->flat->numel();
    m.target = push.target;
    m.selected = push.selected;
    m.union_size = push.union_size;  // partition-based: K over all workers
    m.density_ratio = push.target > 0
                          ? static_cast<double>(push.union_size) / static_cast<double>(push.target)
                          : 0.0;
    m.residual_norm = push.residual_norm;
    m.bytes_sent = push.bytes_sent + push.bytes_to_workers;
    m.bytes_received = pulled;
    m.selection_s = push.select_s;
    m.exchange_s = record.exchange_s;
    bytes_pushed_ += static_cast<double>(push.bytes_sent);
    bytes_to_workers_ += static_cast<double>(push.bytes_to_workers);
    bytes_pulled_ += static_cast<double>(pulled);

    if (comm_.rank() == 0) {
      record.epoch = steps_.plan.epoch_at(step + 1);
      record.wall_s = wall();
      plan_.writer->write_step(record);
      if (plan_.observer) plan_.observer->on_step(record);
    }
  }

  // Rank 0 alone: pulls the freshest parameters (under BSP those after this
  // step's update, as in the all-reduce trainer) and evaluates the whole
  // test set now, or (eval_deferred) keeps them to evaluate after training;
  // the training loss is rank 0's mean since the previous point.
  void evaluate(std::int64_t done) {
    worker_->pull(flat_->flat->parameters());
    const EvalPoint point{done, steps_.plan.epoch_at(done), wall(), train_loss_.sum,
                          train_loss_.count};
    train_loss_.clear();
    if (config_.eval_deferred) {
      snapshots_.take(point, flat_->flat->parameters(), *flat_->model);
      return;
    }
    if (!background_) {
      eval_replica_ = make_flat_model(config_);
      background_ = std::make_unique<BackgroundEvaluation>(
          eval_replica_->model, eval_replica_->flat->parameters(), plan_.data->test);
    }
    background_->submit(point, flat_->flat->parameters(), *flat_->model);
  }

  void write_evals(const std::vector<BackgroundEvaluation::Result>& done) {
    for (const BackgroundEvaluation::Result& result : done) write_eval(result.point, result.counts);
  }

  void evaluate_now(const EvalPoint& point) {
    const TensorSplit& test = plan_.data->test;
    write_eval(point, evaluate_range(*flat_->model, test, 0, test.count()));
  }

  void write_eval(const EvalPoint& point, const EvalCounts& counts) {
    const std::int64_t test_count = plan_.data->test.count();
    TrainEval eval =
        make_train_eval(point, test_count, counts, point.train_loss_sum, point.train_loss_count);
    eval.deferred = config_.eval_deferred;
    plan_.writer->write_eval(eval);
    if (plan_.observer) plan_.observer->on_eval(eval);
  }

  void finish(PsTotals& totals, const nlohmann::json& phase_times) {
    const double wall_s = wall();  // after every worker and server is done
    snapshots_.replay(*flat_->model, flat_->flat->parameters(),
                      [&](const EvalPoint& point) { evaluate_now(point); });
    std::int64_t lag_sum = 0, lag_count = 0, lag_max = 0;
    for (int s = 0; s < totals.servers; ++s) {
      lag_sum += totals.push_lag(s, PsTotals::kSum);
      lag_count += totals.push_lag(s, PsTotals::kCount);
      lag_max = std::max(lag_max, totals.push_lag(s, PsTotals::kMax));
    }
    const bool steps_measured = totals.steps_ahead(PsTotals::kCount) > 0;
    const auto mean = [](std::int64_t sum, std::int64_t count) {
      return count > 0 ? static_cast<double>(sum) / static_cast<double>(count) : 0.0;
    };
    std::vector<double> waits;
    std::vector<std::int64_t> blocked;
    for (int w = 0; w < totals.workers; ++w) {
      waits.push_back(static_cast<double>(totals.wait_us(w)) * 1e-6);
      blocked.push_back(totals.blocked(w));
    }
    const double steps = static_cast<double>(std::max<std::int64_t>(1, steps_.plan.total_steps));
    nlohmann::json extra = {
        // Steps, the unit of --staleness: how far ahead of the slowest
        // running worker a worker was when it began a step.
        // ASP workers never ask to begin a step: not measured (null).
        {"staleness_steps_mean", steps_measured
                                     ? nlohmann::json(mean(totals.steps_ahead(PsTotals::kSum),
                                                           totals.steps_ahead(PsTotals::kCount)))
                                     : nlohmann::json()},
        {"staleness_steps_max",
         steps_measured ? nlohmann::json(totals.steps_ahead(PsTotals::kMax)) : nlohmann::json()},
        // Pushes: how many pushes reached a shard between a worker's pull
        // and its own push's arrival (W per step when all run together).
        {"staleness_pushes_mean", mean(lag_sum, lag_count)},
        {"staleness_pushes_max", lag_max},
        {"applied_pushes", lag_count},
        {"wait_s_per_worker", waits},
        {"blocked_per_worker", blocked},
        {"slowdown", config_.slowdown},
        {"bytes_per_push", bytes_pushed_ / steps},
        {"bytes_per_pull", bytes_pulled_ / steps},
        {"bytes_per_step_to_workers", bytes_to_workers_ / steps},
        {"server_logs", "server<i>.jsonl"}};
    extra.update(phase_times);
    finish_run(plan_, info_, wall_s, extra);
  }

  Communicator& comm_;
  RunPlan& plan_;
  const TrainConfig& config_;
  ServerLayout layout_;
  std::unique_ptr<FlatModel> flat_;
  PsOptions options_;
  std::unique_ptr<PsWorker> worker_;
  TrainerSteps steps_;
  Straggler straggler_;
  EvalSnapshots snapshots_;
  std::unique_ptr<FlatModel> eval_replica_;           // rank 0, evaluating during training
  std::unique_ptr<BackgroundEvaluation> background_;  // after eval_replica_: uses it
  TrainLossSum train_loss_;
  double bytes_pushed_ = 0.0;
  double bytes_pulled_ = 0.0;
  double bytes_to_workers_ = 0.0;
  WorkerPhaseTimes phase_times_;  // this worker's, one per step trained
  nlohmann::json fingerprint_;
  Stopwatch clock_;
  double wall_offset_ = 0.0;  // a resumed run's wall time at its checkpoint
  RunInfo info_;
};

}  // namespace

PsOptions ps_options(const RunPlan& plan, const std::vector<LayerSpan>& layers) {
  const TrainConfig& c = plan.config;
  PsOptions options;
  options.model = parse_sync_model(sync_model_name(c));
  options.push = c.method;
  options.scheme_options = SchemeOptions(plan.method_options);
  // Momentum correction on the workers (DGC's default) replaces the
  // servers' momentum.
  options.optimizer =
      optimizer_options(c, scheme_applies_momentum(c.method, options.scheme_options));
  options.layers = layers;
  return options;
}

void train_ps_rank(Communicator& comm, RunPlan& plan, const ServerLayout& layout) {
  if (layout.is_server_rank(comm.rank())) {
    run_ps_server(comm, plan, layout);
  } else {
    PsRankWorker worker(comm, plan, layout);
    worker.run();
  }
}

}  // namespace sparsecomm
