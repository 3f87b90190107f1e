// run_server() and the server's serving (server.h): the request loop, the
// holding and serving of requests, pulls, and server 0's answer to BEGIN
// from its clock controller. Pushes are in server_push.cc, the cut and the
// state in server_checkpoint.cc, the log's records in server_log.cc.

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/ps/server.h"

namespace sparsecomm::ps {
namespace {

// Idle polls that only yield before the server starts sleeping between polls.
constexpr int kIdleYields = 64;
constexpr auto kIdleSleep = std::chrono::microseconds(100);

}  // namespace

const char* Server::kind_name(std::uint32_t kind) {
  switch (static_cast<RequestKind>(kind)) {
    case RequestKind::kPush:
      return "PUSH";
    case RequestKind::kPull:
      return "PULL";
    case RequestKind::kBegin:
      return "BEGIN";
    case RequestKind::kDone:
      return "DONE";
    case RequestKind::kPause:
      return "PAUSE";
  }
  return "unknown request";
}

Server::Server(Communicator& comm, const ServerLayout& layout, const PsOptions& options,
               std::span<const float> initial, const ServerCheckpoints& checkpoints)
    : comm_(comm),
      layout_(layout),
      options_(options),
      checkpoints_(checkpoints),
      server_(layout.server_index(comm.rank())),
      shard_(layout.shard(server_)),
      params_(initial.begin(), initial.end()),
      gradient_(shard_.size(), 0.0f),
      slots_(static_cast<std::size_t>(layout.workers())) {
  log_.server = server_;
  log_.shard = shard_;
  if (server_ == 0) {
    controller_.emplace(options.model, layout.workers());
    log_.waits.assign(slots_.size(), WaitStats{});
  }
  const int optimizers = options.model.kind == SyncModelKind::kBsp ? 1 : layout.workers();
  for (int i = 0; i < optimizers; ++i) {
    optimizers_.push_back(make_flat_optimizer(options.optimizer));
  }
  if (!checkpoints.resume.empty()) {
    StateReader state(checkpoints.resume);
    load(state);
    if (!state.at_end()) throw Error(who() + "the saved state has trailing data");
  }
}

ServerLog Server::run() {
  running_ = 0;
  for (int p = 0; p < workers(); ++p) {
    if (slot_of(p).done) continue;
    post(p);
    ++running_;
  }
  last_progress_ = Clock::now();
  int idle = 0;
  while (running_ > 0) {
    bool progress = false;
    for (int p = 0; p < workers(); ++p) {
      Slot& slot = slot_of(p);
      if (slot.receiving && slot.payload.test()) {
        slot.receiving = false;
        progress = true;
        finish_push(p);
        if (!slot.done) post(p);
      }
      if (!slot.posted || !slot.request.test()) continue;
      slot.posted = false;
      progress = true;
      receive(p);
    }
    if (progress) {
      serve_held();
      if (paused_ > 0 && paused_ == running_) cut();
      last_progress_ = Clock::now();
      idle = 0;
      continue;
    }
    idle_check();
    if (++idle < kIdleYields) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kIdleSleep);
    }
  }
  if (staged_ > 0) {
    throw CommError(who() + fmt::format("BSP step {}: only {} of {} workers pushed it before "
                                        "all finished; every worker must run the same number "
                                        "of steps",
                                        version_, staged_, workers()));
  }
  complete_pulls();
  log_.version = version_;
  log_.parameters = std::move(params_);
  log_.seconds = now_s();
  return std::move(log_);
}

void Server::post(int p) {
  Slot& slot = slot_of(p);
  slot.request =
      comm_.irecv(writable_object_bytes(slot.header), layout_.worker_rank(p), kTagRequest);
  slot.posted = true;
}

// A request arrived from worker p: check it, serve it or hold it.
void Server::receive(int p) {
  Slot& slot = slot_of(p);
  const RequestHeader& h = slot.header;
  log_.bytes_received += sizeof(RequestHeader);
  const auto kind = static_cast<RequestKind>(h.kind);
  if (kind != RequestKind::kPush && kind != RequestKind::kPull && kind != RequestKind::kBegin &&
      kind != RequestKind::kDone && kind != RequestKind::kPause) {
    throw CommError(who() + fmt::format("{} sent request kind {}; is it running the same "
                                        "sparsecomm?",
                                        worker_name(p), h.kind));
  }
  if (kind == RequestKind::kBegin && !controller_) {
    throw CommError(who() + fmt::format("{} sent BEGIN to a server that is not the controller "
                                        "(rank {})",
                                        worker_name(p), layout_.controller_rank()));
  }
  if (controller_) controller_->new_request(p);
  if (serve(p)) {
    if (!slot.done && !slot.receiving && !slot.paused) post(p);
  } else {
    slot.held = true;
    slot.held_since = Clock::now();
  }
}

// Serves every held request that can be served now, until none can.
void Server::serve_held() {
  for (bool changed = true; changed;) {
    changed = false;
    for (int p = 0; p < workers(); ++p) {
      Slot& slot = slot_of(p);
      if (!slot.held || !serve(p)) continue;
      slot.held = false;
      if (!slot.done && !slot.receiving && !slot.paused) post(p);
      changed = true;
    }
  }
}

// False: the request must wait (held). A push is served once its payload
// receive is posted (slot.receiving); finish_push() completes it.
bool Server::serve(int p) {
  Slot& slot = slot_of(p);
  switch (static_cast<RequestKind>(slot.header.kind)) {
    case RequestKind::kPush:
      return serve_push(p);
    case RequestKind::kPull:
      return serve_pull(p);
    case RequestKind::kBegin:
      return serve_begin(p);
    case RequestKind::kDone:
      slot.done = true;
      if (controller_) controller_->finished(p);  // it leaves the minimum clock
      --running_;
      return true;
    case RequestKind::kPause:
      return serve_pause(p);
  }
  return true;
}

bool Server::serve_pull(int p) {
  const RequestHeader& h = slot_of(p).header;
  // BSP: a worker at clock c reads the parameters after step c - 1.
  if (bsp() && version_ < h.clock) return false;
  // Gated models: the reader sees, on every server, each running worker's
  // pushes up to its grant's min clock (the controller granted on pushes
  // it had received; this server's copies may still be in flight).
  const auto floor = static_cast<std::int64_t>(h.count);
  for (const Slot& slot : slots_) {
    if (!slot.done && slot.pushes < floor) return false;
  }
  Slot& slot = slot_of(p);
  for (Request& sent : slot.pull_sends) sent.wait();
  slot.pull_version = version_;
  slot.pull_sends[0] =
      comm_.isend(object_bytes(slot.pull_version), layout_.worker_rank(p), kTagPullVersion);
  slot.pull_sends[1] = comm_.isend(std::as_bytes(std::span<const float>(params_)),
                                   layout_.worker_rank(p), kTagPullPayload);
  ++log_.pulls;
  log_.bytes_sent += sizeof(version_) + params_.size() * sizeof(float);
  return true;
}

// Waits for every pull reply in flight: before params_ changes or leaves.
void Server::complete_pulls() {
  for (Slot& slot : slots_) {
    for (Request& sent : slot.pull_sends) sent.wait();
  }
}

bool Server::serve_begin(int p) {
  Slot& slot = slot_of(p);
  const RequestHeader& h = slot.header;
  if (h.clock != controller_->clock(p)) {
    throw CommError(who() + fmt::format("{} asked to begin at clock {}, but pushed {} steps",
                                        worker_name(p), h.clock, controller_->clock(p)));
  }
  const ClockController::Decision decision = controller_->decide(p);
  if (!decision.grant) return false;
  const BeginGrant record = record_grant(p, decision);
  const GrantReply reply{decision.min_clock, record.blocked ? 1 : 0, decision.extra ? 1 : 0,
                         decision.dssp_r};
  comm_.send(object_bytes(reply), layout_.worker_rank(p), kTagGrant);
  log_.bytes_sent += sizeof(reply);
  return true;
}

// Nothing arrived: detect a stuck protocol, a silent worker, an aborted world.
// (An aborted world surfaces from test() on the posted receives.)
void Server::idle_check() {
  const auto now = Clock::now();
  bool any_held = false;
  bool any_posted = false;
  std::string held;
  std::string waiting;
  for (int p = 0; p < workers(); ++p) {
    const Slot& slot = slot_of(p);
    if (slot.held) {
      any_held = true;
      held += fmt::format("{}{} {} at clock {}", held.empty() ? "" : ", ", worker_name(p),
                          kind_name(slot.header.kind), slot.header.clock);
    }
    if (slot.posted || slot.receiving) {
      any_posted = true;
      waiting += fmt::format("{}{}{}", waiting.empty() ? "" : ", ", worker_name(p),
                             slot.receiving ? " (a push payload)" : "");
    }
  }
  if (any_held && !any_posted) {
    throw CommError(who() +
                    fmt::format("stuck under {}: every running worker waits ({}) and no other "
                                "request can come; under BSP every worker must run the same "
                                "number of steps and call pull() after begin_step()",
                                options_.model.name(), held));
  }
  if (now - last_progress_ > comm_.timeout()) {
    throw TimeoutError(who() + fmt::format("no request from {} for {} ms{}{}", waiting,
                                           comm_.timeout().count(),
                                           held.empty() ? "" : "; held: ", held));
  }
}

}  // namespace sparsecomm::ps

namespace sparsecomm {

ServerLog run_server(Communicator& comm, const ServerLayout& layout, const PsOptions& options,
                     std::span<const float> initial_shard, const ServerCheckpoints& checkpoints) {
  if (layout.world_size() != comm.size()) {
    throw InvalidArgument(fmt::format("[ps] rank {}: the layout ({}) has {} ranks, the world {}",
                                      comm.rank(), layout.describe(), layout.world_size(),
                                      comm.size()));
  }
  if (!layout.is_server_rank(comm.rank())) {
    throw InvalidArgument(
        fmt::format("[ps] rank {} is a worker, not a server ({}); drive it "
                    "with a PsWorker",
                    comm.rank(), layout.describe()));
  }
  validate_ps_options(options);
  const int server = layout.server_index(comm.rank());
  const Range shard = layout.shard(server);
  if (initial_shard.size() != shard.size()) {
    throw InvalidArgument(fmt::format(
        "[ps] server {} (rank {}): initial shard of {} floats, its "
        "shard [{}, {}) has {}",
        server, comm.rank(), initial_shard.size(), shard.begin, shard.end, shard.size()));
  }
  ps::Server s(comm, layout, options, initial_shard, checkpoints);
  return s.run();
}

}  // namespace sparsecomm
