#include "sparsecomm/optim/muon.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

FlatMuon::FlatMuon(MuonOptions options, AdamWOptions rest)
    : options_(std::move(options)), rest_optimizer_(rest) {
  if (!(options_.momentum >= 0.0 && options_.momentum < 1.0)) {
    throw InvalidArgument(fmt::format("[muon] momentum {} must lie in [0, 1)", options_.momentum));
  }
  if (options_.ns_steps < 1) {
    throw InvalidArgument(fmt::format(
        "[muon] {} Newton-Schulz iterations: need at least 1 (5 is Muon's)", options_.ns_steps));
  }
  if (options_.matrices.empty()) {
    throw InvalidArgument(
        "[muon] no matrix to orthogonalize: Muon needs the model's matrix shapes (the trainer "
        "gives them; a parameter server's shards do not hold whole matrices)");
  }
  std::size_t end = 0;
  for (const MatrixBlock& m : options_.matrices) {
    if (m.rows == 0 || m.cols == 0 || m.offset < end) {
      throw InvalidArgument(fmt::format(
          "[muon] the matrix at offset {} ({} x {}) is empty or overlaps the one before (which "
          "ends at {}): give matrices in order, apart",
          m.offset, m.rows, m.cols, end));
    }
    end = m.offset + m.rows * m.cols;
  }
}

void FlatMuon::find_rest(std::size_t numel) {
  const MatrixBlock& last = options_.matrices.back();
  if (last.offset + last.rows * last.cols > numel) {
    throw InvalidArgument(
        fmt::format("[muon] the matrix at offset {} ({} x {}) ends past the {} parameters",
                    last.offset, last.rows, last.cols, numel));
  }
  rest_ranges_.clear();
  std::size_t at = 0;
  for (const MatrixBlock& m : options_.matrices) {
    if (m.offset > at) rest_ranges_.emplace_back(at, m.offset);
    at = m.offset + m.rows * m.cols;
  }
  if (at < numel) rest_ranges_.emplace_back(at, numel);
  rest_numel_ = numel;
}

void FlatMuon::step(std::span<float> parameters, std::span<const float> gradient,
                    double learning_rate, double share) {
  if (parameters.size() != gradient.size()) {
    throw InvalidArgument(fmt::format("[muon] {} parameters but {} gradient elements",
                                      parameters.size(), gradient.size()));
  }
  if (!(share > 0.0 && share <= 1.0)) {
    throw InvalidArgument(fmt::format("[muon] share {} of a step: must be in (0, 1]", share));
  }
  if (momentum_.size() != parameters.size()) {
    if (steps_ > 0) {
      throw InvalidArgument(fmt::format("[muon] {} elements, but the momentum has {}",
                                        parameters.size(), momentum_.size()));
    }
    momentum_.assign(parameters.size(), 0.0f);
  }
  if (rest_numel_ != parameters.size()) find_rest(parameters.size());
  ++steps_;

  // Everything outside the matrices: one AdamW step on the gathered elements.
  rest_parameters_.clear();
  rest_gradient_.clear();
  for (const auto& [begin, end] : rest_ranges_) {
    rest_parameters_.insert(rest_parameters_.end(), parameters.begin() + begin,
                            parameters.begin() + end);
    rest_gradient_.insert(rest_gradient_.end(), gradient.begin() + begin, gradient.begin() + end);
  }
  if (!rest_parameters_.empty()) {
    rest_optimizer_.step(rest_parameters_, rest_gradient_, learning_rate, share);
    std::size_t at = 0;
    for (const auto& [begin, end] : rest_ranges_) {
      std::copy_n(rest_parameters_.begin() + at, end - begin, parameters.begin() + begin);
      at += end - begin;
    }
  }

  const double lr = learning_rate * share;
  const auto keep = static_cast<float>(options_.momentum);
  const auto take = static_cast<float>(1.0 - options_.momentum);
  const auto decay = static_cast<float>(1.0 - lr * rest_optimizer_.options().weight_decay);
  for (const MatrixBlock& m : options_.matrices) {
    const std::size_t size = m.rows * m.cols;
    float* w = parameters.data() + m.offset;
    const float* g = gradient.data() + m.offset;
    float* buffer = momentum_.data() + m.offset;
    update_.resize(size);
    for (std::size_t i = 0; i < size; ++i) {
      buffer[i] = keep * buffer[i] + take * g[i];
      update_[i] = options_.nesterov ? take * g[i] + keep * buffer[i] : buffer[i];
    }
    newton_schulz(update_, m.rows, m.cols, options_.ns_steps, scratch_);
    const auto step_size =
        static_cast<float>(lr * 0.2 * std::sqrt(static_cast<double>(std::max(m.rows, m.cols))));
    for (std::size_t i = 0; i < size; ++i) {
      w[i] *= decay;
      w[i] -= step_size * update_[i];
    }
  }
}

void FlatMuon::save(StateWriter& writer) const {
  writer.tag("muon");
  writer.value<std::int64_t>(steps_);
  writer.array<float>(momentum_);
  rest_optimizer_.save(writer);
}

void FlatMuon::load(StateReader& reader) {
  reader.expect_tag("muon");
  steps_ = reader.value<std::int64_t>();
  momentum_ = reader.array<float>();
  rest_optimizer_.load(reader);
  rest_numel_ = 0;
}

}  // namespace sparsecomm
