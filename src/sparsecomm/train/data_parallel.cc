#include "sparsecomm/train/data_parallel.h"

#include <cstring>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

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

DataParallel::DataParallel(torch::nn::Module& module, Communicator& comm,
                           std::unique_ptr<GradientSync> sync)
    : module_(module), comm_(comm), sync_(std::move(sync)) {
  if (!sync_) throw InvalidArgument("[DataParallel] no synchronization method given");
  for (const auto& item : module_.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    if (p.scalar_type() != torch::kFloat32 || !p.device().is_cpu()) {
      throw NotSupported(fmt::format(
          "[DataParallel] parameter '{}' is {} on {}: only float32 CPU parameters are supported",
          item.key(), std::string(c10::toString(p.scalar_type())), p.device().str()));
    }
    layers_.push_back({item.key(), numel_, static_cast<std::size_t>(p.numel())});
    numel_ += static_cast<std::size_t>(p.numel());
    params_.push_back(p);
  }
  const auto options = torch::TensorOptions().dtype(torch::kFloat32);
  flat_parameters_ = torch::empty({static_cast<std::int64_t>(numel_)}, options);
  flat_gradients_ = torch::zeros({static_cast<std::int64_t>(numel_)}, options);
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i];
    torch::Tensor home = alias(flat_parameters_, layers_[i].offset, p.sizes());
    home.copy_(p);
    p.set_data(home);
    grad_views_.push_back(alias(flat_gradients_, layers_[i].offset, p.sizes()));
  }
  reattach_gradients();
  broadcast_parameters(0);
  broadcast_buffers(0);
}

void DataParallel::reattach_gradients() {
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

void DataParallel::zero_grad() {
  std::memset(flat_gradients_.data_ptr<float>(), 0, numel_ * sizeof(float));
  reattach_gradients();
}

StepMetrics DataParallel::synchronize(double epoch) {
  reattach_gradients();
  StepContext ctx;
  ctx.step = step_;
  ctx.epoch = epoch;
  ctx.rank = comm_.rank();
  ctx.world = comm_.size();
  ctx.layers = layers_;
  StepMetrics metrics = sync_->synchronize(gradients(), ctx, comm_);
  ++step_;
  return metrics;
}

void DataParallel::broadcast_parameters(int root) {
  comm_.broadcast(tensor_bytes(flat_parameters_), root);
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
  writer.value<std::uint64_t>(numel_);
  const auto buffers = module_.buffers(/*recurse=*/true);
  writer.value<std::uint64_t>(buffers.size());
  for (const torch::Tensor& buffer : buffers) {
    const auto bytes = tensor_bytes(buffer);
    writer.array<std::byte>(bytes);
  }
  sync_->save(writer);
}

void DataParallel::load(StateReader& reader) {
  reader.expect_tag("data_parallel");
  step_ = reader.value<std::int64_t>();
  const auto numel = reader.value<std::uint64_t>();
  if (numel != numel_) {
    throw Error(fmt::format(
        "[DataParallel] the saved state is of a model with {} parameters, this one has {}", numel,
        numel_));
  }
  const auto buffers = module_.buffers(/*recurse=*/true);
  const auto count = reader.value<std::uint64_t>();
  if (count != buffers.size()) {
    throw Error(fmt::format("[DataParallel] the saved state has {} buffers, this model has {}",
                            count, buffers.size()));
  }
  for (const torch::Tensor& buffer : buffers) reader.array_into<std::byte>(tensor_bytes(buffer));
  sync_->load(reader);
}

}  // namespace sparsecomm
