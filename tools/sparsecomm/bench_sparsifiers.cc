// `sparsecomm bench sparsifiers` (see bench_sparsifiers.h).
//
// How it measures (../shared/BENCHMARKS.md):
//  - The n ranks are threads of this process (run_thread_world). Each drives
//    its own SparseSync, built by make_scheme, over the same deterministic
//    synthetic gradient stream, so K/k, imbalance and bytes come from the
//    library's own synchronization step.
//  - Selection is timed apart from that concurrent step, each rank alone, one
//    after another: the sparsifier handed to SparseSync is a probe wrapping
//    the scheme's. Inside select() the probe saves the scheme's state, runs
//    the real selection (recording whatever the scheme communicates while
//    selecting), verifies it, and then the ranks take turns: rank 0 re-runs
//    the selection on its accumulated vector while every other rank waits in
//    a barrier, then rank 1, and so on. The re-run is a second instance of
//    the scheme loaded with the saved state and talking to a replay of the
//    recorded communication, so it makes exactly the same choice (checked)
//    with the machine to itself. What it receives (CLT-k's broadcast, the
//    partition schemes' counts) arrives at once from the recording, so the
//    time is the selection's own work, not waiting for other ranks. The
//    floor read pass is timed in the same turn, on the same vector, over the
//    elements the scheme reads.
//  - Memory: per rank its gradient, the memory's buffer(s) and SparseSync's
//    output (d floats each), plus one shared d-float buffer; the stream is
//    generated on the fly each step. 8 ranks x d = 25M: about 3 GB.
//  - select_ms: per step the slowest rank (the step waits for it; for CLT-k
//    that is the leader, the only rank that runs a top-k), then the median
//    over steps 1 and later (step 0, the schemes' set-up, is not timed).
//    Each rank's figure for a step is the fastest of --reps runs (on this
//    shared machine noise only ever adds time); the floor likewise.
//  - Verified before anything is reported: every selection (indices strictly
//    ascending, inside [0, d), values equal to the accumulated vector), the
//    positions each rank transmitted (ascending, covering its selection), and
//    conservation on a sample of positions every step (the averaged gradient
//    equals the mean over ranks of what each rank's memory gave up).

#include "bench_sparsifiers.h"

#include <algorithm>
#include <array>
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
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "sparsecomm/collectives/codec.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/comm/communicator.h"
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
#include "sparsecomm/sync/sparse_sync.h"
#include "sparsecomm/sync/step_metrics.h"
#include "torch_topk.h"

namespace sparsecomm::cli {
namespace {

struct Options {
  std::size_t numel = 25'000'000;
  double density = 0.001;
  int workers = 8;
  int steps = 20;
  int reps = 5;
  std::string schemes;            // empty: every registered scheme
  std::vector<std::string> opts;  // key=value, passed to every scheme
  std::string trace;
  bool trace_given = false;
  std::uint64_t seed = 1;
  double epoch = 100.0;
  std::string format = "table";
  bool no_torch = false;
};

// ---------------------------------------------------------------------------
// Synthetic gradient stream. Self-contained so it can move to the reusable
// generator that comes with the next issue; gradient traces (issue 4) will
// replace it for real gradients.
// ---------------------------------------------------------------------------

// A 64-bit mixing function (xor-shift / multiply finalizer): a cheap, good
// hash of a counter, so every element is a pure function of (key, index).
constexpr std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  x ^= x >> 33;
  return x;
}

constexpr std::uint64_t combine(std::uint64_t a, std::uint64_t b) {
  return mix64(a ^ mix64(b + 0x9e3779b97f4a7c15ull));
}

// Standard normal quantile by bisection on the CDF (256 table entries, once).
double normal_quantile(double p) {
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return 0.5 * (lo + hi);
}

// Synthetic per-rank gradients g_r(t), deterministic per (seed, rank, step):
//  - heavy-tailed magnitudes: each element is an approximately normal value
//    (a sum of four 12-bit uniforms) times a lognormal scale (sigma 1, 256
//    quantiles), so |g| has a long tail;
//  - 10 pseudo-layers of unequal size whose scales span 100x (in shuffled
//    order along the vector);
//  - regional skew: 64 regions with fixed factors in [0.5, 2] plus a hot
//    window of 8 regions (x3) that moves one region every 2 steps, so the
//    load of any fixed partition of the vector changes over time;
//  - correlation: half of each rank's variance is shared by all ranks, and
//    part of the shared half persists across steps (as real gradients do),
//    so Top-k unions land between k and n*k and error feedback builds up.
// The scale (RMS of g between 4e-5 and 8e-5, as the hot window moves) puts
// the reference hard threshold 1/(2 sqrt(k)) within an order of magnitude of
// the target: over 20 steps at d = 25M one rank selects 0.05k to 0.3k at
// c = 0.1% and 0.1k to 0.25k at c = 1%. Every other scheme is scale-free.
class SyntheticGradientStream {
 public:
  static constexpr int kLayers = 10;
  static constexpr std::size_t kRegions = 64;
  static constexpr std::size_t kHotRegions = 8;
  static constexpr float kHotFactor = 3.0f;
  static constexpr std::int64_t kStepsPerHotMove = 2;
  static constexpr double kSharedVariance = 0.5;       // of each rank's gradient
  static constexpr double kPersistentVariance = 0.36;  // of the shared part
  static constexpr double kScale = 1e-4;

  SyntheticGradientStream(std::size_t numel, std::uint64_t seed) : numel_(numel), seed_(seed) {
    build_table();
    build_layers();
    build_segments();
  }

  std::size_t numel() const { return numel_; }
  const std::vector<LayerSpan>& layers() const { return layers_; }

  // The part shared by every rank at `step`, for elements [begin, end) of
  // `shared` (length numel). Disjoint ranges may be filled concurrently.
  void fill_shared(std::int64_t step, std::size_t begin, std::size_t end,
                   std::span<float> shared) const {
    const std::uint64_t persistent_key = combine(seed_, 0x5045525349535431ull);
    const std::uint64_t fresh_key =
        combine(combine(seed_, 0x4652455348535450ull), static_cast<std::uint64_t>(step));
    const double shared_sd = std::sqrt(kSharedVariance);
    for (const Segment& s : segments_) {
      const std::size_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
      if (lo >= hi) continue;
      const double f = kScale * s.factor * hot_factor(s.region, step) * shared_sd;
      const auto fp = static_cast<float>(f * std::sqrt(kPersistentVariance));
      const auto ff = static_cast<float>(f * std::sqrt(1.0 - kPersistentVariance));
      for (std::size_t i = lo; i < hi; ++i) {
        shared[i] = fp * heavy_tailed(persistent_key, i) + ff * heavy_tailed(fresh_key, i);
      }
    }
  }

  // Rank `rank`'s gradient at `step`: the shared part plus its own.
  void fill_rank(int rank, std::int64_t step, std::span<const float> shared,
                 std::span<float> out) const {
    const std::uint64_t key =
        combine(combine(combine(seed_, 0x52414e4b00000000ull), static_cast<std::uint64_t>(rank)),
                static_cast<std::uint64_t>(step));
    const double own_sd = std::sqrt(1.0 - kSharedVariance);
    for (const Segment& s : segments_) {
      const auto fo = static_cast<float>(kScale * s.factor * hot_factor(s.region, step) * own_sd);
      for (std::size_t i = s.begin; i < s.end; ++i) out[i] = shared[i] + fo * heavy_tailed(key, i);
    }
  }

 private:
  struct Segment {
    std::size_t begin = 0, end = 0;
    std::size_t region = 0;
    double factor = 1.0;  // layer scale x region scale
  };

  // Approximately normal (Irwin-Hall of four 12-bit uniforms) times a
  // lognormal scale; unit variance.
  float heavy_tailed(std::uint64_t key, std::size_t i) const {
    const std::uint64_t h = mix64(key + static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull);
    const auto sum = static_cast<std::uint32_t>((h & 0xfff) + ((h >> 12) & 0xfff) +
                                                ((h >> 24) & 0xfff) + ((h >> 36) & 0xfff));
    // Mean 4 * 4095/2, standard deviation sqrt(4 * (4096^2 - 1) / 12).
    constexpr float kCenter = 8190.0f;
    constexpr float kInvSd = 1.0f / 2364.8f;
    return (static_cast<float>(sum) - kCenter) * kInvSd * table_[h >> 56];
  }

  float hot_factor(std::size_t region, std::int64_t step) const {
    const auto start = static_cast<std::size_t>(step / kStepsPerHotMove) % kRegions;
    return (region + kRegions - start) % kRegions < kHotRegions ? kHotFactor : 1.0f;
  }

  void build_table() {
    constexpr double kSigma = 1.0;
    for (std::size_t j = 0; j < table_.size(); ++j) {
      const double q = normal_quantile((static_cast<double>(j) + 0.5) / 256.0);
      // Divided by sqrt(E[scale^2]) = exp(sigma^2) so the product has unit variance.
      table_[j] = static_cast<float>(std::exp(kSigma * q - kSigma * kSigma));
    }
  }

  void build_layers() {
    const int count = static_cast<int>(std::min<std::size_t>(kLayers, numel_));
    // Unequal sizes (weights 1..5) and scales 10^0 .. 10^-2 in shuffled order.
    std::vector<std::size_t> weight(static_cast<std::size_t>(count));
    std::size_t total_weight = 0;
    for (int l = 0; l < count; ++l) {
      weight[static_cast<std::size_t>(l)] = 1 + static_cast<std::size_t>((l * 7) % 5);
      total_weight += weight[static_cast<std::size_t>(l)];
    }
    std::size_t offset = 0, cumulative = 0;
    for (int l = 0; l < count; ++l) {
      cumulative += weight[static_cast<std::size_t>(l)];
      std::size_t end = l + 1 == count ? numel_ : numel_ * cumulative / total_weight;
      end = std::max(end, offset + 1);  // every layer has at least one element
      layers_.push_back({fmt::format("layer{}", l), offset, end - offset});
      const int rank_in_scale = (l * 3) % kLayers;  // 0, 3, 6, 9, 2, 5, 8, 1, 4, 7
      layer_scale_.push_back(std::pow(10.0, -2.0 * rank_in_scale / (kLayers - 1)));
      offset = end;
    }
  }

  void build_segments() {
    std::vector<double> region_scale(kRegions);
    for (std::size_t g = 0; g < kRegions; ++g) {
      const std::uint64_t h = combine(combine(seed_, 0x524547494f4e0000ull), g);
      const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
      region_scale[g] = std::exp2(2.0 * u - 1.0);                 // [0.5, 2)
    }
    const auto region_begin = [&](std::size_t g) { return numel_ * g / kRegions; };
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const std::size_t lo = layers_[l].offset, hi = lo + layers_[l].size;
      for (std::size_t g = 0; g < kRegions; ++g) {
        const std::size_t b = std::max(lo, region_begin(g)), e = std::min(hi, region_begin(g + 1));
        if (b < e) segments_.push_back({b, e, g, layer_scale_[l] * region_scale[g]});
      }
    }
  }

  std::size_t numel_;
  std::uint64_t seed_;
  std::array<float, 256> table_{};
  std::vector<LayerSpan> layers_;
  std::vector<double> layer_scale_;
  std::vector<Segment> segments_;
};

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

// Step 0 is verified but not timed: it is the schemes' set-up step (first
// use of their scratch, initial thresholds from an all-reduced histogram),
// not the steady state a training run spends its time in.
constexpr std::int64_t kFirstTimedStep = 1;

// Everything one scheme's run records, indexed [step * workers + rank].
struct SchemeRun {
  std::string scheme;
  std::string exchange;
  int workers = 0;
  int steps = 0;
  std::vector<double> select_ms;
  std::vector<double> floor_ms;  // read pass over all d elements
  std::vector<StepMetrics> metrics;
  std::optional<std::size_t> floor_elements;  // none: no floor (Random-k)
  std::size_t numel = 0;
};

// Elements one rank's select() reads, for its floor: the whole vector for the
// classic schemes (DEFT included), d/n for the partition schemes (MiCRO and
// ExDyna: their mean partition; ExDyna's vary in size). Random-k reads only
// the k values at its random indices: no streaming read pass bounds that, so
// it has no floor.
//
// The pass is always timed over all d elements and scaled to the elements
// read: the floor is defined on data larger than the last-level cache, which
// a d/n partition need not be (12.5 MB at d = 25M, n = 8 against a 32 MB L3).
// The full pass before every re-run also evicts what the previous run read,
// so no timed selection starts from a warm cache.
std::optional<std::size_t> elements_read(std::string_view scheme, std::size_t numel, int workers) {
  if (scheme == "randomk") return std::nullopt;
  if (scheme == "micro" || scheme.starts_with("exdyna")) {
    const auto n = static_cast<std::size_t>(workers);
    return (numel + n - 1) / n;
  }
  return numel;
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
                  RankProbe& probe, SchemeRun& run, int reps)
      : inner_(std::move(inner)), twin_(std::move(twin)), probe_(probe), run_(run), reps_(reps) {}

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
    probe_.live = &out;
    verify_selection(probe_, out, accumulated);
    take_sample(comm, accumulated, out);
    // 3. Each rank alone: rank q re-runs its selection while all others wait
    //    in the barrier that ends its turn.
    if (ctx.step < kFirstTimedStep) return;
    for (int q = 0; q < comm.size(); ++q) {
      comm.barrier();
      if (q == comm.rank()) time_alone(accumulated, ctx, comm, out);
    }
    comm.barrier();
  }

 private:
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
    const std::uint64_t key = combine(combine(probe_.seed, 0x53414d504c450000ull),
                                      static_cast<std::uint64_t>(probe_.step));
    for (std::size_t j = 0; j < std::min(kRandom, probe_.numel); ++j) {
      sample.push_back(static_cast<Index>(combine(key, j) % probe_.numel));
    }
    std::sort(sample.begin(), sample.end());
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
    probe_.before.resize(sample.size());
    for (std::size_t j = 0; j < sample.size(); ++j) probe_.before[j] = accumulated[sample[j]];
  }

  void time_alone(std::span<const float> accumulated, const StepContext& ctx, Communicator& comm,
                  const SparseSelection& out) {
    ReplayCommunicator replay(comm.rank(), comm.size(), comm.has_native_allreduce(), log_,
                              probe_.scheme);
    std::vector<double> select_ms, floor_ms;
    for (int rep = 0; rep < reps_; ++rep) {
      Stopwatch floor_clock;
      sink_ += read_pass(accumulated);
      floor_ms.push_back(floor_clock.seconds() * 1e3);

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
    run_.floor_ms[slot] = *std::min_element(floor_ms.begin(), floor_ms.end());
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
  int reps_;
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
  std::optional<std::size_t> floor_elements;
  std::optional<double> floor_ratio;
  double nth_element_speedup = 0.0;
  std::optional<double> torch_topk_speedup;
  double density_ratio_mean = 0.0;
  double density_error_p95 = 0.0;
  double imbalance_mean = 0.0;
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
Baselines measure_baselines(const SyntheticGradientStream& stream, std::span<float> shared,
                            const Options& options) {
  const std::size_t d = stream.numel();
  const std::size_t k = target_count(options.density, d);
  stream.fill_shared(0, 0, d, shared);
  UninitVector<float> a(d);
  stream.fill_rank(0, 0, shared, a);
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
                     const SyntheticGradientStream& stream, std::span<float> shared,
                     const Options& options) {
  const std::size_t d = stream.numel();
  const int n = options.workers;
  SchemeRun run;
  run.scheme = name;
  run.workers = n;
  run.steps = options.steps;
  const std::size_t slots = static_cast<std::size_t>(n) * static_cast<std::size_t>(options.steps);
  run.select_ms.assign(slots, 0.0);
  run.floor_ms.assign(slots, 0.0);
  run.metrics.assign(slots, StepMetrics{});
  run.floor_elements = elements_read(name, d, n);
  run.numel = d;

  run_thread_world(n, [&](Communicator& comm) {
    const int r = comm.rank();
    RankProbe probe;
    probe.scheme = run.scheme;
    probe.rank = r;
    probe.numel = d;
    probe.seed = options.seed;

    SchemeParts parts = make_scheme(name, scheme_opts);
    const double tolerance = conservation_tolerance(parts.exchange_options.values, n);
    parts.sparsifier = std::make_unique<ProbeSparsifier>(std::move(parts.sparsifier),
                                                         make_scheme(name, scheme_opts).sparsifier,
                                                         probe, run, options.reps);
    parts.memory = std::make_unique<ProbeMemory>(std::move(parts.memory), probe);
    SparseSync sync(std::move(parts));
    if (r == 0) run.exchange = std::string(exchange_pattern_name(sync.exchange_pattern()));

    UninitVector<float> gradient(d);
    const std::size_t lo = d * static_cast<std::size_t>(r) / static_cast<std::size_t>(n);
    const std::size_t hi = d * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(n);
    for (std::int64_t t = 0; t < options.steps; ++t) {
      comm.barrier();  // everyone is done with the previous step's shared part
      stream.fill_shared(t, lo, hi, shared);
      comm.barrier();
      stream.fill_rank(r, t, shared, gradient);
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
  return run;
}

Row summarize(const SchemeRun& run, const Baselines& baselines) {
  const auto n = static_cast<std::size_t>(run.workers);
  Row row;
  row.scheme = run.scheme;
  row.exchange = run.exchange;
  row.floor_elements = run.floor_elements;
  std::vector<double> slowest, ratio, error, imbalance;
  double bytes = 0.0, raw = 0.0, encoded = 0.0;
  std::vector<double> floors;
  for (std::size_t t = 0; t < static_cast<std::size_t>(run.steps); ++t) {
    if (t >= static_cast<std::size_t>(kFirstTimedStep)) {
      const auto first = run.select_ms.begin() + static_cast<std::ptrdiff_t>(t * n);
      slowest.push_back(*std::max_element(first, first + static_cast<std::ptrdiff_t>(n)));
      floors.insert(floors.end(), run.floor_ms.begin() + static_cast<std::ptrdiff_t>(t * n),
                    run.floor_ms.begin() + static_cast<std::ptrdiff_t>((t + 1) * n));
    }
    const StepMetrics& m = run.metrics[t * n];  // K/k and imbalance are the same on every rank
    ratio.push_back(m.density_ratio);
    error.push_back(std::abs(m.density_ratio - 1.0));
    imbalance.push_back(m.imbalance);
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
  if (run.floor_elements) {
    row.floor_ms =
        median(floors) * static_cast<double>(*run.floor_elements) / static_cast<double>(run.numel);
    row.floor_ratio = row.select_ms / *row.floor_ms;
  }
  row.nth_element_speedup = baselines.nth_element_ms / row.select_ms;
  if (baselines.torch_topk_ms) row.torch_topk_speedup = *baselines.torch_topk_ms / row.select_ms;
  row.density_ratio_mean = mean(ratio);
  row.density_error_p95 = percentile(error, 0.95);
  row.imbalance_mean = mean(imbalance);
  row.bytes_per_rank = bytes / static_cast<double>(n * static_cast<std::size_t>(run.steps));
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
  j["bytes_per_rank"] = row.bytes_per_rank;
  j["index_bytes_saved"] = optional(row.index_bytes_saved);
  return j;
}

void print_table(const std::vector<Row>& rows, const Baselines& b, const Machine& machine,
                 const Options& options) {
  const std::size_t k = target_count(options.density, options.numel);
  fmt::print(
      "sparsifier selection: d = {}, c = {} (k = {}), {} rank{} simulated in one process, "
      "{} steps, seed {}\n",
      options.numel, options.density, k, options.workers, options.workers == 1 ? "" : "s",
      options.steps, options.seed);
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
  fmt::print("{:<16} {:<16} {:>9} {:>9} {:>7} {:>8} {:>8} {:>8} {:>9} {:>7} {:>11} {:>9}\n",
             "scheme", "exchange", "select ms", "floor ms", "x floor", "vs nth", "vs torch",
             "K/k mean", "|K/k-1|95", "imbal", "bytes/rank", "idx saved");
  for (const Row& row : rows) {
    fmt::print(
        "{:<16} {:<16} {:>9.3f} {:>9} {:>7} {:>7.1f}x {:>8} {:>8.3f} {:>9.3f} {:>7.3f} "
        "{:>11} {:>9}\n",
        row.scheme, row.exchange, row.select_ms, optional(row.floor_ms, "", 3),
        optional(row.floor_ratio, "", 2), row.nth_element_speedup,
        optional(row.torch_topk_speedup, "x", 1), row.density_ratio_mean, row.density_error_p95,
        row.imbalance_mean, format_bytes(row.bytes_per_rank),
        row.index_bytes_saved ? fmt::format("{:.1f}%", 100.0 * *row.index_bytes_saved)
                              : std::string("-"));
  }
  fmt::print(
      "select ms: each rank's select() timed alone (fastest of {} runs; what it receives "
      "from other ranks is replayed), the slowest rank per step, median over steps 1..{}.\n",
      options.reps, options.steps - 1);
  std::string floor_note = "floor ms: read pass over the elements the scheme reads (d";
  std::string partitioned, unbounded;
  std::size_t partition = 0;
  for (const Row& row : rows) {
    std::string& list = !row.floor_elements                    ? unbounded
                        : *row.floor_elements != options.numel ? partitioned
                                                               : floor_note;
    if (&list == &floor_note) continue;
    if (row.floor_elements) partition = *row.floor_elements;
    list += fmt::format("{}{}", list.empty() ? "" : ", ", row.scheme);
  }
  if (!partitioned.empty()) {
    floor_note += fmt::format("; {}: d/n = {}, the d pass scaled by 1/n", partitioned, partition);
  }
  if (!unbounded.empty())
    floor_note += fmt::format("; {}: none, it reads k scattered values", unbounded);
  fmt::print(
      "{}), fastest of the runs in each rank's turn (same data as its select), median "
      "over turns.\n",
      floor_note);
  fmt::print(
      "vs nth / vs torch: baseline time / select ms, for the same k on |a| of rank 0's "
      "first gradient. bytes/rank: sent per rank per step. idx saved: 1 - encoded / raw "
      "index bytes.\n");
}

void run(const Options& options) {
  if (options.trace_given) {
    throw NotSupported(fmt::format(
        "--trace {}: not yet supported: gradient traces arrive with issue 4 (omit --trace to use "
        "the synthetic gradient stream)",
        options.trace));
  }
  if (options.format != "table" && options.format != "json") {
    throw InvalidArgument(fmt::format("--format '{}': valid are table, json", options.format));
  }
  if (options.numel < 1 || options.numel > std::numeric_limits<Index>::max()) {
    throw InvalidArgument(fmt::format("--numel must be in [1, {}], got {}",
                                      std::numeric_limits<Index>::max(), options.numel));
  }
  if (!(options.density > 0.0 && options.density <= 1.0)) {
    throw InvalidArgument(fmt::format("--density must be in (0, 1], got {}", options.density));
  }
  if (options.workers < 1)
    throw InvalidArgument(fmt::format("--workers must be >= 1, got {}", options.workers));
  if (options.steps < kFirstTimedStep + 1) {
    throw InvalidArgument(
        fmt::format("--steps must be >= {} (step 0 is verified but not timed), got {}",
                    kFirstTimedStep + 1, options.steps));
  }
  if (options.reps < 1)
    throw InvalidArgument(fmt::format("--reps must be >= 1, got {}", options.reps));
  if (!(options.epoch >= 0.0))
    throw InvalidArgument(fmt::format("--epoch must be >= 0, got {}", options.epoch));

  const std::vector<std::string> names = resolve_schemes(options);
  const SchemeOptions scheme_opts = scheme_options(options);
  for (const std::string& name : names) make_scheme(name, scheme_opts);  // options errors first

  // Per rank: its gradient, the memory's accumulated buffer (DGC: two) and
  // SparseSync's output; plus the shared part of the stream.
  const Machine machine = describe_machine();
  const double needed_gib = static_cast<double>(options.numel) * sizeof(float) *
                            (4.0 * options.workers + 3.0) / (1024.0 * 1024.0 * 1024.0);
  if (machine.available_gib > 0.0 && needed_gib > 0.8 * machine.available_gib) {
    throw InvalidArgument(fmt::format(
        "{} ranks x d = {} need about {:.1f} GiB (4 buffers of d floats per rank) but only {:.1f} "
        "GiB are available: lower --workers or --numel",
        options.workers, options.numel, needed_gib, machine.available_gib));
  }

  const SyntheticGradientStream stream(options.numel, options.seed);
  UninitVector<float> shared(options.numel);
  const Baselines baselines = measure_baselines(stream, shared, options);
  std::vector<Row> rows;
  for (const std::string& name : names) {
    rows.push_back(summarize(run_scheme(name, scheme_opts, stream, shared, options), baselines));
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
      "imbalance and bytes per scheme");
  cmd->add_option("--numel,-d", options->numel, "gradient length d")->capture_default_str();
  cmd->add_option("--density,-c", options->density, "target density c in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--workers,-n", options->workers, "ranks, simulated as threads of one process")
      ->capture_default_str();
  cmd->add_option("--steps", options->steps, "steps of the gradient stream")->capture_default_str();
  cmd->add_option("--reps", options->reps,
                  "timed runs of each rank's selection per step, and of each baseline (median)")
      ->capture_default_str();
  cmd->add_option("--schemes", options->schemes,
                  "comma-separated schemes (default: every registered one)");
  cmd->add_option("--opt", options->opts,
                  "key=value passed to every scheme (repeatable); density and seed have their "
                  "own flags");
  CLI::Option* trace = cmd->add_option("--trace", options->trace,
                                       "replay a gradient trace directory (not yet supported)");
  cmd->add_option("--seed", options->seed, "seed of the gradient stream and the schemes")
      ->capture_default_str();
  cmd->add_option("--epoch", options->epoch,
                  "fractional epoch passed to the schemes (DGC warm-up); the default is past any "
                  "warm-up")
      ->capture_default_str();
  cmd->add_option("--format", options->format, "table | json")->capture_default_str();
  cmd->add_flag("--no-torch", options->no_torch, "skip the torch::topk baseline");
  cmd->callback([options, trace] {
    options->trace_given = trace->count() > 0;
    run(*options);
  });
}

}  // namespace sparsecomm::cli
