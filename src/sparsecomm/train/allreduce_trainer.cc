// All-reduce data parallelism: one rank's training loop (DataParallel's
// synchronization + UpdateRule), evaluation, checkpoints and resume.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timeline.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/optim/outer_loop.h"
#include "sparsecomm/traces/gradient_stream.h"
#include "sparsecomm/train/checkpoint.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/evaluation.h"
#include "sparsecomm/train/overlapped_exchange.h"
#include "sparsecomm/train/run_plan.h"
#include "sparsecomm/train/worker_phase_times.h"

namespace sparsecomm {
namespace {

class RankTrainer {
 public:
  RankTrainer(Communicator& comm, RunPlan& plan)
      : comm_(comm),
        plan_(plan),
        config_(plan.config),
        steps_(plan, comm.rank(), comm.size(), "rank"),
        straggler_(plan.config, comm.rank(), comm.size(), plan.threads) {
    model_ = make_seeded_model(config_);
    ddp_ = make_data_parallel(*model_, comm_, plan);
    update_ = make_update_rule(
        config_, ddp_->sync(),
        hidden_matrices(*model_, ddp_->layers(), model_->ties_output_to_embedding()));
    if (config_.local_steps > 0) {
      outer_ = std::make_unique<OuterLoop>(
          OuterOptions{config_.local_steps, config_.outer_lr, config_.outer_momentum,
                       config_.outer_nesterov, config_.outer_overlap},
          ddp_->parameters());
      if (config_.outer_overlap) overlapped_ = std::make_unique<OverlappedExchange>(*ddp_);
    }

    fingerprint_ = fingerprint(plan_, comm_.size(), ddp_->numel());
  }

  void run() {
    std::int64_t step = 0;
    double wall_offset = 0.0;
    if (plan_.resume_step) {
      step = *plan_.resume_step;
      wall_offset = load_checkpoint(step);
    }
    first_step_ = step;
    if (comm_.rank() == 0) {
      info_ = run_info(plan_, comm_.size(), ddp_->numel(), steps_.plan, step);
      info_.buckets = ddp_->buckets().size();
      if (ddp_->pipelined()) {
        info_.pipelining =
            fmt::format("pipelined: {} buckets of >= {} MiB", info_.buckets, config_.bucket_mb);
      } else if (outer_) {
        info_.pipelining = fmt::format("local steps: rounds of {}", config_.local_steps);
      } else if (config_.bucket_mb > 0) {
        info_.pipelining = fmt::format(
            "not pipelined: {} selects over the whole gradient, so it runs after backward",
            config_.method);
      } else {
        info_.pipelining = "not pipelined (--bucket-mb 0)";
      }
      start_run(plan_, info_);
    }
    open_trace();
    clock_ = Stopwatch();
    wall_offset_ = wall_offset;
    model_->train();
    const std::optional<StopRecord> stopped =
        run_steps(comm_, config_, steps_.plan, step,
                  {.train = [this](std::int64_t at) { train_step(at); },
                   .evaluate = [this](std::int64_t done) { evaluate(done); },
                   .checkpoint = [this](std::int64_t done) { save_checkpoint(done); },
                   .may_stop_after = [this](std::int64_t at) { return can_stop_after(at); }});
    if (overlapped_) overlapped_->settle();  // stopped early: the checkpoint waited already
    const double wall_s = wall();
    evaluate_snapshots();
    nlohmann::json extra = phase_times_.gather(comm_);
    if (stopped) record_stop(plan_, *stopped, extra);
    if (comm_.rank() == 0) finish_run(plan_, info_, wall_s, extra);
  }

 private:
  // Training wall time: evaluations of snapshots are off the clock.
  double wall() const { return wall_offset_ + clock_.seconds() - off_clock_s_; }
  void train_step(std::int64_t step) {
    TrainStep record;
    record.step = step;
    record.lr = steps_.lr.at(step);

    TimedSpan compute("compute", "compute");
    straggler_.begin_compute(step);
    const EpochBatches::Batch batch = steps_.batches.at(step);
    ddp_->zero_grad();
    TimedSpan forward("forward", "compute");
    const torch::Tensor loss = model_->score(batch.inputs, batch.labels).losses.mean();
    forward.stop();
    TimedSpan backward("backward", "compute");
    loss.backward();
    backward.stop();
    record.loss = loss.item<double>();
    straggler_.end_compute();
    record.compute_s = compute.stop();

    if (trace_ && step - first_step_ < config_.record_steps) {
      trace_->append(comm_.rank(), ddp_->gradients());
    }

    if (outer_) {
      local_step(step, record);
    } else {
      synchronized_step(step, record);
    }
    phase_times_.add_step(record.compute_s, record.exchange_s);
    if (record.synchronized) {
      timeline_counter("bytes sent", static_cast<double>(record.sync.bytes_sent));
      timeline_counter("K/k", record.sync.density_ratio);
      timeline_counter("residual norm", record.sync.residual_norm);
    }

    if (comm_.rank() == 0) {
      record.epoch = steps_.plan.epoch_at(step + 1);
      record.wall_s = wall();
      plan_.writer->write_step(record);
      if (plan_.observer) plan_.observer->on_step(record);
    }
  }

  // The method synchronizes this step's gradient; the optimizer applies it.
  void synchronized_step(std::int64_t step, TrainStep& record) {
    // --compress update: this rank's AdamW direction, counted as update time.
    TimedSpan local_update("update direction", "update");
    update_->before_sync(ddp_->gradients());
    const double local_update_s = local_update.stop();
    TimedSpan synchronize("synchronize", "step");
    record.sync = ddp_->synchronize(steps_.plan.epoch_at(step));
    synchronize.stop();
    record.selection_s = record.sync.accumulate_s + record.sync.selection_s;
    record.exchange_s = record.sync.exchange_s;

    // A skipped step (--nonfinite skip: some rank's gradient was not
    // finite) changes nothing: no update (momentum and weight decay would
    // move the parameters), and its loss is not averaged into train_loss.
    if (!record.sync.skipped_nonfinite) {
      train_loss_.add(record.loss);
      TimedSpan update("update", "update");
      update_->apply(ddp_->parameters(), ddp_->gradients(), record.lr);
      record.update_s = local_update_s + update.stop();
    }
  }

  // --local-steps: this rank's gradient moves its own parameters; the round's
  // last step (or the run's) synchronizes the pseudo-gradient through the
  // method and takes the outer step. A gradient that is not finite is not
  // applied: the round's pseudo-gradient carries that to the method's policy.
  void local_step(std::int64_t step, TrainStep& record) {
    const std::span<float> gradient = ddp_->gradients();
    TimedSpan update("update", "update");
    if (std::all_of(gradient.begin(), gradient.end(), [](float v) { return std::isfinite(v); })) {
      update_->apply(ddp_->parameters(), gradient, record.lr);
      train_loss_.add(record.loss);
    } else {
      outer_->mark_nonfinite();
    }
    record.update_s = update.stop();
    if (!closes_round(step)) {
      record.synchronized = false;
      return;
    }
    if (overlapped_) {
      overlapped_round_end(step, record);
      return;
    }
    outer_->pseudo_gradient(ddp_->parameters(), gradient);
    TimedSpan synchronize("synchronize", "step");
    record.sync = ddp_->synchronize(steps_.plan.epoch_at(step));
    synchronize.stop();
    record.selection_s = record.sync.accumulate_s + record.sync.selection_s;
    record.exchange_s = record.sync.exchange_s;
    TimedSpan outer_step("outer step", "update");
    outer_->finish_round(ddp_->parameters(), gradient, record.sync.skipped_nonfinite);
    record.update_s += outer_step.stop();
  }

  // --outer-overlap: the previous round's mean (exchanged while this round
  // ran) lands first, then this round's drift leaves on the exchange's
  // thread; the run's last round exchanges its own at once, so that the
  // ranks end on the anchor. The step reports the exchange that arrived
  // (the first round's end has none: not synchronized), its selection and
  // exchange times as for pipelining: what they took, and as overlapped
  // what this rank did not wait for.
  void overlapped_round_end(std::int64_t step, TrainStep& record) {
    const std::span<float> parameters = ddp_->parameters();
    const Stopwatch round_end;
    record.synchronized = overlapped_->pending();
    double waited_s = 0.0;
    if (overlapped_->pending()) {
      const Stopwatch wait;
      record.sync = overlapped_->take();
      waited_s = wait.seconds();
      outer_->apply_delayed(parameters, overlapped_->values(), record.sync.skipped_nonfinite);
    }
    const double hidden_s = std::max(0.0, record.sync.accumulate_s + record.sync.selection_s +
                                              record.sync.exchange_s - waited_s);
    outer_->begin_overlapped(parameters, overlapped_->values());
    double last_s = 0.0;
    if (step + 1 == steps_.plan.total_steps) {
      const StepMetrics last = ddp_->synchronize(overlapped_->values(), steps_.plan.epoch_at(step));
      outer_->finish_round(parameters, overlapped_->values(), last.skipped_nonfinite);
      last_s = last.accumulate_s + last.selection_s + last.exchange_s;
      const StepMetrics arrived = record.sync;
      record.sync = last;
      if (record.synchronized) {
        record.sync.accumulate_s += arrived.accumulate_s;
        record.sync.selection_s += arrived.selection_s;
        record.sync.exchange_s += arrived.exchange_s;
        record.sync.bytes_sent += arrived.bytes_sent;
        record.sync.bytes_received += arrived.bytes_received;
      }
      record.synchronized = true;
    } else {
      overlapped_->start(steps_.plan.epoch_at(step));
    }
    record.sync.overlapped_s = hidden_s;
    record.selection_s = record.sync.accumulate_s + record.sync.selection_s;
    record.exchange_s = record.sync.exchange_s;
    record.update_s += std::max(0.0, round_end.seconds() - waited_s - last_s);
  }

  // Whether the ranks may stop after step `step` on a request
  // (stop_request.h): after any step, but with --local-steps only where a
  // round closes, so that waiting for a stop adds no round trip to the steps
  // that do not communicate.
  bool can_stop_after(std::int64_t step) const { return !outer_ || closes_round(step); }

  // Whether step `step` ends a round of local steps (the run's last step
  // always does, so the run ends synchronized).
  bool closes_round(std::int64_t step) const {
    return outer_->ends_round(step) || step + 1 == steps_.plan.total_steps;
  }

  // An evaluation point: the test set now, or (eval_deferred) a snapshot
  // evaluated after training. Every rank takes part. Inside a round of local
  // steps it reads the anchor (the parameters all ranks last agreed on).
  // With --outer-overlap the ranks agree only on the anchor (which lags a
  // round), so every evaluation before the run's end reads it, after the
  // exchange in flight has arrived (the evaluation uses the communicator).
  void evaluate(std::int64_t done) {
    if (overlapped_) overlapped_->settle();
    const bool mid_round =
        outer_ && (!closes_round(done - 1) || (overlapped_ && done < steps_.plan.total_steps));
    if (mid_round) {
      own_parameters_.assign(ddp_->parameters().begin(), ddp_->parameters().end());
      std::copy(outer_->anchor().begin(), outer_->anchor().end(), ddp_->parameters().begin());
    }
    evaluate_point(done);
    if (mid_round)
      std::copy(own_parameters_.begin(), own_parameters_.end(), ddp_->parameters().begin());
  }

  void evaluate_point(std::int64_t done) {
    ddp_->broadcast_buffers(0);
    const EvalPoint point{done, steps_.plan.epoch_at(done), wall(), train_loss_.sum,
                          train_loss_.count};
    train_loss_.clear();
    if (config_.eval_deferred) {
      snapshots_.take(point, ddp_->parameters(), *model_);
    } else {
      evaluate_now(point);
    }
  }

  // Test accuracy over the whole test set, each rank evaluating a slice
  // with rank 0's BatchNorm statistics; the training loss is the mean over
  // all ranks' steps since the previous point.
  void evaluate_now(const EvalPoint& point) {
    const TensorSplit& test = plan_.data->test;
    const std::int64_t n = test.count();
    const EvalCounts mine = evaluate_range(*model_, test, n * comm_.rank() / comm_.size(),
                                           n * (comm_.rank() + 1) / comm_.size());
    // Fixed-point sums keep the result identical on every backend. A loss
    // that is not finite, or too large for the fixed point, is counted
    // instead of summed (no overflow), and makes the reported loss NaN.
    std::int64_t unrepresentable = 0;
    const auto fixed_point = [&](double value) -> std::int64_t {
      constexpr double kLimit = 9.0e12;  // x 1e6 stays below 2^63 / 1024 ranks
      if (std::isfinite(value) && std::abs(value) < kLimit) return std::llround(value * 1e6);
      ++unrepresentable;
      return 0;
    };
    const std::int64_t test_loss = fixed_point(mine.loss_sum);
    const std::int64_t test_unrepresentable = unrepresentable;
    const std::int64_t train_loss = fixed_point(point.train_loss_sum);
    std::vector<std::int64_t> sums = {mine.correct,         test_loss,
                                      train_loss,           point.train_loss_count,
                                      test_unrepresentable, unrepresentable - test_unrepresentable};
    allreduce(comm_, std::span<std::int64_t>(sums));
    if (comm_.rank() != 0) return;
    const double nan = std::nan("");
    TrainEval eval = make_train_eval(
        point, n, {sums[0], sums[4] > 0 ? nan : static_cast<double>(sums[1]) * 1e-6},
        sums[5] > 0 ? nan : static_cast<double>(sums[2]) * 1e-6, sums[3]);
    eval.deferred = config_.eval_deferred;
    plan_.writer->write_eval(eval);
    if (plan_.observer) plan_.observer->on_eval(eval);
  }

  // Evaluates the snapshots taken so far (off the training clock).
  void evaluate_snapshots() {
    if (overlapped_) overlapped_->settle();
    const Stopwatch watch;
    snapshots_.replay(*model_, ddp_->parameters(),
                      [&](const EvalPoint& point) { evaluate_now(point); });
    off_clock_s_ += watch.seconds();
  }

  void save_checkpoint(std::int64_t done) {
    if (overlapped_) overlapped_->settle();  // the exchange's residuals are part of the state
    evaluate_snapshots();                    // a checkpoint leaves no evaluation pending
    save_rank_checkpoint(comm_, plan_.run_dir, done, fingerprint_, wall(), [&](StateWriter& state) {
      save_replica(state, *ddp_, *update_);
      if (outer_) outer_->save(state);
      if (overlapped_) overlapped_->save(state);
      train_loss_.save(state);
    });
  }

  // Restores everything that defines the run's future; returns its wall time.
  double load_checkpoint(std::int64_t done) {
    return load_rank_checkpoint(plan_.run_dir, done, comm_.rank(), fingerprint_,
                                [&](StateReader& state) {
                                  load_replica(state, *ddp_, *update_);
                                  if (outer_) outer_->load(state);
                                  if (overlapped_) overlapped_->load(state);
                                  train_loss_.load(state);
                                });
  }

  void open_trace() {
    if (config_.record_gradients.empty()) return;
    const std::vector<LayerSpan> layers(ddp_->layers().begin(), ddp_->layers().end());
    const std::string source =
        fmt::format("sparsecomm train --model {} --method {}", config_.model, config_.method);
    if (comm_.rank() == 0) {
      own_trace_ =
          std::make_unique<TraceWriter>(config_.record_gradients, ddp_->numel(), comm_.size(),
                                        config_.record_steps, layers, source);
    }
    comm_.barrier();
    if (comm_.rank() != 0) {
      own_trace_ = std::make_unique<TraceWriter>(config_.record_gradients, ddp_->numel(),
                                                 comm_.size(), config_.record_steps, layers, source,
                                                 /*create_files=*/false);
    }
    trace_ = own_trace_.get();
  }

  Communicator& comm_;
  RunPlan& plan_;
  const TrainConfig& config_;
  std::shared_ptr<Model> model_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<UpdateRule> update_;
  std::unique_ptr<OuterLoop> outer_;   // --local-steps
  std::vector<float> own_parameters_;  // this rank's, while an evaluation reads the anchor
  // --outer-overlap; declared after ddp_ so that it is destroyed (its thread
  // joined) before the DataParallel it uses.
  std::unique_ptr<OverlappedExchange> overlapped_;
  nlohmann::json fingerprint_;
  std::int64_t first_step_ = 0;
  TrainerSteps steps_;
  Straggler straggler_;
  EvalSnapshots snapshots_;
  double off_clock_s_ = 0.0;  // spent evaluating snapshots
  TrainLossSum train_loss_;
  WorkerPhaseTimes phase_times_;  // this rank's, one per step trained
  TraceWriter* trace_ = nullptr;  // recording gradients, when asked
  std::unique_ptr<TraceWriter> own_trace_;
  Stopwatch clock_;
  double wall_offset_ = 0.0;
  RunInfo info_;
};

}  // namespace

void train_allreduce_rank(Communicator& comm, RunPlan& plan) {
  RankTrainer trainer(comm, plan);
  trainer.run();
}

}  // namespace sparsecomm
