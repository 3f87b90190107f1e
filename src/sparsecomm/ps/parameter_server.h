#pragma once
// The parameter-server engine (torch-free): servers own shards of the flat
// parameter vector, workers push (possibly sparsified) gradients and pull
// fresh parameters, under one of the synchronization models of
// sync_model.h. The trainer drives a PsWorker with one flat gradient per
// step; every server rank calls run_server() once.
//
// Roles (layout.h): ranks [0, W) are workers, [W, W + S) servers; server s
// owns shard s; server 0 (rank W) also runs the clock/consistency
// controller. A worker's clock c is the number of steps it has pushed.
//
// A worker's step, in this order (PsWorker enforces it):
//   begin_step()   gated models (bsp, ssp, dssp): a BEGIN request to the
//                  controller, then block for its GRANT; asp: nothing
//   pull(params)   optional (BSP needs it for synchronous semantics): a
//                  PULL request to every server, carrying the min clock of
//                  the worker's last grant; each server answers its version
//                  and its shard once every running worker's pushes up to
//                  that clock have reached it (not only the controller)
//   push(g, lr)    a PUSH to every server (an empty sparse push too), each
//                  with the worker's clock, the shard version it last
//                  pulled and the learning rate; c += 1
//   ...            finish(): a DONE to every server
//
// Checkpoints (a cut): every worker, at the same clock T between two
// steps, calls pause() (a PAUSE to every server), saves its own state
// (save()) and joins a barrier of the whole world. A server receives no
// further request from a paused worker; once every running worker has
// paused it holds every push of clocks < T and nothing else (per-worker
// order: each PAUSE arrives after that worker's pushes), answers no pull
// in flight, so it saves its state (shard, version, optimizers, clocks,
// log) through ServerCheckpoints::at_cut, which joins the barrier, and
// then serves on. A resumed world starts every worker (load()) and every
// server (ServerCheckpoints::resume) from the same cut: no push is lost
// or applied twice. A worker waits at the cut for the slowest one: under
// ASP more than the communicator's timeout behind ends the run with a
// TimeoutError.
//
// Messages (reserved tags 30100..30104 of comm/communicator.h; exact sizes,
// in send order per pair):
//   30100 worker -> server   RequestHeader (40 bytes): kind (PUSH | PULL |
//                            BEGIN | DONE), sparse flag, clock, count,
//                            pulled version, learning rate
//   30101 worker -> server   PUSH payload right after its header: dense:
//                            `count` = shard-size floats; sparse: `count`
//                            uint32 shard-relative indices (strictly
//                            ascending) then `count` floats (no payload
//                            when count is 0). Never densified on the wire.
//   30102 server -> worker   PULL reply: the shard's version (int64)
//   30103 server -> worker   PULL reply: the shard's floats, received
//                            straight into the worker's parameter slice
//   30104 controller -> worker  GRANT (GrantReply: min clock, blocked flag,
//                            DSSP extra-step decision)
//   30000..30099 worker <-> worker  partition-based schemes only (BSP): the
//                            collectives of select() and the count
//                            allgather of push(), on the reserved tags of
//                            communicator.h (servers never see them)
// Workers post their reply receives before sending a request, so a server
// never blocks on a reply. A server keeps one header receive posted per
// worker and polls them (Request::test); it handles a worker's requests in
// its send order. A request that may not be served yet (BSP: a push for a
// later step, a pull before the previous step is applied; any pull before
// the pushes up to its min clock have arrived; the controller: a BEGIN
// past the staleness bound) is *held*: no further request of that
// worker is received until it is served, which preserves per-worker order.
//
// Update rule (docs/algorithms.md "Update rule"): BSP: the server stages the W pushes of a step
// (the W pushes must all carry the same learning rate), sums them in worker
// order (deterministic whatever the arrival order), divides by W and makes
// one optimizer step. ASP/SSP/DSSP: each push is applied on arrival, divided
// by W. The optimizer (FlatSgd with momentum, or FlatAdamW) runs over the
// whole shard (a sparse push touches few coordinates, momentum decays all
// of them): BSP has one; ASP/SSP/DSSP have one per worker, whose state only
// that worker's pushes advance, so that in lockstep the W pushes of a step
// equal one BSP step (a departure from the usual one per shard). A
// shard's version counts optimizer steps (BSP: steps; otherwise pushes); an
// update's staleness is the version when applied minus the version the
// worker had pulled. Each push is received and applied exactly once by the
// single-threaded server loop; the server sums an order-independent
// fingerprint of every push (worker, clock, payload bytes) that workers
// compute too (tests compare them).
//
// Consistency (controller, clocks counted from the pushes it has received;
// workers that sent DONE leave the minimum): BSP grants a BEGIN at clock c
// when c - min c_q <= 0 and servers answer a BSP pull only once the
// previous step is applied everywhere; SSP(s) when c - min c_q <= s; DSSP
// like SSP(s_L), but a worker past the bound (once it and the slowest
// worker have pushed twice) is granted r = dssp_grant(...) extra steps,
// used while it is past s_L; with none left it waits until it is back
// within s_L (so it never begins a step more than s_U ahead).
//
// Sparse pushes: a worker runs its scheme's memory (error feedback) and
// sparsifier over its whole gradient once per step, then splits the
// selection by shard. Values travel as fp32 with raw indices: the exchange
// options (exchange, values, encode_indices) are refused. DGC's momentum
// correction replaces the optimizer's momentum: the servers' SGD momentum
// must then be 0.
//  - Per-worker schemes (topk, threshold, randomk, dgc, gaussiank) need
//    nothing from other workers and work under every model. Their push
//    involves no collective under any model (under BSP too: the step's
//    selection is the same whatever the model, and no worker waits for
//    another before it pushes); the sparsifier's observe() sees this
//    worker's own count only (counts = {own}, K = own), which is all these
//    schemes' observe() could use.
//  - Partition-based schemes (micro, exdyna, exdyna-faithful, cltk, deft)
//    select together: select() runs collectives among the workers (the
//    count all-reduce of MiCRO/ExDyna, CLT-k's and DEFT's broadcasts) and
//    the step t must be the same on all of them, so they are allowed only
//    under BSP (validate_ps_options). select() runs on a communicator of
//    the worker group (rank = worker index = world rank, size = W) that
//    forwards point-to-point to the world; its collectives use the
//    collective tags 30000..30099, never the protocol's 30100..30104.
//    After select() the workers all-gather their selected counts and then
//    their indices over the group, and each pushes its own accumulated
//    values at the union of all workers' indices (plus the known ranges),
//    as the union all-reduce of the all-reduce mode does: the server's BSP
//    sum over the workers is then that all-reduce's sum. observe() gets
//    the true ExchangeOutcome (counts per worker, K = the union's size plus
//    the known ranges). The indices a worker all-gathers to the others are
//    counted in PushReport::bytes_to_workers. (The declared exchange must
//    be the union all-reduce or shared indices; others are refused.)
//  - Known ranges (SparseSelection::known, DEFT's whole pieces): in the
//    all-reduce exchanges every rank transmits its own accumulated values
//    there with no index on the wire. A push always carries explicit
//    indices, so they are expanded into (index, a[index]) entries merged
//    in ascending order with the explicit selection; the server sums them
//    like any other entry.
//  Error feedback subtracts exactly the pushed values at the pushed
//  indices (known positions included: their residual becomes 0), then the
//  memory's after_exchange() sees the pushed indices.
//
// Failure: every blocking wait is bounded by the communicator's timeout; a
// server that hears from no worker within it throws TimeoutError naming the
// workers it waits for; on the thread backend a failed rank aborts the
// world and every other rank gets PeerFailure naming it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/optim/optimizer.h"
#include "sparsecomm/ps/layout.h"
#include "sparsecomm/ps/sync_model.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/registry.h"

namespace sparsecomm {

// What every rank of a PS world is started with (the same on all ranks).
struct PsOptions {
  SyncModel model;
  // "dense" or a scheme of the registry that PS mode accepts
  // (ps_push_methods(); the partition-based ones only under BSP).
  std::string push = "dense";
  SchemeOptions scheme_options;   // the scheme's options (density=..., ...)
  OptimizerOptions optimizer;     // the servers' optimizer (SGD or AdamW)
  std::vector<LayerSpan> layers;  // passed to the sparsifier's StepContext
};

// "dense, topk, threshold, randomk, dgc, gaussiank (every --sync model);
// micro, exdyna, exdyna-faithful, cltk, deft (--sync bsp only)".
std::string ps_push_methods();
// True for the schemes whose workers select together (their registry
// traits: micro, exdyna, exdyna-faithful, cltk, deft), so BSP only.
bool ps_push_is_partition_based(std::string_view push);
// InvalidArgument for an unknown push method, a partition-based scheme
// under a model other than BSP (naming the scheme and the model), an
// exchange option, invalid scheme or SGD options, or DGC with momentum.
void validate_ps_options(const PsOptions& options);

// --- server side ---

struct AppliedPush {
  int worker = 0;
  std::int64_t clock = 0;           // the worker's step
  std::int64_t pulled_version = 0;  // the shard version the worker had pulled
  std::int64_t staleness = 0;       // version when applied - pulled_version
  double time_s = 0.0;              // since the server started
  std::size_t values = 0;           // elements in the push
  std::size_t bytes = 0;            // header + payload
};

// One BEGIN the controller granted.
struct BeginGrant {
  int worker = 0;
  std::int64_t clock = 0;      // the worker's clock (steps pushed)
  std::int64_t min_clock = 0;  // min over running workers when granted
  bool blocked = false;        // held before it was granted
  bool extra = false;          // DSSP: granted as an extra step
  std::int64_t dssp_r = -1;    // DSSP: r decided on this request (-1: none)
  double wait_s = 0.0;         // how long it was held
  double time_s = 0.0;
};

struct WaitStats {
  std::int64_t count = 0;  // BEGINs held
  double seconds = 0.0;
};

struct ServerLog {
  int server = 0;
  Range shard;
  std::int64_t version = 0;       // optimizer steps applied
  std::int64_t pushes = 0;        // pushes applied (every one exactly once)
  std::size_t values = 0;         // elements over all pushes
  double value_sum = 0.0;         // sum of all pushed values (unscaled)
  std::uint64_t fingerprint = 0;  // sum of push fingerprints
  std::int64_t pulls = 0;
  std::size_t bytes_received = 0;
  std::size_t bytes_sent = 0;
  std::vector<AppliedPush> applied;  // in apply order
  std::vector<BeginGrant> grants;    // controller only, in grant order
  std::vector<WaitStats> waits;      // controller only, per worker
  std::vector<float> parameters;     // the shard at the end
  double seconds = 0.0;              // run time
};

// A server's checkpoints (see the cut above).
struct ServerCheckpoints {
  // Called at each cut with the workers' clock, the shard's parameters and
  // the server's whole state (the shard included); it stores the state and
  // returns once every rank has stored its own (the world's barrier).
  // Empty: a PAUSE is a protocol error.
  std::function<void(std::int64_t clock, std::span<const float> shard,
                     std::span<const std::byte> state)>
      at_cut;
  // A state at_cut was given, to start from instead of the initial shard;
  // empty: start afresh.
  std::span<const std::byte> resume;
};

// Serves the shard of server layout.server_index(comm.rank()) until every
// worker has sent DONE. `initial_shard` holds that shard's initial
// parameters (layout.shard(s).size() floats). Throws InvalidArgument for
// bad options or sizes, CommError on protocol violations or failures,
// Error for a resume state of another server, shard or model.
ServerLog run_server(Communicator& comm, const ServerLayout& layout, const PsOptions& options,
                     std::span<const float> initial_shard,
                     const ServerCheckpoints& checkpoints = {});

// --- worker side ---

struct PushReport {
  std::int64_t step = 0;   // the clock this push carried
  std::size_t target = 0;  // sparse: the scheme's k; dense: d
  std::size_t values = 0;  // elements sent over all servers
  // Sparse: this worker's selected count (known ranges excluded) and the
  // union size K its sparsifier observed (partition-based: over all
  // workers, from the all-gathered counts; per-worker: its own selection).
  // Dense: both d.
  std::size_t selected = 0;
  std::size_t union_size = 0;
  std::size_t bytes_sent = 0;  // headers + payloads
  // Partition-based: the indices this worker all-gathered to the other
  // workers (own count x 4 bytes x (W - 1)); 0 otherwise.
  std::size_t bytes_to_workers = 0;
  double select_s = 0.0;       // memory + selection
  double send_s = 0.0;         // until every server took the push
  double residual_norm = 0.0;  // sparse: ||residual|| after the push
};

// What a worker sent to one server (for checks against its ServerLog).
struct SentToServer {
  std::int64_t pushes = 0;
  std::size_t values = 0;
  double value_sum = 0.0;
  std::uint64_t fingerprint = 0;
};

struct WorkerLog {
  std::int64_t begins = 0;
  std::int64_t blocked = 0;      // begins the controller held
  double wait_s = 0.0;           // time spent in begin_step()
  std::int64_t extra_steps = 0;  // DSSP extra steps granted to this worker
  std::int64_t pulls = 0;
  std::size_t bytes_pushed = 0;
  std::size_t bytes_pulled = 0;
  std::vector<SentToServer> sent;  // per server
};

class PsWorker {
 public:
  // comm.rank() must be a worker of `layout`, which must span comm.size()
  // ranks. InvalidArgument otherwise or for bad options.
  PsWorker(Communicator& comm, const ServerLayout& layout, PsOptions options);
  ~PsWorker();
  PsWorker(const PsWorker&) = delete;
  PsWorker& operator=(const PsWorker&) = delete;

  // Blocks until the model lets this worker begin its next step (ASP: at
  // once, no message). Call once before each push().
  void begin_step();
  // Fresh parameters from every server into `parameters` (d floats).
  void pull(std::span<float> parameters);
  // Pushes this step's local gradient (d floats, finite: NonFiniteGradient
  // otherwise) to every server; sparse methods sparsify it first (with this
  // worker's residual). Returns when every server has taken it.
  PushReport push(std::span<const float> gradient, double learning_rate, double epoch = 0.0);
  // Tells every server this worker is done. Call once at the end.
  void finish();

  // A checkpoint's cut, between two steps: a PAUSE to every server (the
  // caller then saves and joins the world's barrier, as the servers do).
  void pause();
  // This worker's state: its clock, versions and grant, its log, and the
  // sparse scheme's memory and sparsifier (at a cut: no step open).
  void save(StateWriter& writer) const;
  // Error when the state is of another worker, layout or scheme.
  void load(StateReader& reader);

  // Sparse methods: this worker's residual (the memory's accumulated
  // vector, d floats) after the last push; empty for dense pushes.
  std::span<const float> residual() const;

  std::int64_t clock() const { return clock_; }
  const WorkerLog& log() const { return log_; }
  int worker() const { return worker_; }

 private:
  struct Sparse;
  struct Payloads;
  void check_push(std::span<const float> gradient) const;
  void dense_payloads(std::span<const float> gradient, Payloads& payloads,
                      PushReport& report) const;
  void sparse_payloads(std::span<const float> gradient, double epoch, Payloads& payloads,
                       PushReport& report);
  void send_payloads(const Payloads& payloads, double learning_rate, PushReport& report);

  Communicator& comm_;
  ServerLayout layout_;
  PsOptions options_;
  int worker_;
  std::int64_t clock_ = 0;
  bool in_step_ = false;
  bool finished_ = false;
  std::vector<std::int64_t> versions_;  // per server: the version last pulled
  std::int64_t granted_min_clock_ = 0;  // the min clock of the last grant
  WorkerLog log_;
  std::unique_ptr<Sparse> sparse_;  // null for dense pushes
};

}  // namespace sparsecomm
