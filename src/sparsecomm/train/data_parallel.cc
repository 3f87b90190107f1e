#include "sparsecomm/train/data_parallel.h"

#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timeline.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sync/tensor_buckets.h"

namespace sparsecomm {
namespace {

// A tensor of `shape` over `owner`'s floats from `offset`, without autograd
// view metadata (so in-place ops and detach_ work on it); it keeps `owner`'s
// storage alive, so the module stays valid after the DataParallel is gone.
torch::Tensor alias(const torch::Tensor& owner, std::size_t offset, at::IntArrayRef shape) {
  return torch::from_blob(
      owner.data_ptr<float>() + offset, shape, [keep = owner](void*) {},
      torch::TensorOptions().dtype(torch::kFloat32));
}

std::span<std::byte> tensor_bytes(const torch::Tensor& t) {
  return {static_cast<std::byte*>(t.data_ptr()), static_cast<std::size_t>(t.nbytes())};
}

}  // namespace

// The communication thread of a pipelined DataParallel. Per step: the
// AccumulateGrad post-hooks count each bucket's arrived parameters; the
// thread synchronizes buckets strictly in bucket order (so every rank issues
// the same collectives in the same order, whatever order hooks fire in),
// each as soon as it is complete; synchronize() completes the buckets whose
// parameters got no gradient and waits for the thread.
class DataParallel::Pipeline {
 public:
  Pipeline(DataParallel& owner, std::vector<int> bucket_of_param)
      : owner_(owner), bucket_of_param_(std::move(bucket_of_param)) {
    const std::size_t buckets = owner_.bucket_ranges_.size();
    expected_.assign(buckets, 0);
    for (const int b : bucket_of_param_) ++expected_[static_cast<std::size_t>(b)];
    arrived_.assign(buckets, 0);
    metrics_.assign(buckets, {});
    thread_ = std::thread([this] { loop(); });
  }

  ~Pipeline() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // Starts a step (idempotent within a step).
  void begin_step(std::int64_t step, double epoch) {
    std::lock_guard lock(mutex_);
    if (active_) return;
    active_ = true;
    step_ = step;
    epoch_ = epoch;
    std::fill(arrived_.begin(), arrived_.end(), 0);
    done_ = false;
    error_ = nullptr;
    hook_arrivals_ = 0;
    clock_ = Stopwatch();
    timeline_ = current_timeline();  // the step's rank: its buckets go on its timeline
    backward_done_s_ = -1.0;
    overlapped_s_ = 0.0;
    changed_.notify_all();
  }

  // From an AccumulateGrad post-hook (the backward thread): parameter
  // `param`'s gradient is in the flat buffer.
  void parameter_ready(std::size_t param) {
    std::lock_guard lock(mutex_);
    if (!active_) return;  // a backward outside a step (e.g. user code): ignore
    ++arrived_[static_cast<std::size_t>(bucket_of_param_[param])];
    ++hook_arrivals_;
    changed_.notify_all();
  }

  // After backward: finishes the step and returns the combined metrics.
  StepMetrics finish_step() {
    std::unique_lock lock(mutex_);
    backward_done_s_ = clock_.seconds();
    // Parameters that got no gradient this step (their slice is zero).
    arrived_ = expected_;
    changed_.notify_all();
    done_changed_.wait(lock, [this] { return done_; });
    active_ = false;
    if (error_) std::rethrow_exception(error_);
    StepMetrics total = combined(metrics_);
    total.step = step_;
    total.overlapped_s = overlapped_s_;
    last_hook_arrivals_ = hook_arrivals_;
    return total;
  }

  std::size_t last_hook_arrivals() const { return last_hook_arrivals_; }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (true) {
      changed_.wait(lock, [this] { return stopping_ || (active_ && !done_); });
      if (stopping_) return;
      for (std::size_t b = 0; b < expected_.size(); ++b) {
        changed_.wait(lock, [&] { return stopping_ || arrived_[b] >= expected_[b]; });
        if (stopping_) return;
        const StepContext ctx = owner_.context(static_cast<std::int64_t>(b), epoch_);
        const Range range = owner_.bucket_ranges_[b];
        const BindTimeline bind(timeline_);
        lock.unlock();
        const double start = clock_.seconds();
        try {
          const TimedSpan span("bucket exchange", "sync");
          metrics_[b] = owner_.syncs_[b]->synchronize(
              owner_.gradients().subspan(range.begin, range.size()), ctx, owner_.comm_);
        } catch (...) {
          lock.lock();
          error_ = std::current_exception();
          break;
        }
        const double end = clock_.seconds();
        lock.lock();
        // The part of this bucket's work done while backward was running.
        const double backward_end = backward_done_s_ < 0 ? end : backward_done_s_;
        overlapped_s_ += std::max(0.0, std::min(end, backward_end) - start);
      }
      done_ = true;
      done_changed_.notify_all();
    }
  }

  DataParallel& owner_;
  std::vector<int> bucket_of_param_;
  std::vector<int> expected_;
  std::vector<int> arrived_;
  std::vector<StepMetrics> metrics_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::condition_variable done_changed_;
  bool active_ = false;
  bool done_ = true;
  bool stopping_ = false;
  std::int64_t step_ = 0;
  double epoch_ = 0.0;
  Stopwatch clock_;
  double backward_done_s_ = -1.0;
  double overlapped_s_ = 0.0;
  std::size_t hook_arrivals_ = 0;       // this step's parameters announced by hooks
  std::size_t last_hook_arrivals_ = 0;  // the same, for the last finished step
  std::exception_ptr error_;
  Timeline* timeline_ = nullptr;  // the rank's, bound on the thread per bucket
  std::thread thread_;
};

namespace {

// Marks a parameter ready once AccumulateGrad has added its gradient.
class ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::function<void()> ready) : ready_(std::move(ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ready_();
    return outputs;
  }

 private:
  std::function<void()> ready_;
};

}  // namespace

DataParallel::DataParallel(torch::nn::Module& module, Communicator& comm,
                           std::unique_ptr<GradientSync> sync)
    : module_(module), comm_(comm), flat_(module) {
  if (!sync) throw InvalidArgument("[DataParallel] no synchronization method given");
  syncs_.push_back(std::move(sync));
  bucket_ranges_ = {Range{0, numel()}};
  bucket_layers_ = {std::vector<LayerSpan>(layers().begin(), layers().end())};
  start();
}

DataParallel::DataParallel(torch::nn::Module& module, Communicator& comm,
                           const GradientSyncFactory& make_sync, DataParallelOptions options)
    : module_(module), comm_(comm), flat_(module) {
  syncs_.push_back(make_sync());
  if (!syncs_.front()) throw InvalidArgument("[DataParallel] no synchronization method given");
  const std::vector<torch::Tensor>& params = flat_.parameter_tensors();
  const std::span<const LayerSpan> layers = flat_.layers();
  if (options.bucket_bytes == 0 || !syncs_.front()->bucketable() || params.empty()) {
    bucket_ranges_ = {Range{0, numel()}};
    bucket_layers_ = {std::vector<LayerSpan>(layers.begin(), layers.end())};
    start();
    return;
  }
  // Buckets of whole tensors in reverse registration order: each is a
  // contiguous range of the flat vector (parameters are laid out in
  // registration order).
  std::vector<std::size_t> tensor_bytes;
  for (const LayerSpan& layer : layers) tensor_bytes.push_back(layer.size * sizeof(float));
  std::vector<int> bucket_of_param(params.size(), 0);
  for (const Range& tensors : tensor_buckets(tensor_bytes, options.bucket_bytes)) {
    const auto bucket = static_cast<int>(bucket_ranges_.size());
    const Range range{layers[tensors.begin].offset,
                      layers[tensors.end - 1].offset + layers[tensors.end - 1].size};
    bucket_ranges_.push_back(range);
    std::vector<LayerSpan> relative;
    for (std::size_t j = tensors.begin; j < tensors.end; ++j) {
      bucket_of_param[j] = bucket;
      relative.push_back(
          {layers[j].name, layers[j].offset - range.begin, layers[j].size, layers[j].rows});
    }
    bucket_layers_.push_back(std::move(relative));
  }
  while (syncs_.size() < bucket_ranges_.size()) syncs_.push_back(make_sync());
  pipeline_ = std::make_unique<Pipeline>(*this, bucket_of_param);
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params[i]);
    hook_keys_.push_back(accumulator->add_post_hook(
        std::make_unique<ReadyHook>([this, i] { pipeline_->parameter_ready(i); })));
    grad_accumulators_.push_back(std::move(accumulator));
  }
  start();
}

DataParallel::~DataParallel() {
  // The accumulators may outlive this object (a graph still holds them).
  for (std::size_t i = 0; i < grad_accumulators_.size(); ++i) {
    grad_accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
}

FlatModule::FlatModule(torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    if (p.scalar_type() != torch::kFloat32 || !p.device().is_cpu()) {
      throw NotSupported(fmt::format(
          "[DataParallel] parameter '{}' is {} on {}: only float32 CPU parameters are supported",
          item.key(), std::string(c10::toString(p.scalar_type())), p.device().str()));
    }
    layers_.push_back({item.key(), numel_, static_cast<std::size_t>(p.numel()),
                       p.dim() >= 2 ? static_cast<std::size_t>(p.size(0)) : 0});
    numel_ += static_cast<std::size_t>(p.numel());
    params_.push_back(p);
  }
  const auto options = torch::TensorOptions().dtype(torch::kFloat32);
  flat_parameters_ = torch::empty({static_cast<std::int64_t>(numel_)}, options);
  flat_gradients_ = torch::zeros({static_cast<std::int64_t>(numel_)}, options);
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& p = params_[i];
      torch::Tensor home = alias(flat_parameters_, layers_[i].offset, p.sizes());
      home.copy_(p);
      p.set_data(home);
      grad_views_.push_back(alias(flat_gradients_, layers_[i].offset, p.sizes()));
    }
  }
  reattach_gradients();
}

void FlatModule::reattach_gradients() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i];
    const torch::Tensor& view = grad_views_[i];
    const torch::Tensor& grad = p.grad();
    if (grad.defined() && grad.data_ptr() == view.data_ptr()) continue;
    torch::NoGradGuard no_grad;
    if (grad.defined()) {
      view.copy_(grad);
    } else {
      view.zero_();
    }
    p.mutable_grad() = view;
  }
}

void FlatModule::zero_grad() {
  std::memset(flat_gradients_.data_ptr<float>(), 0, numel_ * sizeof(float));
  reattach_gradients();
}

// Replicas start equal: rank 0's parameters and buffers.
void DataParallel::start() {
  broadcast_parameters(0);
  broadcast_buffers(0);
}

void DataParallel::zero_grad() {
  flat_.zero_grad();
  if (pipeline_) pipeline_->begin_step(step_, epoch_hint_);
}

std::size_t DataParallel::hook_arrivals() const {
  return pipeline_ ? pipeline_->last_hook_arrivals() : 0;
}

StepContext DataParallel::context(std::int64_t bucket, double epoch) const {
  StepContext ctx;
  ctx.step = step_;
  ctx.epoch = epoch;
  ctx.rank = comm_.rank();
  ctx.world = comm_.size();
  ctx.layers = bucket_layers_[static_cast<std::size_t>(bucket)];
  ctx.bucket = bucket;
  return ctx;
}

StepMetrics DataParallel::synchronize(double epoch) {
  StepMetrics metrics;
  if (pipeline_) {
    // A step whose zero_grad() did not start it (user code that zeroes
    // otherwise) runs entirely here.
    pipeline_->begin_step(step_, epoch);
    metrics = pipeline_->finish_step();
  } else {
    flat_.reattach_gradients();
    metrics = syncs_.front()->synchronize(gradients(), context(0, epoch), comm_);
  }
  ++step_;
  epoch_hint_ = epoch;
  return metrics;
}

StepMetrics DataParallel::synchronize(std::span<float> values, double epoch) {
  if (pipeline_ || values.size() != numel()) {
    throw InvalidArgument(fmt::format(
        "[DataParallel] synchronize(values): {} values for {} parameters{}", values.size(), numel(),
        pipeline_ ? " (and a pipelined DataParallel synchronizes its own gradients only)" : ""));
  }
  StepMetrics metrics = syncs_.front()->synchronize(values, context(0, epoch), comm_);
  ++step_;
  epoch_hint_ = epoch;
  return metrics;
}

void DataParallel::broadcast_parameters(int root) {
  comm_.broadcast(std::as_writable_bytes(parameters()), root);
}

void DataParallel::broadcast_buffers(int root) {
  for (const torch::Tensor& buffer : module_.buffers(/*recurse=*/true)) {
    if (!buffer.is_contiguous() || !buffer.device().is_cpu()) {
      throw NotSupported("[DataParallel] module buffers must be contiguous CPU tensors");
    }
    comm_.broadcast(tensor_bytes(buffer), root);
  }
}

void DataParallel::save(StateWriter& writer) const {
  writer.tag("data_parallel");
  writer.value<std::int64_t>(step_);
  writer.value<std::uint64_t>(numel());
  const auto buffers = module_.buffers(/*recurse=*/true);
  writer.value<std::uint64_t>(buffers.size());
  for (const torch::Tensor& buffer : buffers) {
    const auto bytes = tensor_bytes(buffer);
    writer.array<std::byte>(bytes);
  }
  writer.value<std::uint64_t>(syncs_.size());
  for (const auto& sync : syncs_) sync->save(writer);
}

void DataParallel::load(StateReader& reader) {
  reader.expect_tag("data_parallel");
  step_ = reader.value<std::int64_t>();
  const auto numel = reader.value<std::uint64_t>();
  if (numel != this->numel()) {
    throw Error(fmt::format(
        "[DataParallel] the saved state is of a model with {} parameters, this one has {}", numel,
        this->numel()));
  }
  const auto buffers = module_.buffers(/*recurse=*/true);
  const auto count = reader.value<std::uint64_t>();
  if (count != buffers.size()) {
    throw Error(fmt::format("[DataParallel] the saved state has {} buffers, this model has {}",
                            count, buffers.size()));
  }
  for (const torch::Tensor& buffer : buffers) reader.array_into<std::byte>(tensor_bytes(buffer));
  const auto syncs = reader.value<std::uint64_t>();
  if (syncs != syncs_.size()) {
    throw Error(fmt::format(
        "[DataParallel] the saved state has {} synchronization buckets, this run {} (another "
        "--bucket-mb?)",
        syncs, syncs_.size()));
  }
  for (const auto& sync : syncs_) sync->load(reader);
}

}  // namespace sparsecomm
