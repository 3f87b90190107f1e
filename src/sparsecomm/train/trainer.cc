#include "sparsecomm/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
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

    const std::int64_t shard = plan.data->train.count() / comm_.size();
    steps_per_epoch_ = shard / config_.batch;
    if (steps_per_epoch_ < 1) {
      throw InvalidArgument(fmt::format(
          "--batch {} is larger than each rank's share of the data ({} of {} samples over {} "
          "ranks): lower --batch or --workers, or use more --train-samples",
          config_.batch, shard, plan.data->train.count(), comm_.size()));
    }
    total_steps_ = config_.max_steps > 0 ? config_.max_steps : config_.epochs * steps_per_epoch_;

    LrScheduleOptions lr;
    lr.base = config_.lr;
    lr.warmup_steps = std::llround(config_.warmup_epochs * static_cast<double>(steps_per_epoch_));
    lr.decay = parse_lr_decay(config_.lr_decay);
    for (const double epoch : config_.lr_milestones) {
      lr.milestones.push_back(std::llround(epoch * static_cast<double>(steps_per_epoch_)));
    }
    lr.gamma = config_.lr_gamma;
    lr.total_steps = total_steps_;
    schedule_ = std::make_unique<LrSchedule>(lr);
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
    plan_.summary = plan_.writer->finish(info_, wall_s);
    if (config_.plots) {
      try {
        const std::vector<report::RunData> runs = {report::load_run(plan_.run_dir)};
        report::write_plots(runs, plan_.run_dir);
      } catch (const std::exception& e) {
        spdlog::warn("plots were not drawn: {}", e.what());
      }
    }
    if (plan_.observer) plan_.observer->on_finish(plan_.summary);
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
  make_gradient_sync(config.method, SchemeOptions(plan.method_options));

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
  if (config.timeout_s > 0) {
    world.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(config.timeout_s * 1000));
  }

  std::unique_ptr<RunWriter> writer;
  run_world(world, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      writer = std::make_unique<RunWriter>(plan.run_dir, plan.config,
                                           plan.resume_step ? *plan.resume_step : -1);
      plan.writer = writer.get();
    }
    // The run directory exists (or the error above stops every rank)
    // before anyone trains.
    comm.barrier();
    RankTrainer trainer(comm, plan);
    trainer.run();
  });
  return plan.summary;
}

}  // namespace sparsecomm
