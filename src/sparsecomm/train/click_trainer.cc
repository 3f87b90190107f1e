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

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/row_exchange.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/hash.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/data/click_log.h"
#include "sparsecomm/optim/row_optimizer.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/train/checkpoint.h"
#include "sparsecomm/train/click_model.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/evaluation.h"
#include "sparsecomm/train/run_plan.h"
#include "sparsecomm/train/worker_phase_times.h"

namespace sparsecomm {
namespace {

// Evaluation reads the held-out rows in chunks of this many.
constexpr std::size_t kEvalChunk = 8192;
// The AUC is computed from histograms of the predicted probability with
// this many equal bins per label (ties within a bin count half).
constexpr std::size_t kAucBins = 1 << 14;
// Held-out lookups are counted by how many steps updated their row before:
// [0], [1, 10), [10, 100), [100, ...).
constexpr std::array<std::uint32_t, 3> kUpdateBounds = {1, 10, 100};
constexpr std::size_t kUpdateBuckets = kUpdateBounds.size() + 1;

// The peak resident set of this process (VmHWM), in bytes; 0 if unknown.
std::uint64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      std::uint64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  return 0;
}

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
      info_.backend = std::string(backend_name(plan_.backend));
      info_.workers = comm_.size();
      info_.threads = plan_.threads;
      info_.numel = ddp_->numel();
      info_.embedding_numel = tables.numel();
      info_.steps_per_epoch = steps_.steps_per_epoch;
      info_.total_steps = steps_.total_steps;
      info_.first_step = step;
      info_.buckets = ddp_->buckets().size();
      info_.pipelining = ddp_->pipelined()
                             ? fmt::format("the MLPs pipelined: {} buckets", info_.buckets)
                             : "not pipelined";
      info_.run_dir = plan_.run_dir.string();
      if (plan_.observer) plan_.observer->on_start(info_);
    }
    clock_ = Stopwatch();
    model_->train();
    const std::int64_t end = config_.stop_at_step > 0
                                 ? std::min(steps_.total_steps, config_.stop_at_step)
                                 : steps_.total_steps;
    std::optional<StopRecord> stopped;
    for (; step < end; ++step) {
      train_step(step);
      const std::int64_t done = step + 1;
      if (evaluates_after(config_, steps_, done)) evaluate(done);
      const bool stop = done < end && ranks_agree_to_stop(comm_);
      if ((done == end && end < steps_.total_steps) || stop) {
        save_checkpoint(done);  // stopped early: resumable
      } else if (config_.checkpoint_every > 0 &&
                 (done % config_.checkpoint_every == 0 || done == steps_.total_steps)) {
        save_checkpoint(done);
      }
      if (stop) {
        stopped = StopRecord{done, steps_.total_steps};
        break;
      }
    }
    const double wall_s = wall();
    nlohmann::json extra = phase_times_.gather(comm_);
    if (stopped) record_stop(plan_, *stopped, extra);
    const TableFingerprint fingerprint = fingerprint_tables();
    if (comm_.rank() != 0) return;
    const double steps = static_cast<double>(std::max<std::int64_t>(1, totals_.steps));
    const int n = comm_.size();
    const double table_bytes = static_cast<double>(tables.numel() * sizeof(float));
    std::vector<double> table_touched;
    for (const double t : totals_.table_touched) table_touched.push_back(t / steps);
    extra["click_log"] = {{"rows", log_.options().rows},
                          {"held_out_rows", log_.options().held_out_rows},
                          {"click_rate", held_out_.click_rate},
                          {"base_entropy", held_out_.base_entropy},
                          {"floor_logloss", held_out_.floor_logloss}};
    extra["embedding"] = {{"tables", tables.tables()},
                          {"rows", tables.rows()},
                          {"width", tables.width()},
                          {"parameters", tables.numel()},
                          {"exchange", config_.embedding_exchange},
                          {"optimizer", config_.embedding_optimizer},
                          {"values", config_.embedding_values},
                          {"mean_touched_rows", totals_.touched / steps},
                          {"mean_table_touched_rows", table_touched},
                          {"mean_union_rows", totals_.union_rows / steps},
                          {"mean_bytes_sent", totals_.bytes_sent / steps},
                          {"mean_bytes_received", totals_.bytes_received / steps},
                          {"dense_allreduce_bytes", 2.0 * (n - 1) / n * table_bytes},
                          {"mean_exchange_s", totals_.exchange_s / steps},
                          {"mean_update_s", totals_.update_s / steps},
                          {"steps_by_exchange", totals_.by_exchange},
                          {"resident_parameters_per_rank", tables_->values().size()},
                          // The final tables: a hash of their bits and the sum of |values|,
                          // so that runs can be compared without storing 0.7 GB.
                          {"table_hash", fmt::format("{:016x}", fingerprint.hash)},
                          {"table_abs_sum", fingerprint.abs_sum}};
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
    StateWriter state;
    write_checkpoint_header(state, fingerprint_, done, wall());
    state.array<float>(ddp_->parameters());
    update_->save(state);
    ddp_->save(state);
    state.tag("click");
    state.array<float>(tables_->values());
    if (adagrad_) {
      adagrad_->save(state);
    } else {
      row_sgd_->save(state);
    }
    state.array<std::uint16_t>(row_updates_);
    state.value<std::uint8_t>(rows_updated_ ? 1 : 0);
    const std::vector<std::uint64_t> touched(last_.touched.begin(), last_.touched.end());
    state.array<std::uint64_t>(touched);
    state.value<std::uint64_t>(last_.union_rows);
    state.value<double>(train_loss_sum_);
    state.value<std::int64_t>(train_loss_count_);
    state.string(totals_.to_json().dump());
    store_checkpoint(comm_, plan_.run_dir, done, state.bytes(), fingerprint_);
  }

  // Restores what save_checkpoint() wrote; returns the run's wall time then.
  double load_checkpoint(std::int64_t done) {
    const std::vector<std::byte> bytes = read_rank_checkpoint(plan_.run_dir, done, comm_.rank());
    StateReader state(bytes);
    const double wall_s = read_checkpoint_header(state, fingerprint_, done, comm_.rank());
    state.array_into<float>(ddp_->parameters());
    update_->load(state);
    ddp_->load(state);
    state.expect_tag("click");
    state.array_into<float>(tables_->values());
    if (adagrad_) {
      adagrad_->load(state);
    } else {
      row_sgd_->load(state);
    }
    row_updates_ = state.array<std::uint16_t>();
    rows_updated_ = state.value<std::uint8_t>() != 0;
    const std::vector<std::uint64_t> touched = state.array<std::uint64_t>();
    last_.touched.assign(touched.begin(), touched.end());
    last_.union_rows = state.value<std::uint64_t>();
    train_loss_sum_ = state.value<double>();
    train_loss_count_ = state.value<std::int64_t>();
    totals_.from_json(nlohmann::json::parse(state.string()));
    if (!state.at_end()) throw Error("the checkpoint has trailing data: a different version?");
    return wall_s;
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
    const double pull_s = sharded_ ? pull_batch_rows(batch_, record.embedding) : 0.0;
    ddp_->zero_grad();
    const torch::Tensor labels =
        torch::from_blob(batch_.labels.data(), {static_cast<std::int64_t>(batch_.rows)});
    const PulledRows pulled(pulled_);
    const RowReader& rows = sharded_ ? static_cast<const RowReader&>(pulled) : *tables_;
    const torch::Tensor loss =
        torch::binary_cross_entropy_with_logits(model_->forward(batch_, rows), labels);
    loss.backward();
    record.loss = loss.item<double>();
    model_->table_gradient(mine_);
    straggler_.end_compute();
    record.compute_s = compute.seconds() - pull_s;

    record.sync = ddp_->synchronize(steps_.epoch_at(step));
    record.selection_s = record.sync.accumulate_s + record.sync.selection_s;
    exchange_tables(record.embedding);
    record.exchange_s = record.sync.exchange_s + record.embedding.exchange_s;
    phase_times_.add_step(record.compute_s, record.exchange_s);

    // Replicated tables: the sum is the same on every rank, so all agree on
    // skipping without a message; sharded ones agreed in exchange_tables.
    const bool tables_finite = sharded_ ? owned_finite_everywhere_ : all_finite(sum_.values);
    if (!tables_finite && parse_nonfinite_policy(config_.nonfinite) == NonFinitePolicy::kStop) {
      throw NonFiniteGradient(fmt::format(
          "[train] rank {}: step {}: the embedding tables' summed gradient holds NaN or inf; "
          "lower --embedding-lr or --lr, or pass --nonfinite skip",
          comm_.rank(), step));
    }
    if (!record.sync.skipped_nonfinite && tables_finite) {
      train_loss_sum_ += record.loss;
      train_loss_count_ += 1;
      Stopwatch update;
      update_->apply(ddp_->parameters(), ddp_->gradients(), record.lr);
      record.update_s = update.seconds();
      update.restart();
      const double table_lr = config_.embedding_lr * record.lr / config_.lr;
      const double mean = 1.0 / comm_.size();
      if (adagrad_) {
        adagrad_->step(tables_->values(), stored_sum(), table_lr, mean);
      } else {
        row_sgd_->step(tables_->values(), stored_sum(), table_lr, mean);
      }
      record.embedding.update_s = update.seconds();
      record.update_s += record.embedding.update_s;
    }
    if (config_.embedding_exchange == "dense") {
      restore_dense_buffers();
    } else if (!record.sync.skipped_nonfinite && tables_finite) {
      row_updates_.resize(tables_->last() - tables_->first(), 0);
      rows_updated_ = true;
      for (const Index row : stored_sum().ids) {
        if (row_updates_[row] < std::numeric_limits<std::uint16_t>::max()) ++row_updates_[row];
      }
    }

    if (comm_.rank() == 0) {
      tally(record.embedding);
      record.epoch = steps_.epoch_at(step + 1);
      record.wall_s = wall();
      plan_.writer->write_step(record);
      if (plan_.observer) plan_.observer->on_step(record);
    }
  }

  // The exchange of this step: the configured one, or under "auto" the
  // one that receives fewer rows by the last step's figures (identical on
  // every rank): the allgather (n - 1) m (m: the ranks' mean touched rows),
  // the row-sparse all-reduce about (n - 1) / n (m + U) (U: the union), so
  // the latter when U < (n - 1) m. The first step takes the allgather,
  // which also wins a tie (one phase instead of two).
  std::string choose_exchange() const {
    if (config_.embedding_exchange != "auto") return config_.embedding_exchange;
    // (sharded runs never ask: their tables are split, not replicated)
    if (last_.touched.empty()) return "allgather";
    const double mean_touched = static_cast<double>(std::accumulate(
                                    last_.touched.begin(), last_.touched.end(), std::size_t{0})) /
                                static_cast<double>(last_.touched.size());
    return static_cast<double>(last_.union_rows) < (comm_.size() - 1) * mean_touched
               ? "sparse-allreduce"
               : "allgather";
  }

  // Sharded tables: `wanted_` = the batch's rows (ascending), pulled_ =
  // those rows from their owners. Adds the pull's bytes and time to the
  // record; returns the time.
  double pull_batch_rows(const ClickBatch& batch, EmbeddingStep& record) {
    const Stopwatch watch;
    unique_lookups(batch, wanted_);
    const TableLayout& layout = model_->layout();
    RowExchangeReport report;
    pull_rows_from_owners(comm_, wanted_, tables_->values(), layout.rows(), layout.width(), pulled_,
                          &report, parse_value_encoding(config_.embedding_values));
    record.bytes_sent += report.bytes_sent;
    record.bytes_received += report.bytes_received;
    const double seconds = watch.seconds();
    record.exchange_s += seconds;
    return seconds;
  }

  // The batch's stacked row ids, ascending, each once.
  void unique_lookups(const ClickBatch& batch, UninitVector<Index>& ids) const {
    model_->layout().stack(batch, ids);
    std::sort(ids.begin(), ids.end());
    ids.resize(static_cast<std::size_t>(std::unique(ids.begin(), ids.end()) - ids.begin()));
  }

  // The summed table gradient of the rows this rank stores, ids relative
  // to tables_->first(): the whole sum for replicated tables, the owned
  // range's for sharded ones.
  const RowSparse& stored_sum() const { return sharded_ ? owned_ : sum_; }

  void exchange_tables(EmbeddingStep& record) {
    const TableLayout& tables = model_->layout();
    record.present = true;
    record.exchange = choose_exchange();
    record.touched_rows = mine_.touched();
    record.table_touched.assign(tables.tables(), 0);
    for (std::size_t j = 0, f = 0; j < mine_.ids.size(); ++j) {
      while (mine_.ids[j] >= tables.offset(f + 1)) ++f;
      ++record.table_touched[f];
    }
    const Stopwatch watch;
    if (record.exchange == "dense") {
      dense_allreduce(record);
    } else if (sharded_) {
      push_to_owners(record);
    } else {
      row_sparse_sum(comm_, mine_, parse_row_exchange(record.exchange), sum_, &last_,
                     parse_value_encoding(config_.embedding_values));
      record.union_rows = last_.union_rows;
      record.bytes_sent = last_.bytes_sent;
      record.bytes_received = last_.bytes_received;
    }
    record.exchange_s += watch.seconds();
  }

  // Sharded tables: this rank's gradient rows to their owners; owned_ gets
  // the sum of this rank's range (ids made relative to it). The ranks agree
  // on whether every owner's sum is finite, and learn the union's size, in
  // one small all-reduce.
  void push_to_owners(EmbeddingStep& record) {
    RowExchangeReport report;
    push_rows_to_owners(comm_, mine_, owned_, &report,
                        parse_value_encoding(config_.embedding_values));
    record.bytes_sent += report.bytes_sent;
    record.bytes_received += report.bytes_received;
    std::array<std::int64_t, 2> agree{all_finite(owned_.values) ? 0 : 1,
                                      static_cast<std::int64_t>(owned_.touched())};
    allreduce(comm_, std::span<std::int64_t>(agree));
    owned_finite_everywhere_ = agree[0] == 0;
    record.union_rows = static_cast<std::size_t>(agree[1]);
    const auto first = static_cast<Index>(tables_->first());
    for (Index& id : owned_.ids) id -= first;
    owned_.rows = tables_->last() - tables_->first();
  }

  // The comparison: the tables' whole gradient, densified and ring
  // all-reduced, applied to every row (with the same lazy optimizer, every
  // row is touched). sum_ borrows the dense buffers until
  // restore_dense_buffers().
  void dense_allreduce(EmbeddingStep& record) {
    const std::size_t width = mine_.width;
    dense_.assign(mine_.rows * width, 0.0f);
    for (std::size_t j = 0; j < mine_.touched(); ++j) {
      std::copy_n(mine_.values.data() + j * width, width, dense_.data() + mine_.ids[j] * width);
    }
    AllreduceReport report;
    allreduce(comm_, std::span<float>(dense_), {}, &report);
    if (every_row_.size() != mine_.rows) {
      every_row_.resize(mine_.rows);
      std::iota(every_row_.begin(), every_row_.end(), Index{0});
    }
    sum_.reset(mine_.rows, width);
    sum_.ids.swap(every_row_);
    sum_.values.swap(dense_);
    record.union_rows = mine_.rows;
    record.bytes_sent = report.bytes_sent;
    record.bytes_received = report.bytes_received;
  }
  void restore_dense_buffers() {
    sum_.ids.swap(every_row_);
    sum_.values.swap(dense_);
  }

  void tally(const EmbeddingStep& e) {
    totals_.steps += 1;
    totals_.touched += static_cast<double>(e.touched_rows);
    if (totals_.table_touched.size() != e.table_touched.size()) {
      totals_.table_touched.assign(e.table_touched.size(), 0.0);
    }
    for (std::size_t f = 0; f < e.table_touched.size(); ++f) {
      totals_.table_touched[f] += static_cast<double>(e.table_touched[f]);
    }
    totals_.union_rows += static_cast<double>(e.union_rows);
    totals_.bytes_sent += static_cast<double>(e.bytes_sent);
    totals_.bytes_received += static_cast<double>(e.bytes_received);
    totals_.exchange_s += e.exchange_s;
    totals_.update_s += e.update_s;
    totals_.by_exchange[e.exchange] = totals_.by_exchange.value(e.exchange, 0) + 1;
  }

  // Adds the last forward's lookups to sums[4 + bucket] by how many steps
  // updated their row. Replicated tables know every row's count; sharded
  // ones push the lookups' counts per row to the rows' owners (a
  // collective: every rank calls it, an empty chunk with no lookups).
  void count_lookups_by_updates(std::vector<std::int64_t>& sums) {
    const auto add = [&](std::uint16_t updates, std::int64_t lookups) {
      std::size_t bucket = 0;
      while (bucket < kUpdateBounds.size() && updates >= kUpdateBounds[bucket]) ++bucket;
      sums[4 + bucket] += lookups;
    };
    if (!sharded_) {
      for (const Index row : model_->lookups()) add(row_updates_[row], 1);
      return;
    }
    const std::span<const Index> lookups =
        eval_batch_.rows > 0 ? model_->lookups() : std::span<const Index>{};
    const std::vector<float> ones(lookups.size(), 1.0f);
    RowSparse per_row;
    coalesce_rows(lookups, ones, model_->layout().rows(), 1, per_row);
    RowSparse owned;
    push_rows_to_owners(comm_, per_row, owned);
    for (std::size_t j = 0; j < owned.touched(); ++j) {
      add(row_updates_[owned.ids[j] - tables_->first()], std::llround(owned.values[j]));
    }
  }

  struct TableFingerprint {
    std::uint64_t hash = 0;
    double abs_sum = 0.0;
  };
  // Of the whole tables, the same however they are split (a collective for
  // sharded tables).
  TableFingerprint fingerprint_tables() {
    TableFingerprint mine{tables_->row_hash_sum(), tables_->abs_sum()};
    if (!sharded_) return mine;
    const auto n = static_cast<std::size_t>(comm_.size());
    const std::array<std::uint64_t, 2> words{mine.hash, std::bit_cast<std::uint64_t>(mine.abs_sum)};
    std::vector<std::uint64_t> all(2 * n);
    comm_.allgather(bytes_of(std::span<const std::uint64_t>(words)),
                    writable_bytes_of(std::span<std::uint64_t>(all)));
    TableFingerprint sum;
    for (std::size_t q = 0; q < n; ++q) {
      sum.hash += all[2 * q];
      sum.abs_sum += std::bit_cast<double>(all[2 * q + 1]);
    }
    return sum;
  }

  // Held-out log-loss, AUC and accuracy at 0.5 over every held-out row, each
  // rank a slice; integer sums keep the result the same on every backend.
  void evaluate(std::int64_t done) {
    const std::uint64_t first = log_.options().rows;
    const std::uint64_t count = log_.options().held_out_rows;
    const int n = comm_.size();
    const std::uint64_t begin = count * static_cast<std::uint64_t>(comm_.rank()) / n;
    const std::uint64_t end = count * static_cast<std::uint64_t>(comm_.rank() + 1) / n;
    // [correct, loss x 1e6, train loss x 1e6, train steps, lookups by their
    // row's updates, histograms]
    constexpr std::size_t kHistograms = 4 + kUpdateBuckets;
    std::vector<std::int64_t> sums(kHistograms + 2 * kAucBins, 0);
    double loss_sum = 0.0;
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
          pull_batch_rows(eval_batch_, ignored);
        }
        if (rows == 0) {
          if (sharded_ && rows_updated_) count_lookups_by_updates(sums);
          continue;
        }
        const PulledRows pulled(pulled_);
        const RowReader& reader = sharded_ ? static_cast<const RowReader&>(pulled) : *tables_;
        const torch::Tensor logits = model_->forward(eval_batch_, reader).contiguous();
        const float* z = logits.data_ptr<float>();
        for (std::size_t j = 0; j < rows; ++j) {
          const double logit = z[j];
          const bool clicked = eval_batch_.labels[j] > 0.5f;
          // -log sigmoid(+-z), stable for large |z|
          const double signed_logit = clicked ? logit : -logit;
          loss_sum += std::max(-signed_logit, 0.0) + std::log1p(std::exp(-std::abs(logit)));
          const double p = 1.0 / (1.0 + std::exp(-logit));
          sums[0] += (p >= 0.5) == clicked ? 1 : 0;
          const auto bin =
              std::min<std::size_t>(kAucBins - 1, static_cast<std::size_t>(p * kAucBins));
          sums[kHistograms + (clicked ? kAucBins : 0) + bin] += 1;
        }
        if (rows_updated_) count_lookups_by_updates(sums);
      }
      model_->train();
    }
    sums[1] = std::llround(loss_sum * 1e6);
    sums[2] = std::llround(train_loss_sum_ * 1e6);
    sums[3] = train_loss_count_;
    allreduce(comm_, std::span<std::int64_t>(sums));
    const EvalPoint point{done, steps_.epoch_at(done), wall(), 0.0, 0};
    train_loss_sum_ = 0.0;
    train_loss_count_ = 0;
    if (comm_.rank() != 0) return;
    TrainEval eval = make_train_eval(point, static_cast<std::int64_t>(count),
                                     {sums[0], static_cast<double>(sums[1]) * 1e-6},
                                     static_cast<double>(sums[2]) * 1e-6, sums[3]);
    const std::span<const std::int64_t> histograms(sums.data() + kHistograms, 2 * kAucBins);
    const double lookups = static_cast<double>(
        std::accumulate(sums.begin() + 4, sums.begin() + static_cast<std::ptrdiff_t>(kHistograms),
                        std::int64_t{0}));
    if (lookups > 0) {
      last_lookups_by_updates_ = {{"0", static_cast<double>(sums[4]) / lookups},
                                  {"1-9", static_cast<double>(sums[5]) / lookups},
                                  {"10-99", static_cast<double>(sums[6]) / lookups},
                                  {"100+", static_cast<double>(sums[7]) / lookups}};
    }
    eval.test_auc = histogram_auc(histograms.first(kAucBins), histograms.last(kAucBins));
    plan_.writer->write_eval(eval);
    if (plan_.observer) plan_.observer->on_eval(eval);
    last_eval_ = eval;
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
  std::unique_ptr<EmbeddingTables> tables_;  // the rows this rank stores
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<UpdateRule> update_;  // compress gradient only (validate)
  std::unique_ptr<RowAdagrad> adagrad_;
  std::unique_ptr<RowSgd> row_sgd_;
  ClickBatch batch_;
  ClickBatch eval_batch_;
  RowSparse mine_;  // this rank's coalesced table gradient
  RowSparse sum_;   // the sum over ranks (replicated tables)
  // Sharded tables: the batch's rows, fetched; the owned range's sum.
  UninitVector<Index> wanted_;
  RowSparse pulled_;
  RowSparse owned_;
  bool owned_finite_everywhere_ = true;
  RowExchangeReport last_;
  UninitVector<float> dense_;      // the dense comparison's buffer
  UninitVector<Index> every_row_;  // 0 .. rows - 1, for the dense comparison
  WorkerPhaseTimes phase_times_;
  double train_loss_sum_ = 0.0;
  std::int64_t train_loss_count_ = 0;
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
  struct Totals {
    std::int64_t steps = 0;
    double touched = 0.0, union_rows = 0.0, bytes_sent = 0.0, bytes_received = 0.0;
    double exchange_s = 0.0, update_s = 0.0;
    std::vector<double> table_touched;
    nlohmann::json by_exchange = nlohmann::json::object();
    nlohmann::json to_json() const {
      return {{"steps", steps},
              {"touched", touched},
              {"union_rows", union_rows},
              {"bytes_sent", bytes_sent},
              {"bytes_received", bytes_received},
              {"exchange_s", exchange_s},
              {"update_s", update_s},
              {"table_touched", table_touched},
              {"by_exchange", by_exchange}};
    }
    void from_json(const nlohmann::json& j) {
      steps = j.at("steps").get<std::int64_t>();
      touched = j.at("touched").get<double>();
      union_rows = j.at("union_rows").get<double>();
      bytes_sent = j.at("bytes_sent").get<double>();
      bytes_received = j.at("bytes_received").get<double>();
      exchange_s = j.at("exchange_s").get<double>();
      update_s = j.at("update_s").get<double>();
      table_touched = j.at("table_touched").get<std::vector<double>>();
      by_exchange = j.at("by_exchange");
    }
  } totals_;  // rank 0's steps (carried through checkpoints)
};

}  // namespace

void train_click_rank(Communicator& comm, RunPlan& plan) {
  ClickTrainer trainer(comm, plan);
  trainer.run();
}

}  // namespace sparsecomm
