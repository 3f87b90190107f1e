// The server's checkpoints (server.h; the cut of parameter_server.h):
// PAUSE, the cut once every running worker has paused, and the server's
// state that ServerCheckpoints stores and a resumed server starts from.

#include <chrono>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/ps/server.h"

namespace sparsecomm::ps {

// Worker p paused at a cut after its pushes: no request of it is received
// until the cut is taken.
bool Server::serve_pause(int p) {
  Slot& slot = slot_of(p);
  if (!checkpoints_.at_cut) {
    throw CommError(who() + fmt::format("{} paused for a checkpoint, but this server was "
                                        "started without checkpoints",
                                        worker_name(p)));
  }
  if (slot.header.clock != slot.pushes) {
    throw CommError(who() + fmt::format("{} paused at clock {} after pushing {} steps",
                                        worker_name(p), slot.header.clock, slot.pushes));
  }
  slot.paused = true;
  ++paused_;
  return true;
}

// Every running worker has paused: the shard holds exactly their pushes
// below the cut's clock. Saves the state, then serves on.
void Server::cut() {
  std::int64_t clock = -1;
  for (int p = 0; p < workers(); ++p) {
    const Slot& slot = slot_of(p);
    if (slot.done) continue;
    if (slot.held) {
      throw CommError(who() + fmt::format("{} has a {} held at a checkpoint's cut", worker_name(p),
                                          kind_name(slot.header.kind)));
    }
    if (clock >= 0 && slot.pushes != clock) {
      throw CommError(who() + fmt::format("workers paused at different clocks ({} at {}, "
                                          "others at {}); every worker must checkpoint after "
                                          "the same step",
                                          worker_name(p), slot.pushes, clock));
    }
    clock = slot.pushes;
  }
  complete_pulls();
  StateWriter state;
  save(state);
  checkpoints_.at_cut(clock, params_, state.bytes());
  paused_ = 0;
  for (int p = 0; p < workers(); ++p) {
    Slot& slot = slot_of(p);
    if (!slot.paused) continue;
    slot.paused = false;
    post(p);
  }
}

// Everything that defines the server's future and its log, at a cut.
void Server::save(StateWriter& w) const {
  w.tag("ps-server");
  w.value<std::int32_t>(server_);
  w.value<std::uint64_t>(shard_.begin);
  w.value<std::uint64_t>(shard_.end);
  w.value<double>(now_s());
  w.array<float>(params_);
  w.value<std::int64_t>(version_);
  w.value<std::uint64_t>(optimizers_.size());
  for (const auto& optimizer : optimizers_) optimizer->save(w);
  for (const Slot& slot : slots_) {
    w.value<std::int64_t>(slot.pushes);
    w.value<std::uint8_t>(slot.done ? 1 : 0);
  }
  w.value<std::uint8_t>(controller_ ? 1 : 0);
  if (controller_) controller_->save(w);
  save_log(w, log_);
}

// Restores what save() wrote; Error when it is of another server, shard or
// sync model.
void Server::load(StateReader& r) {
  r.expect_tag("ps-server");
  const auto server = r.value<std::int32_t>();
  const auto begin = r.value<std::uint64_t>();
  const auto end = r.value<std::uint64_t>();
  if (server != server_ || begin != shard_.begin || end != shard_.end) {
    throw Error(who() + fmt::format("the saved state is of server {} with shard [{}, {}), this "
                                    "one serves [{}, {})",
                                    server, begin, end, shard_.begin, shard_.end));
  }
  start_ = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(r.value<double>()));
  r.array_into<float>(std::span<float>(params_));
  version_ = r.value<std::int64_t>();
  const auto optimizers = r.value<std::uint64_t>();
  if (optimizers != optimizers_.size()) {
    throw Error(who() + fmt::format("the saved state has {} optimizers, this sync model {}",
                                    optimizers, optimizers_.size()));
  }
  for (const auto& optimizer : optimizers_) optimizer->load(r);
  for (Slot& slot : slots_) {
    slot.pushes = r.value<std::int64_t>();
    slot.done = r.value<std::uint8_t>() != 0;
  }
  if ((r.value<std::uint8_t>() != 0) != controller_.has_value()) {
    throw Error(who() + "the saved state is of another server (the controller or not)");
  }
  if (controller_) controller_->load(r);
  load_log(r, log_);
}

}  // namespace sparsecomm::ps
