// The click model's training loop (model dlrm on the click log): one rank's
// steps, its held-out evaluation and its figures. docs/algorithms.md, "The
// click model", says what each step does and why.
//
// One step on every rank: the rank's rows of the log -> forward/backward ->
// (a) the MLPs' gradient synchronized by DataParallel with the configured
// method (dense, ExDyna, Top-k, ...) and applied by FlatSgd; (b) the tables'
// gradient coalesced into touched rows, summed over ranks without
// densifying (collectives/row_exchange.h) or, for comparison, densified and
// ring all-reduced, and applied lazily to the touched rows (RowAdagrad or
// RowSgd). With --embedding-exchange sharded the tables are split over the
// ranks instead of replicated: each rank pulls its batch's rows from their
// owners before the forward pass and pushes its gradient rows to them
// after backward; each owner updates its own rows. Evaluation: held-out
// log-loss, AUC and accuracy at 0.5, each rank a slice of the held-out rows.
// The tables' exchange is in click_exchange.h, the evaluation's figures in
// click_evaluation.h, the run's totals and the tables' fingerprint in
// click_totals.h.

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/row_exchange.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/data/click_log.h"
#include "sparsecomm/optim/row_optimizer.h"
#include "sparsecomm/train/checkpoint.h"
#include "sparsecomm/train/click_evaluation.h"
#include "sparsecomm/train/click_exchange.h"
#include "sparsecomm/train/click_model.h"
#include "sparsecomm/train/click_totals.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/evaluation.h"
#include "sparsecomm/train/run_plan.h"
#include "sparsecomm/train/worker_phase_times.h"

namespace sparsecomm {
namespace {

// Evaluation reads the held-out rows in chunks of this many.
constexpr std::size_t kEvalChunk = 8192;

class ClickTrainer {
 public:
  ClickTrainer(Communicator& comm, RunPlan& plan)
      : comm_(comm),
        plan_(plan),
        config_(plan.config),
        log_(click_log_options(config_)),
        steps_(plan_steps(config_, static_cast<std::int64_t>(log_.options().rows), comm.size(),
                          "rank")),
        lr_(steps_.lr),
        straggler_(config_, comm.rank(), comm.size(), plan.threads) {
    {
      // LibTorch's generator is process-wide: one model at a time, so every
      // replica draws the same MLP weights.
      std::lock_guard lock(model_build_mutex());
      torch::manual_seed(config_.seed);
      ClickModelShape shape;
      shape.cardinalities = log_.options().cardinalities;
      shape.dense_features = log_.options().dense_features;
      shape.width = static_cast<std::size_t>(config_.embedding_dim);
      model_ = std::make_shared<ClickModel>(shape);
    }
    if (sharded_) {
      const std::size_t rows = model_->layout().rows();
      tables_ = std::make_unique<EmbeddingTables>(
          model_->layout(), config_.seed, row_owner_begin(rows, comm.size(), comm.rank()),
          row_owner_begin(rows, comm.size(), comm.rank() + 1));
    } else {
      tables_ = std::make_unique<EmbeddingTables>(model_->layout(), config_.seed);
    }
    exchange_ = std::make_unique<EmbeddingExchange>(comm_, config_, *tables_);
    ddp_ = make_data_parallel(*model_, comm_, plan);
    update_ = make_update_rule(config_, ddp_->sync(),
                               hidden_matrices(*model_, ddp_->layers(), /*tied_output=*/false));
    if (config_.embedding_optimizer == "adagrad") {
      adagrad_ = std::make_unique<RowAdagrad>(RowAdagradOptions{});
    } else {
      row_sgd_ = std::make_unique<RowSgd>(RowSgdOptions{});
    }
    fingerprint_ = fingerprint(plan_, comm_.size(), ddp_->numel());
  }

  void run() {
    const TableLayout& tables = model_->layout();
    std::int64_t step = 0;
    if (plan_.resume_step) {
      step = *plan_.resume_step;
      wall_offset_ = load_checkpoint(step);
    }
    if (comm_.rank() == 0) {
      held_out_ = log_.statistics(log_.options().rows, log_.options().held_out_rows);
      info_ = run_info(plan_, comm_.size(), ddp_->numel(), steps_, step);
      info_.embedding_numel = tables.numel();
      info_.buckets = ddp_->buckets().size();
      info_.pipelining = ddp_->pipelined()
                             ? fmt::format("the MLPs pipelined: {} buckets", info_.buckets)
                             : "not pipelined";
      start_run(plan_, info_);
    }
    clock_ = Stopwatch();
    model_->train();
    const std::optional<StopRecord> stopped =
        run_steps(comm_, config_, steps_, step,
                  {.train = [this](std::int64_t at) { train_step(at); },
                   .evaluate = [this](std::int64_t done) { evaluate(done); },
                   .checkpoint = [this](std::int64_t done) { save_checkpoint(done); },
                   .may_stop_after = [](std::int64_t) { return true; }});
    const double wall_s = wall();
    nlohmann::json extra = phase_times_.gather(comm_);
    if (stopped) record_stop(plan_, *stopped, extra);
    const TableFingerprint fingerprint = fingerprint_tables(comm_, *tables_, sharded_);
    if (comm_.rank() != 0) return;
    extra["click_log"] = {{"rows", log_.options().rows},
                          {"held_out_rows", log_.options().held_out_rows},
                          {"click_rate", held_out_.click_rate},
                          {"base_entropy", held_out_.base_entropy},
                          {"floor_logloss", held_out_.floor_logloss}};
    extra["embedding"] = embedding_summary(tables, config_, comm_.size(), tables_->values().size(),
                                           totals_, fingerprint);
    extra["peak_resident_bytes"] = peak_resident_bytes();
    if (last_eval_) {
      extra["final_logloss_above_floor"] = last_eval_->test_loss - held_out_.floor_logloss;
      extra["final_test_auc"] = last_eval_->test_auc;
      // Where the gap to the floor comes from: held-out lookups of rows that
      // training updated rarely or never.
      if (!last_lookups_by_updates_.is_null()) {
        extra["held_out_lookups_by_row_updates"] = last_lookups_by_updates_;
      }
    }
    finish_run(plan_, info_, wall_s, extra);
  }

 private:
  double wall() const { return wall_offset_ + clock_.seconds(); }

  // Everything that defines the run's future, this rank's part: the MLPs
  // and their synchronization and update state, the stored table rows and
  // their optimizer's state, the rows' update counts, the exchange choice's
  // last figures, and (rank 0) the summary's running totals.
  void save_checkpoint(std::int64_t done) {
    save_rank_checkpoint(comm_, plan_.run_dir, done, fingerprint_, wall(), [&](StateWriter& state) {
      save_replica(state, *ddp_, *update_);
      state.tag("click");
      state.array<float>(tables_->values());
      if (adagrad_) {
        adagrad_->save(state);
      } else {
        row_sgd_->save(state);
      }
      state.array<std::uint16_t>(row_updates_);
      state.value<std::uint8_t>(rows_updated_ ? 1 : 0);
      exchange_->save(state);
      train_loss_.save(state);
      state.string(totals_.to_json().dump());
    });
  }

  // Restores what save_checkpoint() wrote; returns the run's wall time then.
  double load_checkpoint(std::int64_t done) {
    return load_rank_checkpoint(plan_.run_dir, done, comm_.rank(), fingerprint_,
                                [&](StateReader& state) {
                                  load_replica(state, *ddp_, *update_);
                                  state.expect_tag("click");
                                  state.array_into<float>(tables_->values());
                                  if (adagrad_) {
                                    adagrad_->load(state);
                                  } else {
                                    row_sgd_->load(state);
                                  }
                                  row_updates_ = state.array<std::uint16_t>();
                                  rows_updated_ = state.value<std::uint8_t>() != 0;
                                  exchange_->load(state);
                                  train_loss_.load(state);
                                  totals_.from_json(nlohmann::json::parse(state.string()));
                                });
  }

  static ClickLogOptions click_log_options(const TrainConfig& config) {
    ClickLogOptions options;  // the log's own seed: the data does not change with --seed
    options.cardinalities = criteo_cardinalities(static_cast<std::size_t>(config.embedding_cap));
    if (config.train_samples > 0) options.rows = static_cast<std::uint64_t>(config.train_samples);
    if (config.test_samples > 0) {
      options.held_out_rows = static_cast<std::uint64_t>(config.test_samples);
    }
    return options;
  }

  void train_step(std::int64_t step) {
    TrainStep record;
    record.step = step;
    record.lr = lr_.at(step);

    Stopwatch compute;
    straggler_.begin_compute(step);
    // An epoch reads the training rows in order: rank r of n takes rows
    // [(i n + r) B, (i n + r + 1) B) at the epoch's step i (the log's rows
    // are independent draws, so no shuffle is needed).
    const std::int64_t in_epoch = step % steps_.steps_per_epoch;
    const auto batch = static_cast<std::uint64_t>(config_.batch);
    log_.read((static_cast<std::uint64_t>(in_epoch) * comm_.size() + comm_.rank()) * batch,
              static_cast<std::size_t>(batch), batch_);
    // Sharded tables: the batch's rows come from their owners first (an
    // exchange, not compute).
    const double pull_s = sharded_ ? exchange_->pull_batch_rows(batch_, record.embedding) : 0.0;
    ddp_->zero_grad();
    const torch::Tensor labels =
        torch::from_blob(batch_.labels.data(), {static_cast<std::int64_t>(batch_.rows)});
    const PulledRows pulled(exchange_->pulled());
    const RowReader& rows = sharded_ ? static_cast<const RowReader&>(pulled) : *tables_;
    const torch::Tensor loss =
        torch::binary_cross_entropy_with_logits(model_->forward(batch_, rows), labels);
    loss.backward();
    record.loss = loss.item<double>();
    model_->table_gradient(exchange_->gradient());
    straggler_.end_compute();
    record.compute_s = compute.seconds() - pull_s;

    record.sync = ddp_->synchronize(steps_.epoch_at(step));
    record.selection_s = record.sync.accumulate_s + record.sync.selection_s;
    exchange_->exchange(record.embedding);
    record.exchange_s = record.sync.exchange_s + record.embedding.exchange_s;
    phase_times_.add_step(record.compute_s, record.exchange_s);

    // The same answer on every rank (sharded tables agreed in the exchange),
    // so all agree on skipping without a message.
    const bool tables_finite = exchange_->sum_finite();
    if (!tables_finite && parse_nonfinite_policy(config_.nonfinite) == NonFinitePolicy::kStop) {
      throw NonFiniteGradient(fmt::format(
          "[train] rank {}: step {}: the embedding tables' summed gradient holds NaN or inf; "
          "lower --embedding-lr or --lr, or pass --nonfinite skip",
          comm_.rank(), step));
    }
    if (!record.sync.skipped_nonfinite && tables_finite) {
      train_loss_.add(record.loss);
      Stopwatch update;
      update_->apply(ddp_->parameters(), ddp_->gradients(), record.lr);
      record.update_s = update.seconds();
      update.restart();
      const double table_lr = config_.embedding_lr * record.lr / config_.lr;
      const double mean = 1.0 / comm_.size();
      if (adagrad_) {
        adagrad_->step(tables_->values(), exchange_->stored_sum(), table_lr, mean);
      } else {
        row_sgd_->step(tables_->values(), exchange_->stored_sum(), table_lr, mean);
      }
      record.embedding.update_s = update.seconds();
      record.update_s += record.embedding.update_s;
    }
    if (config_.embedding_exchange == "dense") {
      exchange_->restore_dense_buffers();
    } else if (!record.sync.skipped_nonfinite && tables_finite) {
      row_updates_.resize(tables_->last() - tables_->first(), 0);
      rows_updated_ = true;
      for (const Index row : exchange_->stored_sum().ids) {
        if (row_updates_[row] < std::numeric_limits<std::uint16_t>::max()) ++row_updates_[row];
      }
    }

    if (comm_.rank() == 0) {
      totals_.add(record.embedding);
      record.epoch = steps_.epoch_at(step + 1);
      record.wall_s = wall();
      plan_.writer->write_step(record);
      if (plan_.observer) plan_.observer->on_step(record);
    }
  }

  // Held-out log-loss, AUC and accuracy at 0.5 over every held-out row, each
  // rank a slice; integer sums keep the result the same on every backend.
  void evaluate(std::int64_t done) {
    const std::uint64_t first = log_.options().rows;
    const std::uint64_t count = log_.options().held_out_rows;
    const int n = comm_.size();
    const std::uint64_t begin = count * static_cast<std::uint64_t>(comm_.rank()) / n;
    const std::uint64_t end = count * static_cast<std::uint64_t>(comm_.rank() + 1) / n;
    ClickEvalSums sums;
    {
      const torch::NoGradGuard no_grad;
      model_->eval();
      // Sharded tables pull every chunk's rows, a collective: every rank
      // takes as many chunks as the largest slice needs (the last ones
      // maybe empty).
      const std::uint64_t largest = (count + n - 1) / n;
      const std::uint64_t chunks = (largest + kEvalChunk - 1) / kEvalChunk;
      for (std::uint64_t c = 0; c < chunks; ++c) {
        const std::uint64_t at = std::min(end, begin + c * kEvalChunk);
        const auto rows = static_cast<std::size_t>(std::min<std::uint64_t>(kEvalChunk, end - at));
        log_.read(first + at, rows, eval_batch_);
        if (sharded_) {
          EmbeddingStep ignored;
          exchange_->pull_batch_rows(eval_batch_, ignored);
        }
        if (rows == 0) {
          if (sharded_ && rows_updated_) count_eval_lookups(sums);
          continue;
        }
        const PulledRows pulled(exchange_->pulled());
        const RowReader& reader = sharded_ ? static_cast<const RowReader&>(pulled) : *tables_;
        const torch::Tensor logits = model_->forward(eval_batch_, reader).contiguous();
        const float* z = logits.data_ptr<float>();
        for (std::size_t j = 0; j < rows; ++j) {
          sums.add_prediction(z[j], eval_batch_.labels[j] > 0.5f);
        }
        if (rows_updated_) count_eval_lookups(sums);
      }
      model_->train();
    }
    allreduce(comm_, sums.finish(train_loss_.sum, train_loss_.count));
    const EvalPoint point{done, steps_.epoch_at(done), wall(), 0.0, 0};
    train_loss_.clear();
    if (comm_.rank() != 0) return;
    const TrainEval eval = sums.eval(point, static_cast<std::int64_t>(count));
    nlohmann::json lookups_by_updates = sums.lookups_by_updates();
    if (!lookups_by_updates.is_null()) last_lookups_by_updates_ = std::move(lookups_by_updates);
    plan_.writer->write_eval(eval);
    if (plan_.observer) plan_.observer->on_eval(eval);
    last_eval_ = eval;
  }

  // The last forward's held-out lookups into `sums`; a collective for
  // sharded tables (count_lookups_by_updates), an empty chunk included.
  void count_eval_lookups(ClickEvalSums& sums) {
    const std::span<const Index> lookups =
        eval_batch_.rows > 0 ? model_->lookups() : std::span<const Index>{};
    count_lookups_by_updates(comm_, lookups, *tables_, row_updates_, sharded_, sums);
  }

  Communicator& comm_;
  RunPlan& plan_;
  const TrainConfig& config_;
  ClickLog log_;
  StepPlan steps_;
  LrSchedule lr_;
  Straggler straggler_;
  // Split over the ranks (--embedding-exchange sharded) or replicated.
  const bool sharded_ = config_.embedding_exchange == "sharded";
  std::shared_ptr<ClickModel> model_;
  std::unique_ptr<EmbeddingTables> tables_;      // the rows this rank stores
  std::unique_ptr<EmbeddingExchange> exchange_;  // of tables_ (after it)
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<UpdateRule> update_;  // compress gradient only (validate)
  std::unique_ptr<RowAdagrad> adagrad_;
  std::unique_ptr<RowSgd> row_sgd_;
  ClickBatch batch_;
  ClickBatch eval_batch_;
  WorkerPhaseTimes phase_times_;
  TrainLossSum train_loss_;
  nlohmann::json fingerprint_;
  Stopwatch clock_;
  double wall_offset_ = 0.0;  // a resumed run's wall time at its checkpoint
  RunInfo info_;
  ClickLogStatistics held_out_;  // rank 0
  std::optional<TrainEval> last_eval_;
  // Steps that updated each row (saturating; row-sparse exchanges only):
  // how well trained the rows of the held-out lookups are.
  std::vector<std::uint16_t> row_updates_;  // the stored rows'
  bool rows_updated_ = false;               // row_updates_ counts (the same on every rank)
  nlohmann::json last_lookups_by_updates_;  // rank 0, at the last evaluation
  ClickTotals totals_;                      // rank 0's steps (carried through checkpoints)
};

}  // namespace

void train_click_rank(Communicator& comm, RunPlan& plan) {
  ClickTrainer trainer(comm, plan);
  trainer.run();
}

}  // namespace sparsecomm
