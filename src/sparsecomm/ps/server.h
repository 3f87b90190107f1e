#pragma once
// Internal to the ps layer: the server that run_server()
// (parameter_server.h) runs on one server rank, its shard, the shard's
// optimizer and BSP staging; server 0 also answers BEGIN from its clock
// controller (clock_controller.h). Its parts live in four files:
//   server.cc             serving: the request loop, pulls, BEGIN (clocks)
//   server_push.cc        pushes: their checks, BSP staging, the update
//   server_checkpoint.cc  a checkpoint's cut and the server's state
//   server_log.cc         the ServerLog: applied pushes, grants, its state

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/optim/optimizer.h"
#include "sparsecomm/ps/clock_controller.h"
#include "sparsecomm/ps/layout.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/ps/protocol.h"

namespace sparsecomm::ps {

class Server {
 public:
  // Starts from `initial` (the shard's parameters) or, when
  // checkpoints.resume holds a state, from that state (Error when it is of
  // another server, shard or model). Keeps references to every argument
  // but `initial`.
  Server(Communicator& comm, const ServerLayout& layout, const PsOptions& options,
         std::span<const float> initial, const ServerCheckpoints& checkpoints);

  // Serves until every worker has sent DONE; returns the log with the
  // final shard.
  ServerLog run();

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
  // "PUSH", "PULL", ...: a request kind in messages.
  static const char* kind_name(std::uint32_t kind);
  bool bsp() const { return options_.model.kind == SyncModelKind::kBsp; }

  // server.cc: the request loop, pulls, BEGIN.
  void post(int p);
  void receive(int p);
  void serve_held();
  bool serve(int p);
  bool serve_pull(int p);
  void complete_pulls();
  bool serve_begin(int p);
  void idle_check();

  // server_push.cc: a push's checks, its payload, BSP staging, the update.
  bool serve_push(int p);
  void finish_push(int p);
  static double payload_sum(const RequestHeader& h, const std::vector<float>& dense,
                            const std::vector<std::uint32_t>& words);
  void check_indices(int p, const std::vector<std::uint32_t>& words, std::size_t count) const;
  void apply_bsp_step();

  // server_checkpoint.cc: PAUSE, the cut, the server's state.
  bool serve_pause(int p);
  void cut();
  void save(StateWriter& w) const;
  void load(StateReader& r);

  // server_log.cc: the log's records.
  void record_applied(int p, const RequestHeader& h, std::uint64_t fingerprint, double sum,
                      std::size_t bytes);
  BeginGrant record_grant(int p, const ClockController::Decision& decision);

  Communicator& comm_;
  const ServerLayout& layout_;
  const PsOptions& options_;
  const ServerCheckpoints& checkpoints_;
  int server_;
  Range shard_;
  std::optional<ClockController> controller_;  // server 0 only
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

// The log's counters and records (pushes, values, sums, pulls, bytes,
// applied pushes, grants, waits), not its server, shard, version,
// parameters or time: the server's own state holds those.
void save_log(StateWriter& w, const ServerLog& log);
// Reads what save_log() wrote into `log`'s counters and records.
void load_log(StateReader& r, ServerLog& log);

}  // namespace sparsecomm::ps
