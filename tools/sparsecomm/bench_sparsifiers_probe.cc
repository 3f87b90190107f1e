// The probes of `sparsecomm bench sparsifiers` (see bench_sparsifiers.cc, "How
// it measures", and docs/benchmarks/methodology.md, "How we measure"): each
// rank's sparsifier and memory are wrapped so that its selection is verified,
// its communication recorded, and on a timed step re-run alone against a replay
// of that recording, next to a read pass over the elements it read.

#include "bench_sparsifiers_probe.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "bench_util.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/comm/recording.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/hash.h"
#include "sparsecomm/core/log.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/report/statistics.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sparsify/sparsifier.h"
#include "sparsecomm/sync/sparsify_exchange_step.h"
#include "torch_topk.h"

namespace sparsecomm::cli {
namespace {

// Thrown on every rank, identically, to stop a scheme whose exchange would
// not fit in memory; `reason` is the row's "not measured" text. Whichever
// rank throws first is the world's failure (the others may only see its
// PeerFailure), so every rank carries the reason.
struct SkipScheme {
  std::string reason;
};

// ---------------------------------------------------------------------------
// Which elements one rank's select() read, for its floor
// (docs/benchmarks/methodology.md, "How we measure": a read pass over the same
// elements the kernel touches): what the scheme itself reports
// (Sparsifier::last_read()) for the selection just made. The whole vector for
// topk, threshold, dgc, gaussiank and the CLT-k leader; the rank's own
// partition for micro and exdyna (ExDyna's sizes follow the selected load);
// DEFT's bin pieces (+ the whole vector on the leader); nothing for Random-k
// and CLT-k followers (k scattered values). Every timed step checks that the
// selected indices lie inside those ranges.
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
  const SparseSelection* live = nullptr;  // this step's selection (owned by SparsifyExchangeStep)
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
                  RankProbe& probe, SchemeRun& run, const SparsifierBenchOptions& options,
                  std::span<const float> evict)
      : inner_(std::move(inner)),
        twin_(std::move(twin)),
        probe_(probe),
        run_(run),
        options_(options),
        evict_(evict) {}

  std::string_view name() const override { return inner_->name(); }
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
    const double k = static_cast<double>(target(probe_.numel, StepContext{}));
    throw SkipScheme{fmt::format(
        "stopped at step {}: the ranks selected {:.0f} elements in all ({:.0f}% of n*d, "
        "sum |I_r| / k = {:.0f}); exchanging that needs about {:.1f} GiB, over the {:.1f} GiB "
        "available",
        probe_.step, total, 100.0 * total / (static_cast<double>(probe_.numel) * comm.size()),
        total / std::max(k, 1.0), needed_gib, options_.exchange_budget_gib)};
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
    ReplayCommunicator replay(
        comm.rank(), comm.size(), comm.has_native_allreduce(), log_,
        fmt::format("[bench] {}: the re-run of select() from its saved state", probe_.scheme));
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
  const SparsifierBenchOptions& options_;
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

}  // namespace

SchemeRun run_scheme(const std::string& name, const SchemeOptions& scheme_opts,
                     const GradientStream& stream, std::span<const float> evict,
                     const SparsifierBenchOptions& options) {
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
      SparsifyExchangeStep sync(std::move(parts));
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
  } catch (const SkipScheme& skip) {
    run.skipped = skip.reason;  // the row reports why
  }
  return run;
}

// The reference points, once per run, on rank 0's first gradient (its first
// accumulated vector: error feedback starts at zero): the floor over all of
// it, std::nth_element and torch::topk on |a| for the same k.
Baselines measure_baselines(const GradientStream& stream, const SparsifierBenchOptions& options) {
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
  b.floor_ms = report::median(floor_ms);
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
  b.nth_element_ms = report::median(nth_ms);
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
  if (std::isnan(sink)) logger().info("the floor pass read NaN");
  return b;
}

std::size_t eviction_floats() {
  // 32 MiB where sysfs lists no cache: the clamp's floor decides then.
  const std::size_t cache = last_level_cache_bytes().value_or(std::size_t{32} << 20);
  const std::size_t bytes =
      std::clamp<std::size_t>(4 * cache, std::size_t{64} << 20, std::size_t{512} << 20);
  return bytes / sizeof(float);
}

}  // namespace sparsecomm::cli
