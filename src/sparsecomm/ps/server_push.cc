// The server's pushes (server.h): a push's checks and its payload's
// receive, then BSP staging and the step of all W pushes, or under
// ASP/SSP/DSSP the update on arrival (parameter_server.h, "Update rule").

#include <algorithm>
#include <bit>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/ps/server.h"

namespace sparsecomm::ps {

bool Server::serve_push(int p) {
  Slot& slot = slot_of(p);
  const RequestHeader h = slot.header;
  if (h.clock != slot.pushes) {
    throw CommError(who() + fmt::format("{} pushed step {}, expected step {} (pushes must "
                                        "carry consecutive clocks)",
                                        worker_name(p), h.clock, slot.pushes));
  }
  if (bsp() && h.clock > version_) return false;  // a later step: wait for this one
  if (bsp() && (h.clock < version_ || slot.staged)) {
    throw CommError(who() + fmt::format("{} pushed step {} but the shard is at step {}",
                                        worker_name(p), h.clock, version_));
  }
  const std::size_t n = shard_.size();
  if (h.sparse == 0 && h.count != n) {
    throw CommError(who() + fmt::format("{} pushed a dense gradient of {} floats, the shard "
                                        "has {}",
                                        worker_name(p), h.count, n));
  }
  if (h.sparse != 0 && h.count > n) {
    throw CommError(who() + fmt::format("{} pushed {} sparse values into a shard of {}",
                                        worker_name(p), h.count, n));
  }
  // Post the payload's receive (sent right after the header); the run
  // loop calls finish_push() when it has arrived.
  const auto count = static_cast<std::size_t>(h.count);
  if (h.sparse == 0) {
    slot.dense.resize(n);
    slot.payload = comm_.irecv(std::as_writable_bytes(std::span<float>(slot.dense)),
                               layout_.worker_rank(p), kTagPushPayload);
  } else {
    slot.sparse.resize(2 * count);
    slot.payload = count > 0 ? comm_.irecv(std::as_writable_bytes(std::span(slot.sparse)),
                                           layout_.worker_rank(p), kTagPushPayload)
                             : Request();
  }
  slot.receiving = true;
  return true;
}

// Worker p's push payload has arrived: stage it (BSP) or apply it.
void Server::finish_push(int p) {
  Slot& slot = slot_of(p);
  const RequestHeader h = slot.header;
  const std::vector<float>& dense = slot.dense;
  const std::vector<std::uint32_t>& words = slot.sparse;
  const auto count = static_cast<std::size_t>(h.count);
  std::span<const std::byte> payload;
  if (h.sparse == 0) {
    payload = std::as_bytes(std::span<const float>(dense));
  } else {
    check_indices(p, words, count);
    payload = std::as_bytes(std::span<const std::uint32_t>(words));
  }
  log_.bytes_received += payload.size();
  ++slot.pushes;
  if (controller_) controller_->pushed(p, slot.pushes, now_s());
  const std::uint64_t fingerprint = push_fingerprint(p, h.clock, payload);
  const double sum = payload_sum(h, dense, words);
  if (bsp()) {
    slot.staged = true;
    slot.staged_header = h;
    slot.staged_fingerprint = fingerprint;
    slot.staged_sum = sum;
    if (++staged_ == workers()) apply_bsp_step();
    return;
  }
  // ASP/SSP/DSSP: apply on arrival as 1/W of a step (gradient and weight
  // decay alike), so that W pushes weigh one synchronous step, with the
  // pushing worker's own momentum buffer (see optimizers_).
  const double share = 1.0 / static_cast<double>(workers());
  FlatOptimizer& optimizer = *optimizers_[static_cast<std::size_t>(p)];
  complete_pulls();
  if (h.sparse == 0) {
    optimizer.step(params_, dense, h.learning_rate, share);
  } else {
    for (std::size_t j = 0; j < count; ++j) {
      gradient_[words[j]] = std::bit_cast<float>(words[count + j]);
    }
    optimizer.step(params_, gradient_, h.learning_rate, share);
    for (std::size_t j = 0; j < count; ++j) gradient_[words[j]] = 0.0f;
  }
  record_applied(p, h, fingerprint, sum, sizeof(RequestHeader) + payload.size());
  ++version_;
}

double Server::payload_sum(const RequestHeader& h, const std::vector<float>& dense,
                           const std::vector<std::uint32_t>& words) {
  double sum = 0.0;
  if (h.sparse == 0) {
    for (const float v : dense) sum += v;
  } else {
    const auto count = static_cast<std::size_t>(h.count);
    for (std::size_t j = 0; j < count; ++j) sum += std::bit_cast<float>(words[count + j]);
  }
  return sum;
}

void Server::check_indices(int p, const std::vector<std::uint32_t>& words,
                           std::size_t count) const {
  for (std::size_t j = 0; j < count; ++j) {
    if (words[j] >= shard_.size() || (j > 0 && words[j] <= words[j - 1])) {
      throw CommError(who() + fmt::format("{} pushed index {} at position {}: indices must be "
                                          "strictly ascending and below the shard size {}",
                                          worker_name(p), words[j], j, shard_.size()));
    }
  }
}

// BSP: all W pushes of step version_ are staged; sum them in worker
// order, divide by W, one optimizer step.
void Server::apply_bsp_step() {
  const double lr = slot_of(0).staged_header.learning_rate;
  for (int p = 0; p < workers(); ++p) {
    const Slot& slot = slot_of(p);
    if (slot.staged_header.learning_rate != lr) {
      throw InvalidArgument(who() + fmt::format("BSP step {}: worker 0 pushed learning rate {}, "
                                                "{} pushed {}; every worker must pass the same "
                                                "learning rate",
                                                version_, lr, worker_name(p),
                                                slot.staged_header.learning_rate));
    }
    if (slot.staged_header.sparse == 0) {
      for (std::size_t i = 0; i < gradient_.size(); ++i) gradient_[i] += slot.dense[i];
    } else {
      const auto count = static_cast<std::size_t>(slot.staged_header.count);
      for (std::size_t j = 0; j < count; ++j) {
        gradient_[slot.sparse[j]] += std::bit_cast<float>(slot.sparse[count + j]);
      }
    }
  }
  const float w = static_cast<float>(workers());
  for (float& g : gradient_) g /= w;
  complete_pulls();
  optimizers_.front()->step(params_, gradient_, lr);
  std::fill(gradient_.begin(), gradient_.end(), 0.0f);
  for (int p = 0; p < workers(); ++p) {
    Slot& slot = slot_of(p);
    const std::size_t payload = slot.staged_header.sparse == 0
                                    ? shard_.size() * sizeof(float)
                                    : static_cast<std::size_t>(slot.staged_header.count) * 8;
    record_applied(p, slot.staged_header, slot.staged_fingerprint, slot.staged_sum,
                   sizeof(RequestHeader) + payload);
    slot.staged = false;
  }
  staged_ = 0;
  ++version_;
}

}  // namespace sparsecomm::ps
