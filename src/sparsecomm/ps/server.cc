// run_server(): the server side of the protocol in parameter_server.h: the
// shard, its optimizer and BSP staging; server 0 also answers BEGIN from
// its clock controller (clock_controller.h).

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/ps/clock_controller.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/ps/protocol.h"

namespace sparsecomm {
namespace {

using ps::RequestHeader;
using ps::RequestKind;

// Idle polls that only yield before the server starts sleeping between polls.
constexpr int kIdleYields = 64;
constexpr auto kIdleSleep = std::chrono::microseconds(100);

const char* kind_name(std::uint32_t kind) {
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

class Server {
 public:
  Server(Communicator& comm, const ServerLayout& layout, const PsOptions& options,
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

  ServerLog run() {
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

 private:
  // One worker's requests, served in its order: the next header is received
  // only once the current request is served (a push: its payload arrived).
  // Payloads and pull replies of different workers travel at the same time,
  // so W workers share the server's link instead of queueing for it.
  struct Slot {
    RequestHeader header;
    Request request;
    bool posted = false;
    bool held = false;
    bool receiving = false;  // a push's payload is arriving into dense/sparse
    Request payload;
    // The last pull's reply in flight; params_ changes only once it is sent.
    std::int64_t pull_version = 0;
    Request pull_sends[2];
    bool done = false;
    bool paused = false;      // at a checkpoint's cut: no request received until it is taken
    std::int64_t pushes = 0;  // pushes received from this worker
    Clock::time_point held_since;
    // BSP: the push staged for the current step.
    bool staged = false;
    RequestHeader staged_header;
    std::vector<float> dense;           // the push payload (BSP: the staged one)
    std::vector<std::uint32_t> sparse;  // indices, then value bits
    std::uint64_t staged_fingerprint = 0;
    double staged_sum = 0.0;
  };

  int workers() const { return layout_.workers(); }
  Slot& slot_of(int p) { return slots_[static_cast<std::size_t>(p)]; }
  double now_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  std::string who() const {
    return fmt::format("[ps] server {} (rank {}): ", server_, comm_.rank());
  }
  static std::string worker_name(int p) { return fmt::format("worker {} (rank {})", p, p); }
  bool bsp() const { return options_.model.kind == SyncModelKind::kBsp; }

  void post(int p) {
    Slot& slot = slot_of(p);
    slot.request = comm_.irecv(ps::writable_object_bytes(slot.header), layout_.worker_rank(p),
                               ps::kTagRequest);
    slot.posted = true;
  }

  // A request arrived from worker p: check it, serve it or hold it.
  void receive(int p) {
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
  void serve_held() {
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
  bool serve(int p) {
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

  bool serve_pause(int p) {
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
  void cut() {
    std::int64_t clock = -1;
    for (int p = 0; p < workers(); ++p) {
      const Slot& slot = slot_of(p);
      if (slot.done) continue;
      if (slot.held) {
        throw CommError(who() + fmt::format("{} has a {} held at a checkpoint's cut",
                                            worker_name(p), kind_name(slot.header.kind)));
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
  void save(StateWriter& w) const {
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
    w.value<std::int64_t>(log_.pushes);
    w.value<std::uint64_t>(log_.values);
    w.value<double>(log_.value_sum);
    w.value<std::uint64_t>(log_.fingerprint);
    w.value<std::int64_t>(log_.pulls);
    w.value<std::uint64_t>(log_.bytes_received);
    w.value<std::uint64_t>(log_.bytes_sent);
    w.value<std::uint64_t>(log_.applied.size());
    for (const AppliedPush& a : log_.applied) {
      w.value<std::int32_t>(a.worker);
      w.value<std::int64_t>(a.clock);
      w.value<std::int64_t>(a.pulled_version);
      w.value<std::int64_t>(a.staleness);
      w.value<double>(a.time_s);
      w.value<std::uint64_t>(a.values);
      w.value<std::uint64_t>(a.bytes);
    }
    w.value<std::uint64_t>(log_.grants.size());
    for (const BeginGrant& g : log_.grants) {
      w.value<std::int32_t>(g.worker);
      w.value<std::int64_t>(g.clock);
      w.value<std::int64_t>(g.min_clock);
      w.value<std::uint8_t>(g.blocked ? 1 : 0);
      w.value<std::uint8_t>(g.extra ? 1 : 0);
      w.value<std::int64_t>(g.dssp_r);
      w.value<double>(g.wait_s);
      w.value<double>(g.time_s);
    }
    w.value<std::uint64_t>(log_.waits.size());
    for (const WaitStats& s : log_.waits) {
      w.value<std::int64_t>(s.count);
      w.value<double>(s.seconds);
    }
  }

  void load(StateReader& r) {
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
    log_.pushes = r.value<std::int64_t>();
    log_.values = r.value<std::uint64_t>();
    log_.value_sum = r.value<double>();
    log_.fingerprint = r.value<std::uint64_t>();
    log_.pulls = r.value<std::int64_t>();
    log_.bytes_received = r.value<std::uint64_t>();
    log_.bytes_sent = r.value<std::uint64_t>();
    log_.applied.resize(r.count(sizeof(std::int32_t) + 6 * sizeof(std::int64_t)));
    for (AppliedPush& a : log_.applied) {
      a.worker = r.value<std::int32_t>();
      a.clock = r.value<std::int64_t>();
      a.pulled_version = r.value<std::int64_t>();
      a.staleness = r.value<std::int64_t>();
      a.time_s = r.value<double>();
      a.values = r.value<std::uint64_t>();
      a.bytes = r.value<std::uint64_t>();
    }
    log_.grants.resize(r.count(sizeof(std::int32_t) + 2 + 5 * sizeof(std::int64_t)));
    for (BeginGrant& g : log_.grants) {
      g.worker = r.value<std::int32_t>();
      g.clock = r.value<std::int64_t>();
      g.min_clock = r.value<std::int64_t>();
      g.blocked = r.value<std::uint8_t>() != 0;
      g.extra = r.value<std::uint8_t>() != 0;
      g.dssp_r = r.value<std::int64_t>();
      g.wait_s = r.value<double>();
      g.time_s = r.value<double>();
    }
    log_.waits.resize(r.count(2 * sizeof(std::int64_t)));
    for (WaitStats& s : log_.waits) {
      s.count = r.value<std::int64_t>();
      s.seconds = r.value<double>();
    }
  }

  bool serve_push(int p) {
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
                                 layout_.worker_rank(p), ps::kTagPushPayload);
    } else {
      slot.sparse.resize(2 * count);
      slot.payload = count > 0 ? comm_.irecv(std::as_writable_bytes(std::span(slot.sparse)),
                                             layout_.worker_rank(p), ps::kTagPushPayload)
                               : Request();
    }
    slot.receiving = true;
    return true;
  }

  // Worker p's push payload has arrived: stage it (BSP) or apply it.
  void finish_push(int p) {
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
    const std::uint64_t fingerprint = ps::push_fingerprint(p, h.clock, payload);
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

  static double payload_sum(const RequestHeader& h, const std::vector<float>& dense,
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

  void check_indices(int p, const std::vector<std::uint32_t>& words, std::size_t count) const {
    for (std::size_t j = 0; j < count; ++j) {
      if (words[j] >= shard_.size() || (j > 0 && words[j] <= words[j - 1])) {
        throw CommError(who() + fmt::format("{} pushed index {} at position {}: indices must be "
                                            "strictly ascending and below the shard size {}",
                                            worker_name(p), words[j], j, shard_.size()));
      }
    }
  }

  void record_applied(int p, const RequestHeader& h, std::uint64_t fingerprint, double sum,
                      std::size_t bytes) {
    AppliedPush applied;
    applied.worker = p;
    applied.clock = h.clock;
    applied.pulled_version = h.pulled_version;
    applied.staleness = version_ - h.pulled_version;
    applied.time_s = now_s();
    applied.values = static_cast<std::size_t>(h.count);
    applied.bytes = bytes;
    log_.applied.push_back(applied);
    ++log_.pushes;
    log_.values += applied.values;
    log_.value_sum += sum;
    log_.fingerprint += fingerprint;
  }

  // BSP: all W pushes of step version_ are staged; sum them in worker
  // order, divide by W, one optimizer step.
  void apply_bsp_step() {
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

  bool serve_pull(int p) {
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
    slot.pull_sends[0] = comm_.isend(ps::object_bytes(slot.pull_version), layout_.worker_rank(p),
                                     ps::kTagPullVersion);
    slot.pull_sends[1] = comm_.isend(std::as_bytes(std::span<const float>(params_)),
                                     layout_.worker_rank(p), ps::kTagPullPayload);
    ++log_.pulls;
    log_.bytes_sent += sizeof(version_) + params_.size() * sizeof(float);
    return true;
  }

  // Waits for every pull reply in flight: before params_ changes or leaves.
  void complete_pulls() {
    for (Slot& slot : slots_) {
      for (Request& sent : slot.pull_sends) sent.wait();
    }
  }

  bool serve_begin(int p) {
    Slot& slot = slot_of(p);
    const RequestHeader& h = slot.header;
    if (h.clock != controller_->clock(p)) {
      throw CommError(who() + fmt::format("{} asked to begin at clock {}, but pushed {} steps",
                                          worker_name(p), h.clock, controller_->clock(p)));
    }
    const ps::ClockController::Decision decision = controller_->decide(p);
    if (!decision.grant) return false;
    BeginGrant record;
    record.worker = p;
    record.clock = h.clock;
    record.min_clock = decision.min_clock;
    record.blocked = slot.held;
    record.extra = decision.extra;
    record.dssp_r = decision.dssp_r;
    record.wait_s =
        slot.held ? std::chrono::duration<double>(Clock::now() - slot.held_since).count() : 0.0;
    record.time_s = now_s();
    log_.grants.push_back(record);
    if (record.blocked) {
      WaitStats& waits = log_.waits[static_cast<std::size_t>(p)];
      ++waits.count;
      waits.seconds += record.wait_s;
    }
    const ps::GrantReply reply{decision.min_clock, record.blocked ? 1 : 0, decision.extra ? 1 : 0,
                               decision.dssp_r};
    comm_.send(ps::object_bytes(reply), layout_.worker_rank(p), ps::kTagGrant);
    log_.bytes_sent += sizeof(reply);
    return true;
  }

  // Nothing arrived: detect a stuck protocol, a silent worker, an aborted world.
  // (An aborted world surfaces from test() on the posted receives.)
  void idle_check() {
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

  Communicator& comm_;
  const ServerLayout& layout_;
  const PsOptions& options_;
  const ServerCheckpoints& checkpoints_;
  int server_;
  Range shard_;
  std::optional<ps::ClockController> controller_;  // server 0 only
  // The shard's optimizer state. BSP: one optimizer for the whole shard. ASP,
  // SSP, DSSP: one per worker, each with its own momentum buffer over the
  // whole shard, decayed only by that worker's pushes. Then a buffer's
  // time constant is counted in steps, as under BSP, not in pushes (W per
  // step), and the W buffers' mean follows BSP's momentum recursion: with
  // the workers in lockstep (SSP with s = 0) the W pushes of a step move
  // the shard as one BSP step does. One shared buffer, decayed at every
  // push, cost the CNN 0.7 points at s = 0 (docs/benchmarks/parameter-server.md).
  std::vector<std::unique_ptr<FlatOptimizer>> optimizers_;
  std::vector<float> params_;
  std::vector<float> gradient_;  // dense scratch, all zero between pushes
  std::vector<Slot> slots_;
  std::int64_t version_ = 0;
  int staged_ = 0;  // BSP: pushes staged for step version_
  int running_ = 0;
  int paused_ = 0;  // running workers paused for a checkpoint's cut
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_progress_;
  ServerLog log_;
};

}  // namespace

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
  Server s(comm, layout, options, initial_shard, checkpoints);
  return s.run();
}

}  // namespace sparsecomm
