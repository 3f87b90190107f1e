#pragma once
// What the binding's classes share: a tensor's floats and a copy of floats
// as a tensor, the tensors of a flat gradient (its layers) and a step's
// context, and a step's saved state as Python bytes.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/Tensor.h>
#include <pybind11/pybind11.h>

#include "group_sync.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/sparsify/sparsifier.h"

namespace sparsecomm::python {

// The tensor's floats, which must be a contiguous float32 CPU tensor.
std::span<float> floats_of(const at::Tensor& tensor, const char* what);

// The tensors a flat gradient is made of, from their sizes (in order, summing
// to `numel`) and, where given, their first dimensions (0 for vectors; one
// per size); none: one tensor. DEFT selects per tensor, PowerSGD views each
// as rows x size/rows.
std::vector<LayerSpan> layer_spans(const std::optional<std::vector<std::int64_t>>& sizes,
                                   std::size_t numel,
                                   const std::optional<std::vector<std::int64_t>>& rows = {});

StepContext context_of(const Communicator& comm, std::int64_t step, double epoch,
                       std::int64_t bucket);

// One group's step, its tensors checked against the gradient's length.
GroupStep group_step_of(std::int64_t numel, std::int64_t step, double epoch, std::int64_t bucket,
                        const std::optional<std::vector<std::int64_t>>& layers,
                        const std::optional<std::vector<std::int64_t>>& rows);

// A copy of `values` as a float32 tensor.
at::Tensor tensor_copy(std::span<const float> values);

pybind11::bytes state_of(const auto& step) {
  StateWriter writer;
  step.save(writer);
  const auto& bytes = writer.bytes();
  return pybind11::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void load_state_into(auto& step, const pybind11::bytes& state) {
  const std::string_view view = state;
  StateReader reader(std::as_bytes(std::span<const char>(view.data(), view.size())));
  step.load(reader);
}

}  // namespace sparsecomm::python
