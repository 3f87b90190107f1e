#include "conversions.h"

#include <torch/types.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm::python {

std::span<float> floats_of(const at::Tensor& tensor, const char* what) {
  if (tensor.device().type() != c10::DeviceType::CPU || tensor.scalar_type() != at::kFloat ||
      !tensor.is_contiguous()) {
    throw InvalidArgument(std::string(what) +
                          " must be a contiguous float32 CPU tensor (call .float().contiguous() "
                          "on it, or copy it to the CPU)");
  }
  return {tensor.data_ptr<float>(), static_cast<std::size_t>(tensor.numel())};
}

std::vector<LayerSpan> layer_spans(const std::optional<std::vector<std::int64_t>>& sizes,
                                   std::size_t numel,
                                   const std::optional<std::vector<std::int64_t>>& rows) {
  std::vector<LayerSpan> spans;
  if (!sizes) return spans;
  if (rows && rows->size() != sizes->size()) {
    throw InvalidArgument("layers: " + std::to_string(rows->size()) + " first dimensions for " +
                          std::to_string(sizes->size()) + " tensors; pass one per tensor");
  }
  std::size_t offset = 0;
  for (const std::int64_t size : *sizes) {
    if (size < 0)
      throw InvalidArgument("layers: a tensor size is negative (" + std::to_string(size) + ")");
    const std::int64_t first = rows ? (*rows)[spans.size()] : 0;
    if (first < 0 || (first > 0 && size % first != 0)) {
      throw InvalidArgument("layers: tensor " + std::to_string(spans.size()) + " of " +
                            std::to_string(size) + " elements cannot have a first dimension of " +
                            std::to_string(first));
    }
    spans.push_back({"tensor" + std::to_string(spans.size()), offset,
                     static_cast<std::size_t>(size), static_cast<std::size_t>(first)});
    offset += static_cast<std::size_t>(size);
  }
  if (offset != numel) {
    throw InvalidArgument("layers: the tensor sizes sum to " + std::to_string(offset) +
                          " but the gradient has " + std::to_string(numel) +
                          " elements; pass each tensor's numel(), in the gradient's order");
  }
  return spans;
}

StepContext context_of(const Communicator& comm, std::int64_t step, double epoch,
                       std::int64_t bucket) {
  StepContext ctx;
  ctx.step = step;
  ctx.epoch = epoch;
  ctx.bucket = bucket;
  ctx.rank = comm.rank();
  ctx.world = comm.size();
  return ctx;
}

GroupStep group_step_of(std::int64_t numel, std::int64_t step, double epoch, std::int64_t bucket,
                        const std::optional<std::vector<std::int64_t>>& layers,
                        const std::optional<std::vector<std::int64_t>>& rows) {
  return {step, epoch, bucket, layer_spans(layers, static_cast<std::size_t>(numel), rows)};
}

at::Tensor tensor_copy(std::span<const float> values) {
  return torch::from_blob(const_cast<float*>(values.data()),
                          {static_cast<std::int64_t>(values.size())})
      .clone();
}

}  // namespace sparsecomm::python
