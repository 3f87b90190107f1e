// `sparsecomm bench sparsifiers` (see bench_sparsifiers.h).
//
// How it measures (../shared/BENCHMARKS.md):
//  - The gradients come from a sparsecomm::GradientStream: by default the
//    project's synthetic stream (make_synthetic_stream: skewed, heavy-tailed,
//    its scale falling --drift x over the run), or a recorded trace (--trace
//    DIR, open_trace: its numel, world, steps and layers). The synthetic
//    values are O(1), with no physical scale: schemes with absolute
//    thresholds (the reference hard threshold 1/(2 sqrt(k)), ...) select what
//    they select on it, reported as measured (pass --opt to change them).
//  - The n ranks are threads of this process (run_thread_world). Each drives
//    its own SparseSync, built by make_scheme, over its own gradients of the
//    stream, so K/k, imbalance and bytes come from the library's own
//    synchronization step.
//  - Selection is timed apart from that concurrent step, each rank alone, one
//    after another: the sparsifier handed to SparseSync is a probe wrapping
//    the scheme's. Inside select() the probe saves the scheme's state, runs
//    the real selection (recording whatever the scheme communicates while
//    selecting), verifies it, and then, on a timed step, the ranks take
//    turns: rank 0 re-runs the selection on its accumulated vector while
//    every other rank waits in a barrier, then rank 1, and so on. The re-run
//    is a second instance of the scheme loaded with the saved state and
//    talking to a replay of the recorded communication, so it makes exactly
//    the same choice (checked) with the machine to itself. What it receives
//    (CLT-k's broadcast, the partition schemes' counts) arrives at once from
//    the recording, so the time is the selection's own work, not waiting for
//    other ranks.
//  - The floor of each (rank, timed step) is a read pass over exactly the
//    elements that rank's select() read (its partition for MiCRO/ExDyna,
//    its bin's pieces for DEFT; see "Which elements one rank's select()
//    reads"), timed in the same turn on the same vector. Before the floor
//    and before the selection a pass over an eviction buffer (4x the LLC)
//    empties the caches, so a partition smaller than the LLC is read from
//    memory by both.
//  - Steps: the first --warmup-steps (default 20%, at least 10 when
//    steps >= 50) are left out of K/k, imbalance and bytes, which describe
//    the steady state. Selection is timed on every --time-every-th step from
//    the end of the warm-up (never step 0, the schemes' set-up); every step
//    runs and is verified.
//  - select_ms: per timed step the slowest rank (the step waits for it; for
//    CLT-k that is the leader, the only rank that runs a top-k), then the
//    median over timed steps. floor_ratio: the median over (rank, timed
//    step) of that rank's select time / its own floor. Each figure for a
//    rank and step is the fastest of --reps runs (on this shared machine
//    noise only ever adds time); the floor likewise.
//  - Memory: per rank its gradient, the memory's buffer(s) and SparseSync's
//    output (d floats each), plus the synthetic stream's d-float profile and
//    the eviction buffer; the stream is generated (or read) on the fly each
//    step. 8 ranks x d = 25M: about 3.5 GB.
//  - Verified before anything is reported: every selection (indices strictly
//    ascending, inside [0, d), values equal to the accumulated vector), the
//    positions each rank transmitted (ascending, covering its selection), the
//    read model (every selected index inside the elements the floor reads),
//    and conservation on a sample of positions every step (the averaged
//    gradient equals the mean over ranks of what each rank's memory gave up).

#include "bench_sparsifiers.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "sparsecomm/collectives/codec.h"
#include "sparsecomm/core/hash.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/comm/mpi/mpi_communicator.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sparsify/sparsifier.h"
#include "sparsecomm/sync/load_balance.h"
#include "sparsecomm/sync/sparse_sync.h"
#include "sparsecomm/sync/step_metrics.h"
#include "sparsecomm/traces/gradient_stream.h"
#include "torch_topk.h"

namespace sparsecomm::cli {
namespace {

struct Options {
  std::size_t numel = 25'000'000;
  double density = 0.001;
  int workers = 8;
  int steps = 100;
  int warmup_steps = -1;  // -1: 20% of the steps, at least 10 when steps >= 50
  int time_every = 10;    // timing on every time_every-th step after the warm-up
  int reps = 5;
  std::string schemes;            // empty: every registered scheme
  std::vector<std::string> opts;  // key=value, passed to every scheme
  std::string trace;              // empty: the synthetic stream
  std::uint64_t seed = 1;
  double drift = 10.0;  // synthetic stream: overall scale falls drift x over the run
  double skew = 1.5;    // synthetic stream: regional skew
  double tail = 1.0;    // synthetic stream: heavy-tail strength
  double epoch = 100.0;
  std::string format = "table";
  bool no_torch = false;
  // Which options were given on the command line (a trace supplies the rest).
  bool numel_given = false, workers_given = false, steps_given = false;
  bool synthetic_given = false;      // any of --drift, --skew, --tail
  std::string source;                // the stream's describe(), once resolved
  double exchange_budget_gib = 0.0;  // memory the exchange may use (0: unchecked)
};

// The default warm-up: 20% of the steps, at least 10 when steps >= 50.
int default_warmup(int steps) {
  const int fifth = steps / 5;
  return steps >= 50 ? std::max(fifth, 10) : fifth;
}

// The first step whose selection is timed: step 0 is the schemes' set-up
// (first use of their scratch, initial thresholds from an all-reduced
// histogram) and is never timed, even without a warm-up.
int first_timed_step(const Options& options) { return std::max(options.warmup_steps, 1); }

// Selection is timed on every time_every-th step from first_timed_step (the
// other steps run, and are verified and counted, but are not re-run alone).
bool timed_step(const Options& options, std::int64_t step) {
  const std::int64_t first = first_timed_step(options);
  return step >= first && (step - first) % options.time_every == 0;
}

// ---------------------------------------------------------------------------
// Recording and replaying what a sparsifier communicates inside select().
// ---------------------------------------------------------------------------

enum class CommOp {
  kSend,
  kRecv,
  kBarrier,
  kBroadcast,
  kAllgather,
  kAllgatherv,
  kAlltoallv,
  kAllreduceFloat,
  kAllreduceInt,
};

std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kSend:
      return "send";
    case CommOp::kRecv:
      return "recv";
    case CommOp::kBarrier:
      return "barrier";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kAllgather:
      return "allgather";
    case CommOp::kAllgatherv:
      return "allgatherv";
    case CommOp::kAlltoallv:
      return "alltoallv";
    case CommOp::kAllreduceFloat:
      return "native_allreduce(float)";
    case CommOp::kAllreduceInt:
      return "native_allreduce(int64)";
  }
  return "?";
}

// One operation: what was received (the only thing a replay must reproduce).
struct CommRecord {
  CommOp op = CommOp::kBarrier;
  std::size_t bytes = 0;        // size of the caller's buffer
  std::vector<std::byte> data;  // received bytes (receiving operations)
  bool complete = true;         // false: a receive that has not completed yet
};
using CommLog = std::vector<CommRecord>;

void copy_bytes(std::span<std::byte> to, std::span<const std::byte> from) {
  if (!from.empty()) std::memcpy(to.data(), from.data(), from.size());
}

// A receive of the recording communicator: completes with the inner request
// and then copies what arrived into the log.
class RecordedReceive final : public Request::Impl {
 public:
  RecordedReceive(Request inner, std::span<std::byte> data, CommLog& log, std::size_t slot)
      : inner_(std::move(inner)), data_(data), log_(log), slot_(slot) {}

  bool test() override {
    if (!inner_.test()) return false;
    capture();
    return true;
  }
  bool wait_until(Clock::time_point deadline) override {
    const auto now = Clock::now();
    const auto left = deadline > now ? std::chrono::ceil<std::chrono::milliseconds>(deadline - now)
                                     : std::chrono::milliseconds(0);
    inner_.wait_for(left);  // throws the backend's TimeoutError when it expires
    capture();
    return true;
  }
  [[noreturn]] void fail_timeout(std::chrono::milliseconds waited) override {
    throw TimeoutError(
        fmt::format("[bench] recorded receive timed out after {} ms", waited.count()));
  }

 private:
  void capture() {
    CommRecord& record = log_[slot_];
    if (record.complete) return;
    record.data.assign(data_.begin(), data_.end());
    record.complete = true;
  }
  Request inner_;
  std::span<std::byte> data_;
  CommLog& log_;
  std::size_t slot_;
};

// Forwards everything to the real communicator and logs what was received.
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(Communicator& inner, CommLog& log) : inner_(inner), log_(log) {
    set_timeout(inner.timeout());
  }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string_view backend() const override { return inner_.backend(); }

  Request isend(std::span<const std::byte> data, int dst, int tag) override {
    log_.push_back({CommOp::kSend, data.size(), {}, true});
    return inner_.isend(data, dst, tag);
  }
  Request irecv(std::span<std::byte> data, int src, int tag) override {
    const std::size_t slot = log_.size();
    log_.push_back({CommOp::kRecv, data.size(), {}, false});
    Request request = inner_.irecv(data, src, tag);
    return Request(std::make_unique<RecordedReceive>(std::move(request), data, log_, slot),
                   timeout());
  }
  void barrier() override {
    inner_.barrier();
    log_.push_back({CommOp::kBarrier, 0, {}, true});
  }
  void broadcast(std::span<std::byte> data, int root) override {
    inner_.broadcast(data, root);
    record(CommOp::kBroadcast, data);
  }
  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) override {
    inner_.allgather(mine, all);
    record(CommOp::kAllgather, all);
  }
  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override {
    inner_.allgatherv(mine, all, counts);
    record(CommOp::kAllgatherv, all);
  }
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    inner_.alltoallv(send, send_counts, recv, recv_counts);
    record(CommOp::kAlltoallv, recv);
  }
  bool has_native_allreduce() const override { return inner_.has_native_allreduce(); }
  void native_allreduce(std::span<float> data) override {
    inner_.native_allreduce(data);
    record(CommOp::kAllreduceFloat, std::as_writable_bytes(data));
  }
  void native_allreduce(std::span<std::int64_t> data) override {
    inner_.native_allreduce(data);
    record(CommOp::kAllreduceInt, std::as_writable_bytes(data));
  }

 private:
  void record(CommOp op, std::span<const std::byte> received) {
    log_.push_back({op, received.size(), {received.begin(), received.end()}, true});
  }
  Communicator& inner_;
  CommLog& log_;
};

// Serves a recorded log back, in order, without any other rank: what the
// scheme received arrives at once; what it sends goes nowhere.
class ReplayCommunicator final : public Communicator {
 public:
  ReplayCommunicator(int rank, int size, bool native, const CommLog& log, std::string_view scheme)
      : rank_(rank), size_(size), native_(native), log_(log), scheme_(scheme) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "replay"; }

  void rewind() { position_ = 0; }
  void expect_consumed() const {
    if (position_ != log_.size()) {
      throw Error(fmt::format(
          "[bench] {}: the re-run of select() made {} communication calls, the real one {}: the "
          "selection does not depend only on its saved state and input",
          scheme_, position_, log_.size()));
    }
  }

  Request isend(std::span<const std::byte> data, int, int) override {
    next(CommOp::kSend, data.size());
    return Request();
  }
  Request irecv(std::span<std::byte> data, int, int) override {
    copy_bytes(data, next(CommOp::kRecv, data.size()).data);
    return Request();
  }
  void barrier() override { next(CommOp::kBarrier, 0); }
  void broadcast(std::span<std::byte> data, int) override {
    copy_bytes(data, next(CommOp::kBroadcast, data.size()).data);
  }
  void allgather(std::span<const std::byte>, std::span<std::byte> all) override {
    copy_bytes(all, next(CommOp::kAllgather, all.size()).data);
  }
  void allgatherv(std::span<const std::byte>, std::span<std::byte> all,
                  std::span<const std::size_t>) override {
    copy_bytes(all, next(CommOp::kAllgatherv, all.size()).data);
  }
  void alltoallv(std::span<const std::byte>, std::span<const std::size_t>,
                 std::span<std::byte> recv, std::span<const std::size_t>) override {
    copy_bytes(recv, next(CommOp::kAlltoallv, recv.size()).data);
  }
  bool has_native_allreduce() const override { return native_; }
  void native_allreduce(std::span<float> data) override {
    const auto bytes = std::as_writable_bytes(data);
    copy_bytes(bytes, next(CommOp::kAllreduceFloat, bytes.size()).data);
  }
  void native_allreduce(std::span<std::int64_t> data) override {
    const auto bytes = std::as_writable_bytes(data);
    copy_bytes(bytes, next(CommOp::kAllreduceInt, bytes.size()).data);
  }

 private:
  const CommRecord& next(CommOp op, std::size_t bytes) {
    const auto fail = [&](std::string_view what) {
      return Error(fmt::format(
          "[bench] {}: the re-run of select() diverged from the real one at communication call "
          "#{} ({} of {} bytes): {}",
          scheme_, position_, comm_op_name(op), bytes, what));
    };
    if (position_ >= log_.size()) throw fail("the real selection made no such call");
    const CommRecord& record = log_[position_];
    if (record.op != op || record.bytes != bytes) {
      throw fail(
          fmt::format("the real one was {} of {} bytes", comm_op_name(record.op), record.bytes));
    }
    if (!record.complete) throw fail("the real receive never completed");
    ++position_;
    return record;
  }
  int rank_, size_;
  bool native_;
  const CommLog& log_;
  std::string_view scheme_;
  std::size_t position_ = 0;
};

// ---------------------------------------------------------------------------
// Probes: wrap a scheme's sparsifier and memory inside SparseSync.
// ---------------------------------------------------------------------------

// Everything one scheme's run records, indexed [step * workers + rank].
// Timing fields are NaN on the steps (and, for the floor, the ranks) that
// have none.
struct SchemeRun {
  std::string scheme;
  std::string exchange;
  int workers = 0;
  int steps = 0;
  std::vector<double> select_ms;
  std::vector<double> floor_ms;       // read pass over the elements this rank's select() read
  std::vector<std::size_t> elements;  // ... and how many those were (0: no floor)
  std::vector<StepMetrics> metrics;
  std::size_t numel = 0;
  // Set (by rank 0) when the scheme's selections are too large for this
  // machine's memory to exchange: the run stops and the row says why.
  std::string skipped;
};

// Thrown on every rank, identically, to stop a scheme whose exchange would
// not fit in memory.
struct SkipScheme {};

// ---------------------------------------------------------------------------
// Which elements one rank's select() read, for its floor (BENCHMARKS.md: a
// read pass "over exactly the elements the kernel reads"): what the scheme
// itself reports (Sparsifier::last_read()) for the selection just made. The
// whole vector for topk, threshold, dgc, gaussiank and the CLT-k leader; the
// rank's own partition for micro and exdyna (ExDyna's sizes follow the
// selected load); DEFT's bin pieces (+ the whole vector on the leader);
// nothing for Random-k and CLT-k followers (k scattered values). Every timed
// step checks that the selected indices lie inside those ranges.
// ---------------------------------------------------------------------------

// Sorted, with overlapping or touching ranges merged (for the coverage check
// and so contiguous pieces are read in one pass).
std::vector<Range> merged(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& x, const Range& y) { return x.begin < y.begin; });
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (r.empty()) continue;
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

struct ReadRanges {
  std::vector<Range> passes;  // what the floor reads, in order (may overlap: DEFT's leader)
  std::vector<Range> cover;   // their union, sorted and merged
  std::size_t elements = 0;   // sum of the passes' sizes
};

// The floor's passes for one selection; none when it streamed nothing.
std::optional<ReadRanges> ranges_read(std::span<const Range> passes) {
  if (passes.empty()) return std::nullopt;
  ReadRanges read;
  read.passes.assign(passes.begin(), passes.end());
  read.cover = merged(read.passes);
  for (const Range& r : read.passes) read.elements += r.size();
  return read;
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

// One rank's view shared by its two probes and its step loop.
struct RankProbe {
  std::string_view scheme;
  int rank = 0;
  std::size_t numel = 0;
  std::uint64_t seed = 0;
  const SparseSelection* live = nullptr;  // this step's selection (owned by SparseSync)
  std::int64_t step = 0;
  std::vector<Index> sample;  // conservation sample, identical on every rank
  std::vector<float> before;  // accumulated vector at `sample`, before the exchange
  std::vector<float> after;   // ... after it (the new residual)
  bool after_taken = false;

  Error failure(std::string_view what) const {
    return Error(
        fmt::format("[bench] verification failed for {} at step {} on rank {}: {}; no timing is "
                    "reported for a wrong result",
                    scheme, step, rank, what));
  }
};

void verify_selection(const RankProbe& probe, const SparseSelection& selection,
                      std::span<const float> accumulated) {
  if (selection.indices.size() != selection.values.size()) {
    throw probe.failure(fmt::format("the selection has {} indices but {} values",
                                    selection.indices.size(), selection.values.size()));
  }
  for (std::size_t j = 0; j < selection.size(); ++j) {
    const Index i = selection.indices[j];
    if (i >= accumulated.size()) {
      throw probe.failure(
          fmt::format("selected index #{} is {}, outside [0, {})", j, i, accumulated.size()));
    }
    if (j > 0 && i <= selection.indices[j - 1]) {
      throw probe.failure(
          fmt::format("selected indices are not strictly ascending at #{}: {} after {}", j, i,
                      selection.indices[j - 1]));
    }
    if (!same_bits(selection.values[j], accumulated[i])) {
      throw probe.failure(
          fmt::format("selected value at index {} is {} but the accumulated gradient holds {}", i,
                      selection.values[j], accumulated[i]));
    }
  }
}

class ProbeMemory final : public GradientMemory {
 public:
  ProbeMemory(std::unique_ptr<GradientMemory> inner, RankProbe& probe)
      : inner_(std::move(inner)), probe_(probe) {}

  std::string_view name() const override { return inner_->name(); }
  void accumulate(std::span<const float> gradient) override { inner_->accumulate(gradient); }
  std::span<float> accumulated() override { return inner_->accumulated(); }
  double residual_norm() const override { return inner_->residual_norm(); }
  void save(StateWriter& writer) const override { inner_->save(writer); }
  void load(StateReader& reader) override { inner_->load(reader); }

  // Runs between the exchange and the memory's own rule: the accumulated
  // buffer holds exactly "a minus what was transmitted" here.
  void after_exchange(std::span<const Index> transmitted) override {
    check_transmitted(transmitted);
    const std::span<const float> residual = inner_->accumulated();
    probe_.after.resize(probe_.sample.size());
    for (std::size_t j = 0; j < probe_.sample.size(); ++j) {
      probe_.after[j] = residual[probe_.sample[j]];
    }
    probe_.after_taken = true;
    inner_->after_exchange(transmitted);
  }

 private:
  void check_transmitted(std::span<const Index> transmitted) const {
    for (std::size_t j = 0; j < transmitted.size(); ++j) {
      if (transmitted[j] >= probe_.numel || (j > 0 && transmitted[j] <= transmitted[j - 1])) {
        throw probe_.failure(fmt::format(
            "the exchange's transmitted positions are not strictly ascending inside [0, {}) at "
            "#{} ({})",
            probe_.numel, j, transmitted[j]));
      }
    }
    if (probe_.live == nullptr) throw probe_.failure("the exchange ran before any selection");
    // Every position this rank selected was transmitted.
    std::size_t t = 0;
    for (const Index i : probe_.live->indices) {
      while (t < transmitted.size() && transmitted[t] < i) ++t;
      if (t == transmitted.size() || transmitted[t] != i) {
        throw probe_.failure(fmt::format(
            "selected index {} is missing from the positions the exchange transmitted", i));
      }
    }
  }

  std::unique_ptr<GradientMemory> inner_;
  RankProbe& probe_;
};

class ProbeSparsifier final : public Sparsifier {
 public:
  ProbeSparsifier(std::unique_ptr<Sparsifier> inner, std::unique_ptr<Sparsifier> twin,
                  RankProbe& probe, SchemeRun& run, const Options& options,
                  std::span<const float> evict)
      : inner_(std::move(inner)),
        twin_(std::move(twin)),
        probe_(probe),
        run_(run),
        options_(options),
        evict_(evict) {}

  std::string_view name() const override { return inner_->name(); }
  ExchangePattern default_exchange() const override { return inner_->default_exchange(); }
  std::size_t target(std::size_t numel, const StepContext& ctx) const override {
    return inner_->target(numel, ctx);
  }
  void observe(const ExchangeOutcome& outcome, const StepContext& ctx) override {
    inner_->observe(outcome, ctx);
  }
  void save(StateWriter& writer) const override { inner_->save(writer); }
  void load(StateReader& reader) override { inner_->load(reader); }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator& comm,
              SparseSelection& out) override {
    probe_.step = ctx.step;
    probe_.after_taken = false;
    // 1. The scheme's state before this step, for the re-runs.
    StateWriter writer;
    inner_->save(writer);
    state_ = writer.bytes();
    // 2. The real selection, concurrent with the other ranks; what it
    //    receives is recorded.
    log_.clear();
    {
      RecordingCommunicator recording(comm, log_);
      inner_->select(accumulated, ctx, recording, out);
    }
    last_read_.assign(inner_->last_read().begin(), inner_->last_read().end());
    stats_ = inner_->last_stats();
    probe_.live = &out;
    verify_selection(probe_, out, accumulated);
    check_exchange_fits(comm, out);
    take_sample(comm, accumulated, out);
    // 3. Each rank alone: rank q re-runs its selection while all others wait
    //    in the barrier that ends its turn.
    if (!timed_step(options_, ctx.step)) return;
    for (int q = 0; q < comm.size(); ++q) {
      comm.barrier();
      if (q == comm.rank()) time_alone(accumulated, ctx, comm, out);
    }
    comm.barrier();
  }

 private:
  // Every rank's selection travels to every rank (allgather: each receives
  // all of them; the union patterns build index/value buffers of the same
  // order), in raw and encoded form: about 3 x n x sum(|I_r|) x 8 bytes in
  // this process. A scheme that selects most of the vector (an absolute
  // threshold far below the stream's scale) would exhaust the machine; it is
  // stopped here, on every rank alike, and reported as such.
  void check_exchange_fits(Communicator& comm, const SparseSelection& out) {
    if (options_.exchange_budget_gib <= 0.0) return;
    const auto mine = static_cast<std::uint64_t>(out.size());
    std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
    comm.allgather(bytes_of(std::span<const std::uint64_t>(&mine, 1)),
                   writable_bytes_of(std::span<std::uint64_t>(all)));
    double total = 0.0;
    for (const std::uint64_t c : all) total += static_cast<double>(c);
    const double needed_gib =
        3.0 * comm.size() * total * (sizeof(Index) + sizeof(float)) / (1024.0 * 1024.0 * 1024.0);
    if (needed_gib <= options_.exchange_budget_gib) return;
    if (comm.rank() == 0) {
      const double k = static_cast<double>(target(probe_.numel, StepContext{}));
      run_.skipped = fmt::format(
          "stopped at step {}: the ranks selected {:.0f} elements in all ({:.0f}% of n*d, "
          "sum |I_r| / k = {:.0f}); exchanging that needs about {:.1f} GiB, over the {:.1f} GiB "
          "available",
          probe_.step, total, 100.0 * total / (static_cast<double>(probe_.numel) * comm.size()),
          total / std::max(k, 1.0), needed_gib, options_.exchange_budget_gib);
    }
    throw SkipScheme{};
  }

  // The positions of this step's conservation check: random ones plus a few
  // of every rank's selection, the same list on every rank.
  void take_sample(Communicator& comm, std::span<const float> accumulated,
                   const SparseSelection& out) {
    constexpr std::size_t kRandom = 1024, kPicksPerRank = 32;
    constexpr Index kNone = std::numeric_limits<Index>::max();
    std::vector<Index> picks(kPicksPerRank, kNone);
    const std::size_t m = std::min(kPicksPerRank, out.size());
    for (std::size_t j = 0; j < m; ++j) picks[j] = out.indices[j * out.size() / m];
    std::vector<Index> all(kPicksPerRank * static_cast<std::size_t>(comm.size()));
    comm.allgather(bytes_of(std::span<const Index>(picks)),
                   writable_bytes_of(std::span<Index>(all)));
    std::vector<Index>& sample = probe_.sample;
    sample.clear();
    for (const Index i : all) {
      if (i != kNone) sample.push_back(i);
    }
    const std::uint64_t key = hash_combine(hash_combine(probe_.seed, 0x53414d504c450000ull),
                                      static_cast<std::uint64_t>(probe_.step));
    for (std::size_t j = 0; j < std::min(kRandom, probe_.numel); ++j) {
      sample.push_back(static_cast<Index>(hash_combine(key, j) % probe_.numel));
    }
    std::sort(sample.begin(), sample.end());
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
    probe_.before.resize(sample.size());
    for (std::size_t j = 0; j < sample.size(); ++j) probe_.before[j] = accumulated[sample[j]];
  }

  // One rep: evict the caches (a pass over a buffer several times the
  // last-level cache), time the floor pass over exactly the elements this
  // rank's selection reads, evict again, time the selection. So neither the
  // floor nor the selection starts from data the other just pulled into the
  // cache: both read from memory, as at full scale.
  void time_alone(std::span<const float> accumulated, const StepContext& ctx, Communicator& comm,
                  const SparseSelection& out) {
    const std::optional<ReadRanges> read = ranges_read(inner_->last_read());
    if (read) check_inside(*read, out);
    ReplayCommunicator replay(comm.rank(), comm.size(), comm.has_native_allreduce(), log_,
                              probe_.scheme);
    std::vector<double> select_ms, floor_ms;
    for (int rep = 0; rep < options_.reps; ++rep) {
      if (read) {
        sink_ += read_pass(evict_);
        Stopwatch floor_clock;
        for (const Range& r : read->passes) {
          sink_ += read_pass(accumulated.subspan(r.begin, r.size()));
        }
        floor_ms.push_back(floor_clock.seconds() * 1e3);
      }
      sink_ += read_pass(evict_);

      StateReader reader(state_);
      twin_->load(reader);
      replay.rewind();
      scratch_.clear();
      Stopwatch select_clock;
      twin_->select(accumulated, ctx, replay, scratch_);
      select_ms.push_back(select_clock.seconds() * 1e3);
      replay.expect_consumed();
      if (rep == 0) check_same(out);
    }
    const std::size_t slot =
        static_cast<std::size_t>(ctx.step) * static_cast<std::size_t>(comm.size()) +
        static_cast<std::size_t>(comm.rank());
    // The fastest run: on this shared machine noise only ever adds time.
    run_.select_ms[slot] = *std::min_element(select_ms.begin(), select_ms.end());
    if (read) {
      run_.floor_ms[slot] = *std::min_element(floor_ms.begin(), floor_ms.end());
      run_.elements[slot] = read->elements;
    }
  }

  // The read model is right about this step: every selected index lies in
  // the elements it says the selection read.
  void check_inside(const ReadRanges& read, const SparseSelection& out) const {
    std::size_t r = 0;
    for (const Index i : out.indices) {
      while (r < read.cover.size() && read.cover[r].end <= i) ++r;
      if (r == read.cover.size() || i < read.cover[r].begin) {
        throw probe_.failure(fmt::format(
            "selected index {} lies outside the {} elements the scheme's last_read() reports "
            "for this selection (its floor would be wrong)",
            i, read.elements));
      }
    }
  }

  void check_same(const SparseSelection& out) const {
    bool same = scratch_.size() == out.size();
    for (std::size_t j = 0; same && j < out.size(); ++j) {
      same = scratch_.indices[j] == out.indices[j] && same_bits(scratch_.values[j], out.values[j]);
    }
    if (!same) {
      throw probe_.failure(fmt::format(
          "re-running select() from the scheme's saved state chose a different selection ({} "
          "elements, the real one {}): save()/load() does not restore the state bit-exactly",
          scratch_.size(), out.size()));
    }
  }

  std::unique_ptr<Sparsifier> inner_;
  std::unique_ptr<Sparsifier> twin_;  // a second instance, for the re-runs
  RankProbe& probe_;
  SchemeRun& run_;
  const Options& options_;
  std::span<const float> evict_;  // eviction buffer, read-only, shared by the ranks
  std::vector<std::byte> state_;
  CommLog log_;
  SparseSelection scratch_;
  float sink_ = 0.0f;  // keeps the floor passes observable
};

// Relative tolerance of the conservation check: the exchange sums n values
// (in the wire precision when values travel as fp16/bf16).
double conservation_tolerance(ValueEncoding values, int workers) {
  const double unit = values == ValueEncoding::kFloat32   ? std::ldexp(1.0, -23)
                      : values == ValueEncoding::kFloat16 ? std::ldexp(1.0, -10)
                                                          : std::ldexp(1.0, -7);
  return 4.0 * std::max(workers, 1) * unit;
}

// After synchronize(): the averaged gradient at every sample position equals
// the mean over ranks of what each rank's accumulated vector gave up there.
void check_conservation(const RankProbe& probe, Communicator& comm, std::span<const float> averaged,
                        double tolerance) {
  if (!probe.after_taken) {
    throw probe.failure("the memory's after_exchange() was not called during the step");
  }
  const std::size_t s = probe.sample.size();
  std::vector<float> given(s);
  for (std::size_t j = 0; j < s; ++j) given[j] = probe.before[j] - probe.after[j];
  std::vector<float> all(s * static_cast<std::size_t>(comm.size()));
  comm.allgather(bytes_of(std::span<const float>(given)), writable_bytes_of(std::span<float>(all)));
  const double n = comm.size();
  for (std::size_t j = 0; j < s; ++j) {
    double sum = 0.0, magnitude = 0.0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r) {
      sum += all[r * s + j];
      magnitude += std::abs(static_cast<double>(all[r * s + j]));
    }
    const double expected = sum / n, got = averaged[probe.sample[j]];
    if (!(std::abs(got - expected) <= tolerance * magnitude / n)) {
      throw probe.failure(fmt::format(
          "conservation broken at index {}: the averaged gradient is {} but the ranks' memories "
          "gave up {} on average (transmitted + new residual must equal the old accumulated "
          "value on every rank)",
          probe.sample[j], got, expected));
    }
  }
}

// ---------------------------------------------------------------------------
// The benchmark.
// ---------------------------------------------------------------------------

struct Baselines {
  double floor_ms = 0.0;  // read pass over all d elements
  double bandwidth_gbps = 0.0;
  double nth_element_ms = 0.0;
  std::optional<double> torch_topk_ms;
};

struct Row {
  std::string scheme;
  std::string exchange;
  double select_ms = 0.0;
  std::optional<double> floor_ms;  // none: the scheme has no streaming floor
  std::optional<double> floor_ratio;
  std::optional<double> read_fraction;  // median elements read per (rank, step) / d
  bool partitioned = false;             // per-rank reads differ (partition schemes)
  bool leader_only = false;             // only the leader has a floor (CLT-k)
  std::string skipped;                  // why the scheme did not finish (empty: it did)
  double nth_element_speedup = 0.0;
  std::optional<double> torch_topk_speedup;
  double density_ratio_mean = 0.0;
  double density_error_p95 = 0.0;
  double imbalance_mean = 0.0;
  double imbalance_floor = 0.0;  // the counting floor at the mean K (load_balance.h)
  double rounds_mean = 0.0;      // select()'s own collectives per step
  double rescans = 0.0;          // share of steps with a second candidate pass
  double bytes_per_rank = 0.0;
  std::optional<double> index_bytes_saved;  // none when no index was sent
};

struct Machine {
  std::string cpu = "unknown CPU";
  unsigned cores = 0;
  double memory_gib = 0.0;
  double available_gib = 0.0;
  std::string load;  // 1-minute load average at the start: how busy the shared machine was
  std::string date;
};

Machine describe_machine() {
  Machine m;
  m.cores = std::thread::hardware_concurrency();
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) m.cpu = line.substr(line.find_first_not_of(" \t", colon + 1));
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kib = 0.0;
    meminfo >> kib;
    if (key == "MemTotal:") m.memory_gib = kib / (1024.0 * 1024.0);
    if (key == "MemAvailable:") m.available_gib = kib / (1024.0 * 1024.0);
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  std::ifstream loadavg("/proc/loadavg");
  loadavg >> m.load;
  if (m.load.empty()) m.load = "?";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M UTC", &utc);
  m.date = buffer;
  return m;
}

// Nearest-rank percentile of a non-empty list.
double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(values.size())));
  return values[std::clamp<std::size_t>(rank, 1, values.size()) - 1];
}

// The reference points, once per run, on rank 0's first gradient (its first
// accumulated vector: error feedback starts at zero): the floor over all of
// it, std::nth_element and torch::topk on |a| for the same k.
Baselines measure_baselines(const GradientStream& stream, const Options& options) {
  const std::size_t d = stream.numel();
  const std::size_t k = target_count(options.density, d);
  UninitVector<float> a(d);
  stream.fill(0, 0, a);
  Baselines b;

  std::vector<double> floor_ms;
  float sink = 0.0f;
  for (int rep = 0; rep <= options.reps; ++rep) {  // rep 0 warms up
    Stopwatch clock;
    sink += read_pass(a);
    if (rep > 0) floor_ms.push_back(clock.seconds() * 1e3);
  }
  b.floor_ms = median(floor_ms);
  b.bandwidth_gbps = static_cast<double>(d * sizeof(float)) / (b.floor_ms * 1e6);

  UninitVector<float> magnitude(d);
  for (std::size_t i = 0; i < d; ++i) magnitude[i] = std::abs(a[i]);
  a = UninitVector<float>();  // release before the next copy
  UninitVector<float> work(d);
  std::vector<double> nth_ms;
  float kth = 0.0f;
  for (int rep = 0; rep < options.reps; ++rep) {
    std::copy(magnitude.begin(), magnitude.end(), work.begin());
    Stopwatch clock;
    std::nth_element(work.begin(), work.begin() + static_cast<std::ptrdiff_t>(k - 1), work.end(),
                     std::greater<float>());
    nth_ms.push_back(clock.seconds() * 1e3);
    kth = work[k - 1];
  }
  b.nth_element_ms = median(nth_ms);
  // Verify: the k-th largest is greater-or-equal to everything after it.
  if (std::any_of(work.begin() + static_cast<std::ptrdiff_t>(k), work.end(),
                  [&](float v) { return v > kth; })) {
    throw Error(
        "[bench] std::nth_element baseline: an element after position k is larger than "
        "the k-th largest");
  }
  work = UninitVector<float>();

  if (!options.no_torch) {
    const TorchTopkTiming torch = time_torch_topk(magnitude, k, options.reps);
    if (!same_bits(torch.kth_largest, kth)) {
      throw Error(fmt::format(
          "[bench] torch::topk baseline: its k-th largest |a| is {} but std::nth_element's is {}; "
          "no timing is reported for a wrong result",
          torch.kth_largest, kth));
    }
    b.torch_topk_ms = torch.median_ms;
  }
  if (std::isnan(sink)) fmt::print(stderr, "note: the floor pass read NaN\n");
  return b;
}

SchemeOptions scheme_options(const Options& options) {
  SchemeOptions result;
  for (const std::string& item : options.opts) {
    SchemeOptions one;
    one.set(item);
    for (const auto& [key, value] : one.values()) {
      if (key == "density") {
        throw InvalidArgument(fmt::format("--opt {}: set the density with --density", item));
      }
      if (key == "seed")
        throw InvalidArgument(fmt::format("--opt {}: set the seed with --seed", item));
      result.set(key, value);
    }
  }
  result.set("density", fmt::format("{}", options.density));
  result.set("seed", fmt::format("{}", options.seed));
  return result;
}

std::vector<std::string> resolve_schemes(const Options& options) {
  std::vector<std::string> names;
  if (options.schemes.empty()) {
    for (const SchemeInfo& info : scheme_registry()) names.push_back(info.name);
    return names;
  }
  for (const std::string& name : split_list(options.schemes, "--schemes")) {
    const auto& registry = scheme_registry();
    if (std::none_of(registry.begin(), registry.end(),
                     [&](const SchemeInfo& info) { return info.name == name; })) {
      throw InvalidArgument(
          fmt::format("--schemes: unknown scheme '{}': valid are {}", name, scheme_names()));
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

SchemeRun run_scheme(const std::string& name, const SchemeOptions& scheme_opts,
                     const GradientStream& stream, std::span<const float> evict,
                     const Options& options) {
  const std::size_t d = stream.numel();
  const int n = options.workers;
  SchemeRun run;
  run.scheme = name;
  run.workers = n;
  run.steps = options.steps;
  const std::size_t slots = static_cast<std::size_t>(n) * static_cast<std::size_t>(options.steps);
  const double none = std::numeric_limits<double>::quiet_NaN();
  run.select_ms.assign(slots, none);
  run.floor_ms.assign(slots, none);
  run.elements.assign(slots, 0);
  run.metrics.assign(slots, StepMetrics{});
  run.numel = d;

  try {
    run_thread_world(n, [&](Communicator& comm) {
      const int r = comm.rank();
      RankProbe probe;
      probe.scheme = run.scheme;
      probe.rank = r;
      probe.numel = d;
      probe.seed = options.seed;

      SchemeParts parts = make_scheme(name, scheme_opts);
      const double tolerance = conservation_tolerance(parts.exchange_options.values, n);
      parts.sparsifier = std::make_unique<ProbeSparsifier>(
          std::move(parts.sparsifier), make_scheme(name, scheme_opts).sparsifier, probe, run,
          options, evict);
      parts.memory = std::make_unique<ProbeMemory>(std::move(parts.memory), probe);
      SparseSync sync(std::move(parts));
      if (r == 0) run.exchange = std::string(exchange_pattern_name(sync.exchange_pattern()));

      UninitVector<float> gradient(d);
      for (std::int64_t t = 0; t < options.steps; ++t) {
        stream.fill(r, t, gradient);
        StepContext ctx;
        ctx.step = t;
        ctx.epoch = options.epoch;
        ctx.rank = r;
        ctx.world = n;
        ctx.layers = stream.layers();
        const StepMetrics metrics = sync.synchronize(gradient, ctx, comm);
        check_conservation(probe, comm, gradient, tolerance);
        if (probe.live == nullptr || metrics.selected != probe.live->size()) {
          throw probe.failure(
              fmt::format("the step reports {} selected elements, the selection "
                          "has {}",
                          metrics.selected, probe.live == nullptr ? 0 : probe.live->size()));
        }
        run.metrics[static_cast<std::size_t>(t) * static_cast<std::size_t>(n) +
                    static_cast<std::size_t>(r)] = metrics;
      }
    });
  } catch (...) {
    // SkipScheme on every rank (or, on a rank that lost the race, the world's
    // PeerFailure naming it): the row reports why.
    if (run.skipped.empty()) throw;
  }
  return run;
}

Row summarize(const SchemeRun& run, const Baselines& baselines, const Options& options) {
  const auto n = static_cast<std::size_t>(run.workers);
  Row row;
  row.scheme = run.scheme;
  row.exchange = run.exchange;
  row.skipped = run.skipped;
  if (!row.skipped.empty()) return row;
  std::vector<double> slowest, ratio, error, imbalance, floors, floor_ratios, fractions;
  double bytes = 0.0, raw = 0.0, encoded = 0.0, union_sum = 0.0, rounds = 0.0, rescans = 0.0;
  std::size_t steady = 0;
  for (std::size_t t = 0; t < static_cast<std::size_t>(run.steps); ++t) {
    if (timed_step(options, static_cast<std::int64_t>(t))) {
      double slow = 0.0;
      std::size_t with_floor = 0;
      for (std::size_t r = 0; r < n; ++r) {
        const std::size_t slot = t * n + r;
        slow = std::max(slow, run.select_ms[slot]);
        if (run.elements[slot] == 0) continue;  // no floor on this rank
        ++with_floor;
        // Footnote classes: a rank reading part of the vector (partition
        // schemes), or only one rank per step with a floor (CLT-k's leader).
        if (run.elements[slot] != run.numel) row.partitioned = true;
        floors.push_back(run.floor_ms[slot]);
        floor_ratios.push_back(run.select_ms[slot] / run.floor_ms[slot]);
        fractions.push_back(static_cast<double>(run.elements[slot]) /
                            static_cast<double>(run.numel));
      }
      if (n > 1 && with_floor == 1 && !row.partitioned) row.leader_only = true;
      slowest.push_back(slow);
    }
    if (t < static_cast<std::size_t>(options.warmup_steps)) continue;  // steady state only
    ++steady;
    const StepMetrics& m = run.metrics[t * n];  // K/k and imbalance are the same on every rank
    ratio.push_back(m.density_ratio);
    error.push_back(std::abs(m.density_ratio - 1.0));
    imbalance.push_back(m.imbalance);
    union_sum += static_cast<double>(m.union_size);
    rounds += m.selection_collectives;
    rescans += m.candidate_passes > 1 ? 1.0 : 0.0;
    for (std::size_t r = 0; r < n; ++r) {
      const StepMetrics& mr = run.metrics[t * n + r];
      bytes += static_cast<double>(mr.bytes_sent);
      raw += static_cast<double>(mr.index_bytes_raw);
      encoded += static_cast<double>(mr.index_bytes_encoded);
    }
  }
  const auto mean = [](const std::vector<double>& v) {
    double sum = 0.0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  };
  row.select_ms = median(slowest);
  if (!floors.empty()) {
    row.floor_ms = median(floors);
    row.floor_ratio = median(floor_ratios);
    row.read_fraction = median(fractions);
  }
  row.nth_element_speedup = baselines.nth_element_ms / row.select_ms;
  if (baselines.torch_topk_ms) row.torch_topk_speedup = *baselines.torch_topk_ms / row.select_ms;
  row.density_ratio_mean = mean(ratio);
  row.density_error_p95 = percentile(error, 0.95);
  row.imbalance_mean = mean(imbalance);
  row.imbalance_floor = imbalance_floor(
      run.workers, std::llround(union_sum / static_cast<double>(std::max<std::size_t>(steady, 1))));
  row.rounds_mean = rounds / static_cast<double>(std::max<std::size_t>(steady, 1));
  row.rescans = rescans / static_cast<double>(std::max<std::size_t>(steady, 1));
  row.bytes_per_rank = bytes / static_cast<double>(n * steady);
  if (raw > 0.0) row.index_bytes_saved = 1.0 - encoded / raw;
  return row;
}

// One object per scheme, keys in a fixed order.
nlohmann::ordered_json to_json(const Row& row, const Options& options) {
  const auto optional = [](const std::optional<double>& v) {
    return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  nlohmann::ordered_json j;
  j["scheme"] = row.scheme;

  j["numel"] = options.numel;
  j["density"] = options.density;
  j["workers"] = options.workers;
  j["steps"] = options.steps;
  j["select_ms"] = row.select_ms;
  j["floor_ms"] = optional(row.floor_ms);
  j["floor_ratio"] = optional(row.floor_ratio);
  j["nth_element_speedup"] = row.nth_element_speedup;
  j["torch_topk_speedup"] = optional(row.torch_topk_speedup);
  j["density_ratio_mean"] = row.density_ratio_mean;
  j["density_error_p95"] = row.density_error_p95;
  j["imbalance_mean"] = row.imbalance_mean;
  j["imbalance_floor"] = row.imbalance_floor;
  j["read_share"] = row.read_fraction ? nlohmann::ordered_json(*row.read_fraction * options.workers)
                                      : nlohmann::ordered_json(nullptr);
  j["selection_collectives_mean"] = row.rounds_mean;
  j["rescan_share"] = row.rescans;
  j["bytes_per_rank"] = row.bytes_per_rank;
  j["index_bytes_saved"] = optional(row.index_bytes_saved);
  j["source"] = options.source;
  if (!row.skipped.empty()) {  // not measured: every measurement is null
    nlohmann::ordered_json skipped;
    for (auto it = j.begin(); it != j.end(); ++it) {
      skipped[it.key()] = it.value().is_number() && it.key() != "numel" && it.key() != "density" &&
                                  it.key() != "workers" && it.key() != "steps"
                              ? nlohmann::ordered_json(nullptr)
                              : it.value();
    }
    skipped["skipped"] = row.skipped;
    return skipped;
  }
  return j;
}

void print_table(const std::vector<Row>& rows, const Baselines& b, const Machine& machine,
                 const Options& options) {
  const std::size_t k = target_count(options.density, options.numel);
  fmt::print(
      "sparsifier selection: d = {}, c = {} (k = {}), {} rank{} simulated in one process, "
      "{} steps ({} warm-up), seed {}\n",
      options.numel, options.density, k, options.workers, options.workers == 1 ? "" : "s",
      options.steps, options.warmup_steps, options.seed);
  fmt::print("source: {}\n", options.source);
  fmt::print("machine: {}, {} cores, {:.1f} GiB memory, load average {} at start; {}\n",
             machine.cpu, machine.cores, machine.memory_gib, machine.load, machine.date);
  fmt::print(
      "read bandwidth {:.1f} GB/s (1 thread, read pass over d floats: {:.2f} ms); "
      "std::nth_element {:.1f} ms; torch::topk {} (1 thread)\n",
      b.bandwidth_gbps, b.floor_ms, b.nth_element_ms,
      b.torch_topk_ms ? fmt::format("{:.1f} ms", *b.torch_topk_ms) : std::string("skipped"));
  const auto optional = [](const std::optional<double>& v, std::string_view suffix, int digits) {
    return v ? fmt::format("{:.{}f}{}", *v, digits, suffix) : std::string("-");
  };
  fmt::print(
      "{:<16} {:<16} {:>9} {:>9} {:>7} {:>6} {:>6} {:>8} {:>8} {:>8} {:>9} {:>7} {:>6} {:>6} "
      "{:>11} {:>9}\n",
      "scheme", "exchange", "select ms", "floor ms", "x floor", "read/d", "x d/n", "vs nth",
      "vs torch", "K/k mean", "|K/k-1|95", "imbal", "floor", "rounds", "bytes/rank", "idx saved");
  for (const Row& row : rows) {
    if (!row.skipped.empty()) {
      fmt::print("{:<16} {:<16} not measured: {}\n", row.scheme, row.exchange, row.skipped);
      continue;
    }
    fmt::print(
        "{:<16} {:<16} {:>9.3f} {:>9} {:>7} {:>6} {:>6} {:>7.1f}x {:>8} {:>8.3f} {:>9.3f} "
        "{:>7.3f} {:>6.3f} {:>6.2f} {:>11} {:>9}\n",
        row.scheme, row.exchange, row.select_ms, optional(row.floor_ms, "", 3),
        optional(row.floor_ratio, "", 2), optional(row.read_fraction, "", 3),
        row.read_fraction ? fmt::format("{:.2f}", *row.read_fraction * options.workers)
                          : std::string("-"),
        row.nth_element_speedup, optional(row.torch_topk_speedup, "x", 1), row.density_ratio_mean,
        row.density_error_p95, row.imbalance_mean, row.imbalance_floor, row.rounds_mean,
        format_bytes(row.bytes_per_rank),
        row.index_bytes_saved ? fmt::format("{:.1f}%", 100.0 * *row.index_bytes_saved)
                              : std::string("-"));
  }
  std::vector<std::string> timed;
  for (std::int64_t t = 0; t < options.steps; ++t) {
    if (timed_step(options, t)) timed.push_back(fmt::format("{}", t));
  }
  fmt::print(
      "select ms: each rank's select() re-run alone from its saved state (fastest of {} runs; "
      "what it receives from other ranks is replayed), caches evicted first; the slowest rank "
      "per step, median over the timed steps {} (every {}{} step from {}; every step runs, is "
      "verified and counted).\n",
      options.reps, fmt::join(timed, ", "), options.time_every,
      options.time_every == 1   ? "st"
      : options.time_every == 2 ? "nd"
      : options.time_every == 3 ? "rd"
                                : "th",
      first_timed_step(options));
  std::string partitioned, leader, unbounded;
  for (const Row& row : rows) {
    if (!row.skipped.empty()) continue;
    std::string* list = !row.floor_ms     ? &unbounded
                        : row.leader_only ? &leader
                        : row.partitioned ? &partitioned
                                          : nullptr;  // the whole vector
    if (list != nullptr) *list += fmt::format("{}{}", list->empty() ? "" : ", ", row.scheme);
  }
  std::string floor_note =
      "floor ms: a read pass over exactly the elements that rank's select() read, timed in the "
      "same turn on the same vector (caches evicted first), median over (rank, timed step); "
      "x floor: median over (rank, timed step) of that rank's select ms / its own floor; "
      "read/d: median elements read per (rank, step) / d; x d/n: the same in units of d/n "
      "(read_share in the JSON). Whole vector: the other schemes";
  if (!partitioned.empty()) {
    floor_note += fmt::format(
        "; {}: the rank's own partition (ExDyna: its block-cyclic blocks) or DEFT "
        "bin's pieces (+ the whole vector on the leader)",
        partitioned);
  }
  if (!leader.empty())
    floor_note += fmt::format("; {}: the leader only (the others gather k values)", leader);
  if (!unbounded.empty()) floor_note += fmt::format("; {}: none, k scattered values", unbounded);
  fmt::print("{}.\n", floor_note);
  fmt::print(
      "K/k, |K/k-1|95, imbal, floor, rounds, bytes/rank, idx saved: steady state, steps {}..{} "
      "(the first {} are warm-up). floor: the imbalance of the mean K elements dropped on the "
      "ranks uniformly at random (simulated), which no balancer beats. rounds: select()'s own "
      "collectives per step (the partition schemes' histogram rounds). vs nth / vs torch: baseline "
      "time / select ms, for the same k on |a| of rank "
      "0's first gradient. bytes/rank: sent per rank per step. idx saved: 1 - encoded / raw "
      "index bytes.\n",
      options.warmup_steps, options.steps - 1, options.warmup_steps);
}

// Checks the options against each other and the stream, and fills in what
// the stream supplies (a trace's numel, world and steps).
std::unique_ptr<GradientStream> open_stream(Options& options) {
  std::unique_ptr<GradientStream> stream;
  if (!options.trace.empty()) {
    if (options.synthetic_given) {
      throw InvalidArgument(
          "--drift, --skew and --tail shape the synthetic stream; they do not apply to --trace");
    }
    stream = open_trace(options.trace);
    const std::size_t numel = stream->numel();
    const int world = stream->world();
    const std::int64_t steps = stream->steps();
    if (options.numel_given && options.numel != numel) {
      throw InvalidArgument(fmt::format(
          "--numel {} does not match the trace {}, which has numel {} (leave --numel out to take "
          "the trace's)",
          options.numel, options.trace, numel));
    }
    if (options.workers_given && options.workers != world) {
      throw InvalidArgument(fmt::format(
          "--workers {} does not match the trace {}, recorded on {} ranks: each simulated rank "
          "replays its own recorded gradients (leave --workers out to take the trace's)",
          options.workers, options.trace, world));
    }
    if (options.steps_given && options.steps > steps) {
      throw InvalidArgument(fmt::format("--steps {} exceeds the {} steps recorded in the trace {}",
                                        options.steps, steps, options.trace));
    }
    options.numel = numel;
    options.workers = world;
    if (!options.steps_given) {
      if (steps > std::numeric_limits<int>::max()) {
        throw InvalidArgument(
            fmt::format("the trace {} has {} steps: pass --steps", options.trace, steps));
      }
      options.steps = static_cast<int>(steps);
    }
  }
  if (options.numel < 1 || options.numel > std::numeric_limits<Index>::max()) {
    throw InvalidArgument(fmt::format("--numel must be in [1, {}], got {}",
                                      std::numeric_limits<Index>::max(), options.numel));
  }
  if (options.workers < 1)
    throw InvalidArgument(fmt::format("--workers must be >= 1, got {}", options.workers));
  if (options.steps < 1)
    throw InvalidArgument(fmt::format("--steps must be >= 1, got {}", options.steps));
  if (options.warmup_steps < 0) options.warmup_steps = default_warmup(options.steps);
  if (options.time_every < 1)
    throw InvalidArgument(fmt::format("--time-every must be >= 1, got {}", options.time_every));
  if (first_timed_step(options) >= options.steps) {
    throw InvalidArgument(fmt::format(
        "--steps {} leaves no step to time: timing starts after the {} warm-up step{} and never "
        "on step 0 (the schemes' set-up); raise --steps or lower --warmup-steps",
        options.steps, options.warmup_steps, options.warmup_steps == 1 ? "" : "s"));
  }
  if (!stream) {
    SyntheticStreamOptions synthetic;
    synthetic.numel = options.numel;
    synthetic.drift_factor = options.drift;
    synthetic.drift_steps = options.steps;  // the drift spans the run
    synthetic.skew = options.skew;
    synthetic.tail = options.tail;
    synthetic.seed = options.seed;
    stream = make_synthetic_stream(synthetic);  // validates drift, skew, tail
  }
  options.source = stream->describe();
  return stream;
}

// The size of one last-level cache instance, from sysfs (sysconf's figure
// can be the whole package's: 384 MiB on a 32 MiB-per-CCD EPYC); 32 MiB if
// unknown.
std::size_t last_level_cache_bytes() {
  std::size_t best_level = 0, bytes = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/", index);
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    std::size_t level = 0, size = 0;
    std::string unit;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    size_file >> unit;
    if (unit.starts_with("K")) size <<= 10;
    if (unit.starts_with("M")) size <<= 20;
    if (level >= best_level) {
      best_level = level;
      bytes = size;
    }
  }
  return bytes > 0 ? bytes : std::size_t{32} << 20;
}

// The eviction buffer: 4x the last-level cache, in [64, 512] MiB.
std::size_t eviction_floats() {
  const std::size_t bytes = std::clamp<std::size_t>(4 * last_level_cache_bytes(),
                                                    std::size_t{64} << 20, std::size_t{512} << 20);
  return bytes / sizeof(float);
}

void run(Options options) {
  if (launched_by_mpirun()) {
    throw InvalidArgument(
        "bench sparsifiers simulates its --workers ranks as threads of one process, so that each "
        "rank's selection can be timed alone on the whole machine; run it without mpirun (under "
        "mpirun every process would repeat the whole simulation)");
  }
  if (options.format != "table" && options.format != "json") {
    throw InvalidArgument(fmt::format("--format '{}': valid are table, json", options.format));
  }
  if (!(options.density > 0.0 && options.density <= 1.0)) {
    throw InvalidArgument(fmt::format("--density must be in (0, 1], got {}", options.density));
  }
  if (options.reps < 1)
    throw InvalidArgument(fmt::format("--reps must be >= 1, got {}", options.reps));
  if (!(options.epoch >= 0.0))
    throw InvalidArgument(fmt::format("--epoch must be >= 0, got {}", options.epoch));
  if (options.warmup_steps < -1) {
    throw InvalidArgument(fmt::format("--warmup-steps must be >= 0, got {}", options.warmup_steps));
  }
  const std::unique_ptr<GradientStream> stream = open_stream(options);

  const std::vector<std::string> names = resolve_schemes(options);
  const SchemeOptions scheme_opts = scheme_options(options);
  for (const std::string& name : names) {  // options errors first
    make_scheme(name, scheme_opts);
  }

  // Per rank: its gradient, the memory's accumulated buffer (DGC: two) and
  // SparseSync's output; plus the baselines' and the synthetic stream's own
  // d-float buffers and the eviction buffer.
  const Machine machine = describe_machine();
  const std::size_t evict_floats = eviction_floats();
  const double needed_gib = (static_cast<double>(options.numel) * (4.0 * options.workers + 3.0) +
                             static_cast<double>(evict_floats)) *
                            sizeof(float) / (1024.0 * 1024.0 * 1024.0);
  if (machine.available_gib > 0.0 && needed_gib > 0.8 * machine.available_gib) {
    throw InvalidArgument(fmt::format(
        "{} ranks x d = {} need about {:.1f} GiB (4 buffers of d floats per rank) but only {:.1f} "
        "GiB are available: lower --workers or --numel",
        options.workers, options.numel, needed_gib, machine.available_gib));
  }

  // What is left once every rank's buffers exist: the exchange's budget.
  options.exchange_budget_gib =
      machine.available_gib > 0.0 ? 0.8 * machine.available_gib - needed_gib : 0.0;
  std::vector<float> evict(evict_floats, 1.0f);  // touched: real pages, not the zero page
  const Baselines baselines = measure_baselines(*stream, options);
  std::vector<Row> rows;
  for (const std::string& name : names) {
    rows.push_back(
        summarize(run_scheme(name, scheme_opts, *stream, evict, options), baselines, options));
  }

  if (options.format == "json") {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const Row& row : rows) out.push_back(to_json(row, options));
    std::cout << out.dump(2) << std::endl;
  } else {
    print_table(rows, baselines, machine, options);
  }
}

}  // namespace

void add_bench_sparsifiers_command(CLI::App& bench) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "sparsifiers",
      "Selection time vs the bandwidth floor, std::nth_element and torch::topk; density, "
      "imbalance and bytes per scheme, on the synthetic gradient stream or a recorded trace");
  CLI::Option* numel =
      cmd->add_option("--numel,-d", options->numel, "gradient length d (a trace: its own)")
          ->capture_default_str();
  cmd->add_option("--density,-c", options->density, "target density c in (0, 1]")
      ->capture_default_str();
  CLI::Option* workers =
      cmd->add_option("--workers,-n", options->workers,
                      "ranks, simulated as threads of one process (a trace: its world; if given "
                      "it must match)")
          ->capture_default_str();
  CLI::Option* steps =
      cmd->add_option("--steps", options->steps,
                      "steps of the gradient stream (a trace: all its steps unless given)")
          ->capture_default_str();
  cmd->add_option("--warmup-steps", options->warmup_steps,
                  "leading steps left out of the density, imbalance and bytes statistics and "
                  "of timing (default: 20% of the steps, at least 10 when steps >= 50)");
  cmd->add_option("--time-every", options->time_every,
                  "time the selection on every N-th step after the warm-up")
      ->capture_default_str();
  cmd->add_option("--reps", options->reps,
                  "timed runs of each rank's selection per timed step (the fastest counts), and "
                  "of each baseline (median)")
      ->capture_default_str();
  cmd->add_option("--schemes", options->schemes,
                  "comma-separated schemes (default: every registered one)");
  cmd->add_option("--opt", options->opts,
                  "key=value passed to every scheme (repeatable); density and seed have their "
                  "own flags");
  cmd->add_option("--trace", options->trace,
                  "replay a recorded gradient trace directory (meta.json + rank<r>.f32) instead "
                  "of the synthetic stream");
  cmd->add_option("--seed", options->seed, "seed of the synthetic stream and the schemes")
      ->capture_default_str();
  CLI::Option* drift =
      cmd->add_option("--drift", options->drift,
                      "synthetic stream: the overall scale falls this factor over the run")
          ->capture_default_str();
  CLI::Option* skew =
      cmd->add_option("--skew", options->skew, "synthetic stream: regional skew (0: none)")
          ->capture_default_str();
  CLI::Option* tail =
      cmd->add_option("--tail", options->tail, "synthetic stream: heavy-tail strength (0: normal)")
          ->capture_default_str();
  cmd->add_option("--epoch", options->epoch,
                  "fractional epoch passed to the schemes (DGC warm-up); the default is past any "
                  "warm-up")
      ->capture_default_str();
  cmd->add_option("--format", options->format, "table | json")->capture_default_str();
  cmd->add_flag("--no-torch", options->no_torch, "skip the torch::topk baseline");
  cmd->callback([options, numel, workers, steps, drift, skew, tail] {
    Options resolved = *options;
    resolved.numel_given = numel->count() > 0;
    resolved.workers_given = workers->count() > 0;
    resolved.steps_given = steps->count() > 0;
    resolved.synthetic_given = drift->count() + skew->count() + tail->count() > 0;
    run(std::move(resolved));
  });
}

}  // namespace sparsecomm::cli
