#include "sparsecomm/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/backend.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/data/fashion_mnist.h"
#include "sparsecomm/data/synthetic_images.h"
#include "sparsecomm/optim/lr_schedule.h"
#include "sparsecomm/optim/sgd.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/report/plots.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/traces/gradient_stream.h"
#include "sparsecomm/train/checkpoint.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/models.h"
#include "sparsecomm/train/run_writer.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

// Fashion-MNIST's pixel mean and standard deviation (of x / 255).
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;
constexpr std::int64_t kEvalBatch = 1000;
constexpr std::uint32_t kCheckpointVersion = 1;

struct TensorSplit {
  torch::Tensor images;  // [N, 1, 28, 28] float, normalized
  torch::Tensor labels;  // [N] int64
  std::int64_t count() const { return labels.size(0); }
};

TensorSplit to_tensors(const ImageDataset& data, std::int64_t limit) {
  const auto n = static_cast<std::int64_t>(
      limit > 0 ? std::min<std::size_t>(data.count, static_cast<std::size_t>(limit)) : data.count);
  const auto rows = static_cast<std::int64_t>(data.rows);
  const auto cols = static_cast<std::int64_t>(data.cols);
  torch::Tensor raw = torch::from_blob(const_cast<std::uint8_t*>(data.images.data()),
                                       {n, 1, rows, cols}, torch::kUInt8);
  TensorSplit split;
  split.images = (raw.to(torch::kFloat32) / 255.0f - kPixelMean) / kPixelStd;
  split.labels = torch::from_blob(const_cast<std::uint8_t*>(data.labels.data()), {n}, torch::kUInt8)
                     .to(torch::kInt64);
  return split;
}

struct Datasets {
  TensorSplit train;
  TensorSplit test;
};

Datasets load_datasets(const TrainConfig& config) {
  Datasets out;
  if (config.dataset == "synthetic") {
    const std::size_t train = config.train_samples > 0 ? config.train_samples : 16384;
    const std::size_t test = config.test_samples > 0 ? config.test_samples : 4096;
    out.train = to_tensors(make_synthetic_images(train, config.seed, 0), 0);
    out.test = to_tensors(make_synthetic_images(test, config.seed, 1ull << 40), 0);
  } else {
    out.train =
        to_tensors(load_fashion_mnist(DatasetSplit::kTrain, config.data_dir), config.train_samples);
    out.test =
        to_tensors(load_fashion_mnist(DatasetSplit::kTest, config.data_dir), config.test_samples);
  }
  return out;
}

// What every rank shares: the configuration and derived run constants.
struct RunPlan {
  TrainConfig config;
  std::map<std::string, std::string> method_options;
  const Datasets* data = nullptr;
  BackendKind backend = BackendKind::kThread;
  int threads = 1;
  fs::path run_dir;
  std::optional<std::int64_t> resume_step;  // completed steps of the checkpoint
  TrainObserver* observer = nullptr;
  RunWriter* writer = nullptr;  // rank 0 only
  nlohmann::json summary;       // rank 0's, filled at the end
};

// What defines a run's future: a checkpoint only resumes a run that agrees.
nlohmann::json fingerprint(const RunPlan& plan, int world, std::size_t numel) {
  const TrainConfig& c = plan.config;
  return {{"model", c.model},
          {"method", c.method},
          {"method_options", plan.method_options},
          {"workers", world},
          {"batch", c.batch},
          {"seed", c.seed},
          {"dataset", c.dataset},
          {"train_samples", c.train_samples},
          {"numel", numel}};
}

void check_fingerprint(const nlohmann::json& saved, const nlohmann::json& current) {
  std::string differences;
  for (const auto& [key, value] : current.items()) {
    if (!saved.contains(key) || saved[key] != value) {
      differences +=
          fmt::format("\n  {}: checkpoint {} vs this run {}", key,
                      saved.contains(key) ? saved[key].dump() : "(absent)", value.dump());
    }
  }
  if (!differences.empty()) {
    throw InvalidArgument(
        "the checkpoint belongs to a different run; these settings differ:" + differences +
        "\nresume with the checkpoint's settings (they are in its run directory's config.json)");
  }
}

// The run's length and learning-rate schedule when `trainers` ranks (or
// workers) share the training data, each `config.batch` samples per step.
struct StepPlan {
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;
  LrScheduleOptions lr;
};

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

// Rank 0 at the end: summary.json (with `extra` fields), the plots, the
// observer. A plot that cannot be drawn is a warning: the run's results stand.
void finish_run(RunPlan& plan, const RunInfo& info, double wall_s,
                const nlohmann::json& extra = nlohmann::json::object()) {
  plan.summary = plan.writer->finish(info, wall_s, extra);
  if (plan.config.plots) {
    try {
      const std::vector<report::RunData> runs = {report::load_run(plan.run_dir)};
      report::write_plots(runs, plan.run_dir);
    } catch (const std::exception& e) {
      spdlog::warn("plots were not drawn: {}", e.what());
    }
  }
  if (plan.observer) plan.observer->on_finish(plan.summary);
}

std::mutex& model_construction_mutex() {
  static std::mutex mutex;
  return mutex;
}

class RankTrainer {
 public:
  RankTrainer(Communicator& comm, RunPlan& plan) : comm_(comm), plan_(plan), config_(plan.config) {
    {
      // LibTorch's default generator is process-wide: build one model at a
      // time so every replica draws the same initial weights.
      std::lock_guard lock(model_construction_mutex());
      torch::manual_seed(config_.seed);
      model_ = make_model(config_.model);
    }
    DataParallelOptions parallel;
    parallel.bucket_bytes = static_cast<std::size_t>(config_.bucket_mb * 1024.0 * 1024.0);
    if (config_.bucket_mb > 0 && parallel.bucket_bytes == 0) parallel.bucket_bytes = 1;
    const SchemeOptions method_options(plan.method_options);
    const NonFinitePolicy nonfinite = parse_nonfinite_policy(config_.nonfinite);
    ddp_ = std::make_unique<DataParallel>(
        *model_, comm_,
        [&] { return make_gradient_sync(config_.method, method_options, nonfinite); }, parallel);
    SgdOptions sgd;
    sgd.momentum = ddp_->sync().applies_momentum() ? 0.0 : config_.momentum;
    sgd.nesterov = config_.nesterov && sgd.momentum > 0.0;
    sgd.weight_decay = config_.weight_decay;
    sgd_ = std::make_unique<FlatSgd>(sgd);

    const StepPlan steps = plan_steps(config_, plan.data->train.count(), comm_.size(), "rank");
    steps_per_epoch_ = steps.steps_per_epoch;
    total_steps_ = steps.total_steps;
    schedule_ = std::make_unique<LrSchedule>(steps.lr);
    fingerprint_ = fingerprint(plan_, comm_.size(), ddp_->numel());
    const auto slowdowns = parse_slowdowns(config_);
    if (const auto it = slowdowns.find(comm_.rank()); it != slowdowns.end()) slowdown_ = it->second;
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
      info_.backend = std::string(backend_name(plan_.backend));
      info_.workers = comm_.size();
      info_.threads = plan_.threads;
      info_.numel = ddp_->numel();
      info_.steps_per_epoch = steps_per_epoch_;
      info_.total_steps = total_steps_;
      info_.first_step = step;
      info_.buckets = ddp_->buckets().size();
      if (ddp_->pipelined()) {
        info_.pipelining =
            fmt::format("pipelined: {} buckets of >= {} MiB", info_.buckets, config_.bucket_mb);
      } else if (config_.bucket_mb > 0) {
        info_.pipelining = fmt::format(
            "not pipelined: {} selects over the whole gradient, so it runs after backward",
            config_.method);
      } else {
        info_.pipelining = "not pipelined (--bucket-mb 0)";
      }
      info_.run_dir = plan_.run_dir.string();
      if (plan_.observer) plan_.observer->on_start(info_);
    }
    open_trace();
    clock_ = Stopwatch();
    wall_offset_ = wall_offset;
    model_->train();
    const std::int64_t end =
        config_.stop_at_step > 0 ? std::min(total_steps_, config_.stop_at_step) : total_steps_;
    for (; step < end; ++step) {
      train_step(step);
      const std::int64_t done = step + 1;
      const bool epoch_end = done % steps_per_epoch_ == 0;
      if (epoch_end || done == total_steps_ ||
          (config_.eval_every > 0 && done % config_.eval_every == 0)) {
        evaluate(done);
      }
      if (done == end && end < total_steps_) {
        save_checkpoint(done);  // stopped early: resumable
      } else if (config_.checkpoint_every > 0 &&
                 (done % config_.checkpoint_every == 0 || done == total_steps_)) {
        save_checkpoint(done);
      }
    }
    if (comm_.rank() == 0) finish();
  }

 private:
  double wall() const { return wall_offset_ + clock_.seconds(); }
  double epoch_at(std::int64_t done) const {
    return static_cast<double>(done) / static_cast<double>(steps_per_epoch_);
  }

  torch::Tensor batch_indices(std::int64_t step) {
    const std::int64_t epoch = step / steps_per_epoch_;
    if (epoch != shard_epoch_) {
      shard_ =
          epoch_shard(static_cast<std::size_t>(plan_.data->train.count()), comm_.rank(),
                      comm_.size(), static_cast<std::size_t>(config_.batch), config_.seed, epoch);
      shard_epoch_ = epoch;
    }
    const std::int64_t first = (step % steps_per_epoch_) * config_.batch;
    std::vector<std::int64_t> indices(shard_.begin() + first,
                                      shard_.begin() + first + config_.batch);
    return torch::tensor(indices, torch::kInt64);
  }

  void train_step(std::int64_t step) {
    TrainStep record;
    record.step = step;
    record.lr = schedule_->at(step);

    Stopwatch compute;
    const torch::Tensor indices = batch_indices(step);
    const torch::Tensor images = plan_.data->train.images.index_select(0, indices);
    const torch::Tensor labels = plan_.data->train.labels.index_select(0, indices);
    ddp_->zero_grad();
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(model_->forward(images), labels);
    loss.backward();
    record.loss = loss.item<double>();
    if (slowdown_ > 1.0) {
      std::this_thread::sleep_for(
          std::chrono::duration<double>((slowdown_ - 1.0) * compute.seconds()));
    }
    record.compute_s = compute.seconds();
    train_loss_sum_ += record.loss;
    train_loss_count_ += 1;

    if (trace_ && step - first_step_ < config_.record_steps) {
      trace_->append(comm_.rank(), ddp_->gradients());
    }

    record.sync =
        ddp_->synchronize(static_cast<double>(step) / static_cast<double>(steps_per_epoch_));
    record.selection_s = record.sync.accumulate_s + record.sync.selection_s;
    record.exchange_s = record.sync.exchange_s;

    Stopwatch update;
    sgd_->step(ddp_->parameters(), ddp_->gradients(), record.lr);
    record.update_s = update.seconds();

    if (comm_.rank() == 0) {
      record.epoch = epoch_at(step + 1);
      record.wall_s = wall();
      plan_.writer->write_step(record);
      if (plan_.observer) plan_.observer->on_step(record);
    }
  }

  // Test accuracy over the whole test set, each rank evaluating a slice
  // with rank 0's BatchNorm statistics; plus the mean training loss of all
  // ranks since the last evaluation.
  void evaluate(std::int64_t done) {
    ddp_->broadcast_buffers(0);
    model_->eval();
    const TensorSplit& test = plan_.data->test;
    const std::int64_t n = test.count();
    const std::int64_t begin = n * comm_.rank() / comm_.size();
    const std::int64_t end = n * (comm_.rank() + 1) / comm_.size();
    double loss_sum = 0.0;
    std::int64_t correct = 0;
    {
      torch::NoGradGuard no_grad;
      for (std::int64_t first = begin; first < end; first += kEvalBatch) {
        const std::int64_t count = std::min(kEvalBatch, end - first);
        const torch::Tensor logits = model_->forward(test.images.narrow(0, first, count));
        const torch::Tensor labels = test.labels.narrow(0, first, count);
        loss_sum += torch::nn::functional::cross_entropy(
                        logits, labels,
                        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                        .item<double>();
        correct += logits.argmax(1).eq(labels).sum().item<std::int64_t>();
      }
    }
    model_->train();
    // Fixed-point sums keep the result identical on every backend.
    std::vector<std::int64_t> sums = {correct, std::llround(loss_sum * 1e6),
                                      std::llround(train_loss_sum_ * 1e6), train_loss_count_};
    allreduce(comm_, std::span<std::int64_t>(sums));
    train_loss_sum_ = 0.0;
    train_loss_count_ = 0;
    if (comm_.rank() != 0) return;
    TrainEval eval;
    eval.step = done;
    eval.epoch = epoch_at(done);
    eval.wall_s = wall();
    eval.test_accuracy = n > 0 ? static_cast<double>(sums[0]) / static_cast<double>(n) : 0.0;
    eval.test_loss = n > 0 ? static_cast<double>(sums[1]) * 1e-6 / static_cast<double>(n) : 0.0;
    eval.train_loss = sums[3] > 0
                          ? static_cast<double>(sums[2]) * 1e-6 / static_cast<double>(sums[3])
                          : std::nan("");
    plan_.writer->write_eval(eval);
    if (plan_.observer) plan_.observer->on_eval(eval);
  }

  void save_checkpoint(std::int64_t done) {
    StateWriter state;
    state.tag("sparsecomm-checkpoint");
    state.value<std::uint32_t>(kCheckpointVersion);
    state.string(fingerprint_.dump());
    state.value<std::int64_t>(done);
    state.value<double>(wall());
    state.array<float>(ddp_->parameters());
    sgd_->save(state);
    ddp_->save(state);
    state.value<double>(train_loss_sum_);
    state.value<std::int64_t>(train_loss_count_);
    write_rank_checkpoint(plan_.run_dir, done, comm_.rank(), state.bytes());
    comm_.barrier();
    if (comm_.rank() == 0) commit_checkpoint(plan_.run_dir, done, comm_.size(), fingerprint_);
  }

  // Restores everything that defines the run's future; returns its wall time.
  double load_checkpoint(std::int64_t done) {
    const std::vector<std::byte> bytes = read_rank_checkpoint(plan_.run_dir, done, comm_.rank());
    StateReader state(bytes);
    state.expect_tag("sparsecomm-checkpoint");
    const auto version = state.value<std::uint32_t>();
    if (version != kCheckpointVersion) {
      throw Error(fmt::format("the checkpoint has format version {}, this build reads {}", version,
                              kCheckpointVersion));
    }
    check_fingerprint(nlohmann::json::parse(state.string()), fingerprint_);
    const auto saved_step = state.value<std::int64_t>();
    if (saved_step != done) {
      throw Error(fmt::format("the checkpoint file of rank {} is of step {}, latest.json says {}",
                              comm_.rank(), saved_step, done));
    }
    const double wall_s = state.value<double>();
    state.array_into<float>(ddp_->parameters());
    sgd_->load(state);
    ddp_->load(state);
    train_loss_sum_ = state.value<double>();
    train_loss_count_ = state.value<std::int64_t>();
    if (!state.at_end()) throw Error("the checkpoint has trailing data: a different version?");
    return wall_s;
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

  void finish() {
    const double wall_s = wall();
    finish_run(plan_, info_, wall_s);
  }

  Communicator& comm_;
  RunPlan& plan_;
  const TrainConfig& config_;
  std::shared_ptr<ImageModel> model_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<FlatSgd> sgd_;
  std::unique_ptr<LrSchedule> schedule_;
  nlohmann::json fingerprint_;
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t total_steps_ = 0;
  std::int64_t first_step_ = 0;
  std::vector<std::uint32_t> shard_;
  std::int64_t shard_epoch_ = -1;
  double train_loss_sum_ = 0.0;
  std::int64_t train_loss_count_ = 0;
  TraceWriter* trace_ = nullptr;  // recording gradients, when asked
  std::unique_ptr<TraceWriter> own_trace_;
  Stopwatch clock_;
  double wall_offset_ = 0.0;
  double slowdown_ = 1.0;
  RunInfo info_;
};

// --- parameter-server mode ---------------------------------------------------

// A worker's (or server's) replica: the seeded model in flat buffers, with
// no broadcast (servers take part in no collective before training).
struct FlatModel {
  std::shared_ptr<ImageModel> model;
  std::unique_ptr<FlatModule> flat;
};

std::unique_ptr<FlatModel> make_flat_model(const TrainConfig& config) {
  auto replica = std::make_unique<FlatModel>();
  {
    std::lock_guard lock(model_construction_mutex());
    torch::manual_seed(config.seed);
    replica->model = make_model(config.model);
  }
  replica->flat = std::make_unique<FlatModule>(*replica->model);
  return replica;
}

std::size_t model_numel(const TrainConfig& config) {
  std::shared_ptr<ImageModel> model;
  {
    std::lock_guard lock(model_construction_mutex());
    model = make_model(config.model);
  }
  std::size_t numel = 0;
  for (const auto& p : model->parameters()) numel += static_cast<std::size_t>(p.numel());
  return numel;
}

PsOptions ps_options(const RunPlan& plan, const std::vector<LayerSpan>& layers) {
  const TrainConfig& c = plan.config;
  PsOptions options;
  options.model = parse_sync_model(sync_model_name(c));
  options.push = c.method;
  options.scheme_options = SchemeOptions(plan.method_options);
  // DGC's momentum correction replaces the servers' momentum.
  options.sgd.momentum = c.method == "dgc" ? 0.0 : c.momentum;
  options.sgd.nesterov = c.nesterov && options.sgd.momentum > 0.0;
  options.sgd.weight_decay = c.weight_decay;
  options.layers = layers;
  return options;
}

// Totals every rank contributes to at the end (fixed point, one all-reduce
// over the whole world): per worker its wait (us) and blocked begins, per
// server its staleness sum, count and maximum.
struct PsTotals {
  int workers = 0;
  int servers = 0;
  std::vector<std::int64_t> values;
  PsTotals(int w, int s) : workers(w), servers(s), values(2 * w + 3 * s, 0) {}
  std::int64_t& wait_us(int worker) { return values[static_cast<std::size_t>(worker)]; }
  std::int64_t& blocked(int worker) { return values[static_cast<std::size_t>(workers + worker)]; }
  std::int64_t& server(int s, int field) {
    return values[static_cast<std::size_t>(2 * workers + 3 * s + field)];
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

// One server rank: serves its shard of the seeded initial parameters, writes
// its log (server<i>.jsonl in the run directory), joins the final totals.
void run_ps_server(Communicator& comm, RunPlan& plan, const ServerLayout& layout) {
  std::unique_ptr<FlatModel> flat = make_flat_model(plan.config);
  const int index = layout.server_index(comm.rank());
  const Range shard = layout.shard(index);
  const PsOptions options =
      ps_options(plan, {flat->flat->layers().begin(), flat->flat->layers().end()});
  const ServerLog log = run_server(comm, layout, options,
                                   flat->flat->parameters().subspan(shard.begin, shard.size()));
  write_server_log(plan.run_dir / fmt::format("server{}.jsonl", index), log, options.model.name());
  PsTotals totals(layout.workers(), layout.servers());
  std::int64_t max_staleness = 0;
  for (const AppliedPush& a : log.applied) {
    totals.server(index, 0) += a.staleness;
    max_staleness = std::max(max_staleness, a.staleness);
  }
  totals.server(index, 1) = static_cast<std::int64_t>(log.applied.size());
  totals.server(index, 2) = max_staleness;
  allreduce(comm, std::span<std::int64_t>(totals.values));
}

// One worker rank: the same model, data order and learning-rate schedule as
// the all-reduce trainer (with W workers instead of W ranks), but each step
// is begin_step -> pull -> forward/backward -> push to the servers. Rank 0
// evaluates alone, on parameters it pulls right before evaluating.
class PsRankWorker {
 public:
  PsRankWorker(Communicator& comm, RunPlan& plan, const ServerLayout& layout)
      : comm_(comm), plan_(plan), config_(plan.config), layout_(layout) {
    flat_ = make_flat_model(config_);
    options_ = ps_options(plan, {flat_->flat->layers().begin(), flat_->flat->layers().end()});
    worker_ = std::make_unique<PsWorker>(comm_, layout_, options_);
    const auto slowdowns = parse_slowdowns(config_);
    if (const auto it = slowdowns.find(comm_.rank()); it != slowdowns.end()) slowdown_ = it->second;

    const StepPlan steps =
        plan_steps(config_, plan.data->train.count(), layout_.workers(), "worker");
    steps_per_epoch_ = steps.steps_per_epoch;
    total_steps_ = steps.total_steps;
    schedule_ = std::make_unique<LrSchedule>(steps.lr);
  }

  void run() {
    if (comm_.rank() == 0) {
      info_.backend = std::string(backend_name(plan_.backend));
      info_.workers = layout_.workers();
      info_.servers = layout_.servers();
      info_.sync = options_.model.name();
      info_.threads = plan_.threads;
      info_.numel = flat_->flat->numel();
      info_.steps_per_epoch = steps_per_epoch_;
      info_.total_steps = total_steps_;
      info_.pipelining = "not pipelined (parameter-server mode)";
      info_.run_dir = plan_.run_dir.string();
      if (plan_.observer) plan_.observer->on_start(info_);
    }
    clock_ = Stopwatch();
    flat_->model->train();
    for (std::int64_t step = 0; step < total_steps_; ++step) {
      train_step(step);
      const std::int64_t done = step + 1;
      if (comm_.rank() == 0 && (done % steps_per_epoch_ == 0 || done == total_steps_ ||
                                (config_.eval_every > 0 && done % config_.eval_every == 0))) {
        evaluate(done);
      }
    }
    worker_->finish();
    PsTotals totals(layout_.workers(), layout_.servers());
    totals.wait_us(comm_.rank()) = std::llround(worker_->log().wait_s * 1e6);
    totals.blocked(comm_.rank()) = worker_->log().blocked;
    allreduce(comm_, std::span<std::int64_t>(totals.values));
    if (comm_.rank() == 0) finish(totals);
  }

 private:
  torch::Tensor batch_indices(std::int64_t step) {
    const std::int64_t epoch = step / steps_per_epoch_;
    if (epoch != shard_epoch_) {
      shard_ = epoch_shard(static_cast<std::size_t>(plan_.data->train.count()), comm_.rank(),
                           layout_.workers(), static_cast<std::size_t>(config_.batch), config_.seed,
                           epoch);
      shard_epoch_ = epoch;
    }
    const std::int64_t first = (step % steps_per_epoch_) * config_.batch;
    std::vector<std::int64_t> indices(shard_.begin() + first,
                                      shard_.begin() + first + config_.batch);
    return torch::tensor(indices, torch::kInt64);
  }

  void train_step(std::int64_t step) {
    TrainStep record;
    record.step = step;
    record.lr = schedule_->at(step);
    const double epoch = static_cast<double>(step) / static_cast<double>(steps_per_epoch_);

    Stopwatch wait;
    worker_->begin_step();
    record.wait_s = wait.seconds();

    Stopwatch pull;
    const std::size_t pulled_before = worker_->log().bytes_pulled;
    worker_->pull(flat_->flat->parameters());
    const double pull_s = pull.seconds();
    const std::size_t pulled = worker_->log().bytes_pulled - pulled_before;

    Stopwatch compute;
    const torch::Tensor indices = batch_indices(step);
    const torch::Tensor images = plan_.data->train.images.index_select(0, indices);
    const torch::Tensor labels = plan_.data->train.labels.index_select(0, indices);
    flat_->flat->zero_grad();
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(flat_->model->forward(images), labels);
    loss.backward();
    flat_->flat->reattach_gradients();
    record.loss = loss.item<double>();
    if (slowdown_ > 1.0) {
      // A straggler: sleep (not spin) (FACTOR - 1) x this step's compute time.
      std::this_thread::sleep_for(
          std::chrono::duration<double>((slowdown_ - 1.0) * compute.seconds()));
    }
    record.compute_s = compute.seconds();
    train_loss_sum_ += record.loss;
    train_loss_count_ += 1;

    const PushReport push = worker_->push(flat_->flat->gradients(), record.lr, epoch);
    record.selection_s = push.select_s;
    record.exchange_s = pull_s + push.send_s;

    StepMetrics& m = record.sync;
    m.step = step;
    m.numel = flat_->flat->numel();
    m.target = push.target;
    m.selected = push.values;
    m.union_size = push.values;
    m.density_ratio =
        push.target > 0 ? static_cast<double>(push.values) / static_cast<double>(push.target) : 0.0;
    m.residual_norm = push.residual_norm;
    m.bytes_sent = push.bytes_sent;
    m.bytes_received = pulled;
    m.selection_s = push.select_s;
    m.exchange_s = record.exchange_s;
    bytes_pushed_ += static_cast<double>(push.bytes_sent);
    bytes_pulled_ += static_cast<double>(pulled);

    if (comm_.rank() == 0) {
      record.epoch = static_cast<double>(step + 1) / static_cast<double>(steps_per_epoch_);
      record.wall_s = clock_.seconds();
      plan_.writer->write_step(record);
      if (plan_.observer) plan_.observer->on_step(record);
    }
  }

  // Rank 0 alone: pulls the freshest parameters (under BSP those after this
  // step's update, as in the all-reduce trainer) and evaluates the whole
  // test set; the training loss is rank 0's mean since the last evaluation.
  void evaluate(std::int64_t done) {
    worker_->pull(flat_->flat->parameters());
    flat_->model->eval();
    const TensorSplit& test = plan_.data->test;
    const std::int64_t n = test.count();
    double loss_sum = 0.0;
    std::int64_t correct = 0;
    {
      torch::NoGradGuard no_grad;
      for (std::int64_t first = 0; first < n; first += kEvalBatch) {
        const std::int64_t count = std::min(kEvalBatch, n - first);
        const torch::Tensor logits = flat_->model->forward(test.images.narrow(0, first, count));
        const torch::Tensor labels = test.labels.narrow(0, first, count);
        loss_sum += torch::nn::functional::cross_entropy(
                        logits, labels,
                        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                        .item<double>();
        correct += logits.argmax(1).eq(labels).sum().item<std::int64_t>();
      }
    }
    flat_->model->train();
    TrainEval eval;
    eval.step = done;
    eval.epoch = static_cast<double>(done) / static_cast<double>(steps_per_epoch_);
    eval.wall_s = clock_.seconds();
    eval.test_accuracy = n > 0 ? static_cast<double>(correct) / static_cast<double>(n) : 0.0;
    eval.test_loss = n > 0 ? loss_sum / static_cast<double>(n) : 0.0;
    eval.train_loss = train_loss_count_ > 0
                          ? train_loss_sum_ / static_cast<double>(train_loss_count_)
                          : std::nan("");
    train_loss_sum_ = 0.0;
    train_loss_count_ = 0;
    plan_.writer->write_eval(eval);
    if (plan_.observer) plan_.observer->on_eval(eval);
  }

  void finish(PsTotals& totals) {
    const double wall_s = clock_.seconds();  // after every worker and server is done
    std::int64_t stale_sum = 0, stale_count = 0, stale_max = 0;
    for (int s = 0; s < totals.servers; ++s) {
      stale_sum += totals.server(s, 0);
      stale_count += totals.server(s, 1);
      stale_max = std::max(stale_max, totals.server(s, 2));
    }
    std::vector<double> waits;
    std::vector<std::int64_t> blocked;
    for (int w = 0; w < totals.workers; ++w) {
      waits.push_back(static_cast<double>(totals.wait_us(w)) * 1e-6);
      blocked.push_back(totals.blocked(w));
    }
    const double steps = static_cast<double>(std::max<std::int64_t>(1, total_steps_));
    const nlohmann::json extra = {
        {"staleness_mean",
         stale_count > 0 ? static_cast<double>(stale_sum) / static_cast<double>(stale_count) : 0.0},
        {"staleness_max", stale_max},
        {"applied_pushes", stale_count},
        {"wait_s_per_worker", waits},
        {"blocked_per_worker", blocked},
        {"slowdown", config_.slowdown},
        {"bytes_per_push", bytes_pushed_ / steps},
        {"bytes_per_pull", bytes_pulled_ / steps},
        {"server_logs", "server<i>.jsonl"}};
    finish_run(plan_, info_, wall_s, extra);
  }

  Communicator& comm_;
  RunPlan& plan_;
  const TrainConfig& config_;
  ServerLayout layout_;
  std::unique_ptr<FlatModel> flat_;
  PsOptions options_;
  std::unique_ptr<PsWorker> worker_;
  double slowdown_ = 1.0;
  std::unique_ptr<LrSchedule> schedule_;
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t total_steps_ = 0;
  std::vector<std::uint32_t> shard_;
  std::int64_t shard_epoch_ = -1;
  double train_loss_sum_ = 0.0;
  std::int64_t train_loss_count_ = 0;
  double bytes_pushed_ = 0.0;
  double bytes_pulled_ = 0.0;
  Stopwatch clock_;
  RunInfo info_;
};

int resolve_threads(const TrainConfig& config, BackendKind backend) {
  if (config.deterministic) {
    if (config.threads > 1) {
      throw InvalidArgument("--deterministic runs one intra-op thread per rank; drop --threads");
    }
    return 1;
  }
  if (config.threads > 0) return config.threads;
  if (backend == BackendKind::kThread) return 1;
  // Under mpirun: share this machine's cores among the ranks on it.
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int local_ranks = local ? std::max(1, std::atoi(local)) : 1;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local_ranks);
}

fs::path default_run_dir(const TrainConfig& config) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  return fs::path("runs") / fmt::format("{}-{}-{:04}{:02}{:02}-{:02}{:02}{:02}", config.method,
                                        config.model, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                                        tm.tm_hour, tm.tm_min, tm.tm_sec);
}

}  // namespace

nlohmann::json run_training(const TrainConfig& config, TrainObserver* observer,
                            const std::string& resume_dir) {
  validate(config);
  RunPlan plan;
  plan.config = config;
  plan.method_options = effective_method_options(config);
  if (config.deterministic && config.method == "dense" && plan.method_options.count("allreduce") &&
      plan.method_options.at("allreduce") != "ring") {
    throw InvalidArgument(
        "--deterministic needs our ring all-reduce (a fixed reduction order); drop "
        "--method-option allreduce=native");
  }
  // Build the method once up front so bad options fail before any work.
  if (ps_mode(config)) {
    if (!resume_dir.empty()) {
      throw InvalidArgument("--resume: parameter-server runs write no checkpoints yet");
    }
    const std::size_t numel = model_numel(config);
    if (static_cast<std::size_t>(config.servers) > numel) {
      throw InvalidArgument(fmt::format(
          "--servers {}: more servers than the {} model's {} parameters; give at most {}",
          config.servers, config.model, numel, numel));
    }
    validate_ps_options(ps_options(plan, {}));
  } else {
    make_gradient_sync(config.method, SchemeOptions(plan.method_options));
  }

  plan.backend = resolve_backend(parse_backend(config.backend));
  plan.threads = resolve_threads(config, plan.backend);
  torch::set_num_threads(plan.threads);
  plan.observer = observer;

  if (!resume_dir.empty()) {
    if (!config.out.empty() && fs::path(config.out) != fs::path(resume_dir)) {
      throw InvalidArgument(
          fmt::format("--resume {} continues that run in its own directory; drop --out {}",
                      resume_dir, config.out));
    }
    plan.run_dir = resume_dir;
    const auto latest = latest_checkpoint(plan.run_dir);
    if (!latest) {
      throw InvalidArgument(fmt::format(
          "{} holds no checkpoint (checkpoints/latest.json); train with --checkpoint-every N or "
          "--stop-at-step N to write one",
          resume_dir));
    }
    plan.resume_step = (*latest)["step"].get<std::int64_t>();
    if (config.stop_at_step > 0 && config.stop_at_step <= *plan.resume_step) {
      throw InvalidArgument(fmt::format(
          "--stop-at-step {}: the checkpoint in {} is already at step {}; give a later step, "
          "or 0 to run to the end",
          config.stop_at_step, resume_dir, *plan.resume_step));
    }
  } else {
    plan.run_dir = config.out.empty() ? default_run_dir(config) : fs::path(config.out);
  }
  plan.config.out = plan.run_dir.string();

  const Datasets data = load_datasets(config);
  plan.data = &data;

  WorldOptions world;
  world.backend = plan.backend;
  world.ranks = config.workers;
  if (ps_mode(config)) {
    // Under MPI take the job's size and check it below (a clearer message).
    world.ranks = plan.backend == BackendKind::kMpi ? 0 : config.workers + config.servers;
  }
  if (config.timeout_s > 0) {
    world.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(config.timeout_s * 1000));
  }

  std::unique_ptr<RunWriter> writer;
  run_world(world, [&](Communicator& comm) {
    std::optional<ServerLayout> layout;
    if (ps_mode(config)) {
      if (config.workers > 0 && comm.size() != config.workers + config.servers) {
        throw InvalidArgument(fmt::format(
            "--workers {} --servers {}: the world must have {} ranks (workers + servers), but "
            "the MPI job has {}; run mpirun -n {} (or give --workers {} to use this job)",
            config.workers, config.servers, config.workers + config.servers, comm.size(),
            config.workers + config.servers, comm.size() - config.servers));
      }
      if (comm.size() <= config.servers) {
        throw InvalidArgument(fmt::format(
            "--servers {}: the job has {} ranks, which leaves no worker; the world is workers + "
            "servers ranks",
            config.servers, comm.size()));
      }
      const int workers = comm.size() - config.servers;
      for (const auto& [rank, factor] : parse_slowdowns(config)) {
        if (rank >= workers) {
          throw InvalidArgument(fmt::format(
              "--slowdown {}:{}: rank {} is not a worker (workers are ranks 0..{}, servers "
              "{}..{})",
              rank, factor, rank, workers - 1, workers, comm.size() - 1));
        }
      }
      layout.emplace(model_numel(config), workers, config.servers);
    } else {
      for (const auto& [rank, factor] : parse_slowdowns(config)) {
        if (rank >= comm.size()) {
          throw InvalidArgument(
              fmt::format("--slowdown {}:{}: there are only {} ranks", rank, factor, comm.size()));
        }
      }
    }
    if (comm.rank() == 0) {
      writer = std::make_unique<RunWriter>(plan.run_dir, plan.config,
                                           plan.resume_step ? *plan.resume_step : -1);
      plan.writer = writer.get();
    }
    // The run directory exists (or the error above stops every rank)
    // before anyone trains.
    comm.barrier();
    if (layout && layout->is_server_rank(comm.rank())) {
      run_ps_server(comm, plan, *layout);
    } else if (layout) {
      PsRankWorker worker(comm, plan, *layout);
      worker.run();
    } else {
      RankTrainer trainer(comm, plan);
      trainer.run();
    }
  });
  return plan.summary;
}

}  // namespace sparsecomm
