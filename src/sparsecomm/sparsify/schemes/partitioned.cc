#include "sparsecomm/sparsify/schemes/partitioned.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm {
namespace {

using Layout = PartitionedOptions::Layout;
using ControllerKind = PartitionedOptions::Controller;

class PartitionedSparsifier final : public Sparsifier {
 public:
  explicit PartitionedSparsifier(const PartitionedOptions& options)
      : options_(options), step_threshold_(options.exact) {
    if (options.controller == ControllerKind::kHistogram) {
      controller_ = make_histogram_controller(options.histogram);
    } else if (options.controller == ControllerKind::kTable) {
      controller_ = make_table_controller(options.table);
    }
  }

  std::string_view name() const override { return options_.name; }
  std::size_t target(std::size_t numel, const StepContext&) const override {
    return target_count(options_.density, numel);
  }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator& comm,
              SparseSelection& out) override {
    prepare(accumulated.size(), comm.size());
    const std::size_t k = target(accumulated.size(), ctx);
    const int partition = owned_partition(ctx.step, comm.rank(), comm.size());
    own_ranges(partition, last_read_);
    stats_ = {};
    if (controller_ == nullptr) {
      select_same_step(accumulated, k, partition, comm, out);
    } else {
      select_predicted(accumulated, ctx, k, comm, out);
    }
  }

  void observe(const ExchangeOutcome& outcome, const StepContext& ctx) override {
    if (controller_ != nullptr) controller_->observe(outcome.union_size, outcome.target);
    if (options_.layout != Layout::kSweep) return;
    // Partition ((t + i) mod n) was rank i's this step.
    const int n = layout_.parts();
    std::vector<std::int64_t> loads(static_cast<std::size_t>(n), 0);
    for (int i = 0; i < n && i < static_cast<int>(outcome.counts.size()); ++i) {
      loads[static_cast<std::size_t>(owned_partition(ctx.step, i, n))] =
          static_cast<std::int64_t>(outcome.counts[static_cast<std::size_t>(i)]);
    }
    faithful_sweep(layout_, loads, static_cast<std::int64_t>(outcome.union_size), grid_,
                   options_.sweep);
  }

  void save(StateWriter& writer) const override {
    writer.tag("partitioned");
    writer.string(options_.name);
    writer.value<std::uint64_t>(numel_);
    writer.value<std::int32_t>(world_);
    writer.array(std::span<const int>(assigned_blocks() ? assignment_.part_of : layout_.first));
    writer.array(std::span<const double>(block_average_));
    if (controller_ != nullptr) {
      controller_->save(writer);
    } else {
      step_threshold_.save(writer);
    }
  }
  void load(StateReader& reader) override {
    reader.expect_tag("partitioned");
    const std::string saved_name = reader.string();
    if (saved_name != options_.name) {
      throw Error(
          fmt::format("[{}] saved state belongs to scheme '{}'", options_.name, saved_name));
    }
    const auto numel = reader.value<std::uint64_t>();
    const auto world = reader.value<std::int32_t>();
    std::vector<int> layout = reader.array<int>();
    block_average_ = reader.array<double>();
    if (controller_ != nullptr) {
      controller_->load(reader);
    } else {
      step_threshold_.load(reader);
    }
    // Forget the current geometry, then rebuild it for the saved one (a state
    // saved before the first step has none: the next select() builds it).
    numel_ = 0;
    world_ = 0;
    equal_.clear();
    if (numel != 0) prepare(static_cast<std::size_t>(numel), world, &layout);
  }

 private:
  // MiCRO, ExDyna: this step's threshold from this step's candidates.
  void select_same_step(std::span<const float> accumulated, std::size_t k, int partition,
                        Communicator& comm, SparseSelection& out) {
    // Per-rank quotas: partition p's share of k, the remainder going to the
    // lowest partitions (which rotate over the ranks): they sum to k.
    if (options_.exact.per_rank) {
      const auto n = static_cast<std::size_t>(comm.size());
      const auto p = static_cast<std::size_t>(partition);
      k = k / n + (p < k % n ? 1 : 0);
    }
    if (!step_threshold_.started()) step_threshold_.start(accumulated, last_read_, k, comm);
    collect(accumulated, step_threshold_.candidate_floor(), out);
    // The per-block candidate counts travel with the first histogram round:
    // the balancer's view of where this step's load lies.
    const std::size_t blocks = balancing_blocks();
    shared_.assign(blocks, 0);
    if (blocks > 0) count_per_block(out, shared_);
    step_threshold_.choose(out, k, shared_, comm, [&](float floor, SparseSelection& candidates) {
      collect(accumulated, floor, candidates);
    });
    if (blocks > 0) rebalance(shared_);
    const StepThresholdStats& s = step_threshold_.stats();
    stats_.collective_rounds = s.rounds;
    stats_.candidate_passes = s.candidate_passes;
    stats_.collective_s = s.collective_s;
  }

  // The previous-step controllers (histogram, table): select with the
  // threshold the last steps predicted, then share the counts that steer
  // the next one.
  void select_predicted(std::span<const float> accumulated, const StepContext& ctx, std::size_t k,
                        Communicator& comm, SparseSelection& out) {
    if (!controller_->started()) {
      initial_.assign(controller_->initial_counts(), 0);
      for (const Range& r : last_read_) {
        controller_->contribute_initial(accumulated.subspan(r.begin, r.size()), initial_);
      }
      if (!initial_.empty()) allreduce(comm, std::span<std::int64_t>(initial_));
      controller_->start(initial_, k);
    }
    // One pass collects every candidate >= the floor into `out`; the
    // controller bins them and compacts the (few) candidates >= the
    // threshold in place: they are the selection.
    collect(accumulated, controller_->candidate_floor(), out);
    const std::size_t controller_counts = controller_->step_counts();
    const std::size_t blocks = balancing_blocks();
    shared_.assign(controller_counts + blocks, 0);
    controller_->contribute_and_select(out,
                                       std::span<std::int64_t>(shared_.data(), controller_counts));
    if (options_.padding && out.empty()) {
      const std::size_t size = read_size();
      if (size > 0) {
        // The reference's one index, at position t mod size of the partition.
        std::size_t at = static_cast<std::size_t>(ctx.step) % size;
        for (const Range& r : last_read_) {
          if (at < r.size()) {
            out.indices.push_back(static_cast<Index>(r.begin + at));
            out.values.push_back(accumulated[r.begin + at]);
            break;
          }
          at -= r.size();
        }
      }
    }
    const auto block_counts = std::span<std::int64_t>(shared_).subspan(controller_counts);
    if (blocks > 0) count_per_block(out, block_counts);
    if (shared_.empty()) return;
    const Stopwatch exchange;
    allreduce(comm, std::span<std::int64_t>(shared_));
    stats_.collective_s = exchange.seconds();
    stats_.collective_rounds = 1;
    stats_.candidate_passes = 1;
    controller_->update(std::span<const std::int64_t>(shared_.data(), controller_counts), k);
    if (blocks > 0) rebalance(block_counts);
  }

  // out = every element of the own partition with |a| >= floor, ascending.
  void collect(std::span<const float> accumulated, float floor, SparseSelection& out) const {
    out.clear();
    for (const Range& r : last_read_) {
      threshold_select(accumulated.subspan(r.begin, r.size()), floor, static_cast<Index>(r.begin),
                       out);
    }
  }

  void prepare(std::size_t numel, int world, const std::vector<int>* saved_layout = nullptr) {
    if (numel == numel_ && world == world_) return;
    if (world_ != 0 && saved_layout == nullptr) {
      throw InvalidArgument(fmt::format(
          "[{}] the vector size or world changed ({} elements on {} ranks, was {} on {}): a "
          "sparsifier serves one model on one world",
          options_.name, numel, world, numel_, world_));
    }
    if (numel > std::numeric_limits<Index>::max()) {
      throw InvalidArgument(
          fmt::format("[{}] {} elements exceed the index range", options_.name, numel));
    }
    numel_ = numel;
    world_ = world;
    if (options_.layout == Layout::kEqual) {
      equal_ = equal_partitions(numel, world);
      return;
    }
    // Scattered partitions need many blocks per rank, so that no single hot
    // block outweighs a rank's share; the contiguous layouts keep B.
    const bool scattered = assigned_blocks();
    const int blocks =
        scattered ? std::max(options_.blocks, options_.blocks_per_rank * world) : options_.blocks;
    grid_ = make_block_grid(numel, blocks, static_cast<std::size_t>(options_.alignment),
                            options_.spread_remainder);
    if (scattered) {
      assignment_ = cyclic_assignment(grid_.blocks, world);
      if (saved_layout != nullptr && saved_layout->size() == assignment_.part_of.size()) {
        for (auto& list : assignment_.blocks) list.clear();
        for (int b = 0; b < grid_.blocks; ++b) {
          const int p = (*saved_layout)[static_cast<std::size_t>(b)];
          if (p < 0 || p >= world) {
            throw Error(
                fmt::format("[{}] saved layout names partition {} of {}", options_.name, p, world));
          }
          assignment_.part_of[static_cast<std::size_t>(b)] = p;
          assignment_.blocks[static_cast<std::size_t>(p)].push_back(b);
        }
      }
    } else {
      layout_ = initial_layout(grid_.blocks, world);
      if (saved_layout != nullptr && static_cast<int>(saved_layout->size()) == world + 1 &&
          saved_layout->back() == grid_.blocks) {
        layout_.first = *saved_layout;
      }
    }
    if (options_.sweep.min_blocks <= 0)
      options_.sweep.min_blocks = std::max(1, grid_.blocks / (4 * world));
    // The counts balancer needs no large minimum: it balances the selected
    // load exactly; a floor of B/(4n) (the sweep's) would keep partitions
    // from narrowing onto a hot region.
    if (options_.balance.min_blocks <= 0) options_.balance.min_blocks = 1;
  }

  // Partitions are sets of blocks anywhere in the vector (assignment_), not
  // contiguous runs (equal_, layout_).
  bool assigned_blocks() const {
    return options_.layout == Layout::kScattered || options_.layout == Layout::kCyclic;
  }

  // The non-empty ranges of partition p, ascending (adjacent blocks merged).
  void own_ranges(int p, std::vector<Range>& out) const {
    out.clear();
    if (assigned_blocks()) {
      assignment_.ranges(grid_, p, out);
      return;
    }
    const Range range = options_.layout == Layout::kEqual ? equal_[static_cast<std::size_t>(p)]
                                                          : layout_.range(grid_, p);
    if (!range.empty()) out.push_back(range);
  }
  std::size_t read_size() const {
    std::size_t size = 0;
    for (const Range& r : last_read_) size += r.size();
    return size;
  }

  // Blocks whose counts the balancer shares each step (0: no balancer that
  // needs them).
  std::size_t balancing_blocks() const {
    return options_.layout == Layout::kBalanced || options_.layout == Layout::kScattered
               ? static_cast<std::size_t>(grid_.blocks)
               : 0;
  }
  // counts[b] = the elements of `selection` in block b.
  void count_per_block(const SparseSelection& selection, std::span<std::int64_t> counts) const {
    for (std::size_t i = 0; i < selection.size(); ++i) {
      ++counts[static_cast<std::size_t>(grid_.block_of(selection.indices[i]))];
    }
  }

  // The summed per-block counts of this step update their running average
  // (as shares of the step's total, so a step with more candidates does not
  // weigh more), from which the balancer lays out the next step's
  // partitions.
  void rebalance(std::span<const std::int64_t> block_counts) {
    // A block selected heavily this step has its residual reset, so the last
    // step alone over-states where the next selections fall: average.
    const std::size_t blocks = block_counts.size();
    double total = 0.0;
    for (const std::int64_t c : block_counts) total += static_cast<double>(c);
    if (!(total > 0)) return;
    const bool first = block_average_.size() != blocks;
    block_average_.resize(blocks, 0.0);
    const double weight = first ? 1.0 : options_.balance_smoothing;
    for (std::size_t b = 0; b < blocks; ++b) {
      const double share = static_cast<double>(block_counts[b]) / total;
      block_average_[b] += weight * (share - block_average_[b]);
    }
    if (options_.layout == Layout::kScattered) {
      assign_blocks_greedy(block_average_, world_, assignment_);
    } else {
      balance_from_block_counts(layout_, block_average_, options_.balance);
    }
  }

  PartitionedOptions options_;
  std::unique_ptr<DensityController> controller_;  // null: the same-step threshold
  StepThreshold step_threshold_;
  std::size_t numel_ = 0;
  int world_ = 0;
  std::vector<Range> equal_;
  BlockGrid grid_;
  BlockLayout layout_;          // contiguous layouts (counts, sweep)
  BlockAssignment assignment_;  // scattered layout
  std::vector<std::int64_t> initial_;
  std::vector<std::int64_t> shared_;
  std::vector<double> block_average_;
};

}  // namespace

std::unique_ptr<Sparsifier> make_partitioned_sparsifier(const PartitionedOptions& options) {
  return std::make_unique<PartitionedSparsifier>(options);
}

std::vector<OptionSpec> partitioned_option_specs(std::string_view scheme) {
  const bool faithful = scheme == "exdyna-faithful";
  const bool exdyna = scheme != "micro";
  std::vector<OptionSpec> specs = {
      {"controller", faithful ? "table" : "exact",
       "density controller: exact (one threshold from all-reduced histograms of this step's "
       "candidates; K within a bin of k every step), quota (each rank selects exactly its "
       "share k/n of its partition from its own histogram: K = k and balanced, no collective), "
       "histogram (predicted from earlier steps; on target on average) or table (the "
       "reference's, undershoots)"},
      {"cap", exdyna && !faithful ? "1.05" : "0",
       "exact: no rank selects more than cap x k/n; the threshold is where the capped counts "
       "reach k (0: no cap)"},
      {"tolerance", "0.01",
       "quota, exact: refine the histogram while K would miss k by more than this x k"},
      {"max_rounds", "6", "quota, exact: histogram rounds per candidate pass"},
      {"margin", "2", "quota, exact: the next floor passes margin x k of this step's candidates"},
      {"gain", "0.1", "histogram controller: integral gain on log(K/k) / slope"},
      {"smoothing", "0.3", "histogram controller: weight of the newest ideal threshold"},
      {"trend_smoothing", "0.1", "histogram controller: weight of the newest change in its trend"},
      {"settle_steps", "20",
       "histogram controller: first steps that follow the ideal threshold directly"},
      {"mantissa_bits", "7", "exact and histogram: bins per binade = 2^mantissa_bits"},
      {"floor_factor", "0.7", "histogram controller: initial candidate floor / threshold"},
      {"candidates_low", "1.2",
       "histogram controller, after settling: lowest candidates / k before the floor drops"},
      {"candidates_high", "2",
       "histogram controller, after settling: highest candidates / k before the floor rises"},
      {"initial_threshold", "0", "table controller: first threshold (0: 1/(2*sqrt(k)))"},
      {"up_fast", "1.005", "table: factor when K/k > high"},
      {"up_slow", "1.00125", "table: factor when low < K/k <= high"},
      {"down", "0.995", "table: factor otherwise"},
      {"high", "1.1", "table: upper band edge"},
      {"low", "0.909", "table: lower band edge"},
      {"padding", "false", "reference: send one index when a rank selects nothing"},
  };
  if (exdyna) {
    specs.push_back({"balancer", faithful ? "sweep" : "cyclic",
                     "cyclic (partition p holds the blocks b with b mod n == p: every partition "
                     "samples the whole vector), scattered (blocks dealt greedily by predicted "
                     "load, ceil(B/n) each at most), counts (contiguous partitions from "
                     "all-reduced per-block counts) or sweep (reference)"});
    specs.push_back({"blocks", "1024", "block count B"});
    specs.push_back(
        {"blocks_per_rank", "64", "cyclic, scattered: at least this many blocks per rank"});
    specs.push_back({"alignment", "32", "block size multiple"});
    specs.push_back({"spread_remainder", faithful ? "false" : "true",
                     "spread d - S*B over the blocks in alignment units (false: the reference "
                     "puts it all in the last block)"});
    specs.push_back({"band", "1.05", "sweep: balance band factor"});
    specs.push_back(
        {"min_blocks", "0",
         "minimum blocks per partition (0: max(1, B/(4n)) for the sweep, 1 for counts)"});
    specs.push_back(
        {"max_move", "0", "counts balancer: max blocks a boundary moves per step (0: any)"});
    specs.push_back({"balance_smoothing", "0.1",
                     "counts and scattered balancers: weight of the newest block counts"});
  }
  return specs;
}

PartitionedOptions partitioned_options_from(std::string_view scheme, const SchemeOptions& o) {
  PartitionedOptions p;
  p.name = std::string(scheme);
  p.density = o.number(scheme, "density", 0.01, 0.0, 1.0, /*min_exclusive=*/true);
  const bool faithful = scheme == "exdyna-faithful";
  const bool micro = scheme == "micro";
  const std::string controller = o.choice(scheme, "controller", faithful ? "table" : "exact",
                                          {"exact", "quota", "histogram", "table"});
  p.controller = controller == "table"       ? ControllerKind::kTable
                 : controller == "histogram" ? ControllerKind::kHistogram
                                             : ControllerKind::kExact;
  p.exact.per_rank = controller == "quota";
  p.exact.cap = o.number(scheme, "cap", micro || faithful ? 0.0 : 1.05, 0.0, 1000.0);
  if (p.exact.cap != 0 && p.exact.cap < 1) {
    throw InvalidArgument(fmt::format(
        "[{}] option cap={} must be 0 (no cap) or >= 1 (a multiple of k/n)", scheme, p.exact.cap));
  }
  p.exact.tolerance = o.number(scheme, "tolerance", 0.01, 0.0, 1.0);
  p.exact.max_rounds = static_cast<int>(o.integer(scheme, "max_rounds", 6, 1, 64));
  p.exact.margin = o.number(scheme, "margin", 2.0, 1.0, 1000.0);
  p.exact.max_margin = std::max(p.exact.max_margin, p.exact.margin);
  p.histogram.gain = o.number(scheme, "gain", 0.1, 0.0, 1.0);
  p.histogram.smoothing = o.number(scheme, "smoothing", 0.3, 0.0, 1.0, true);
  p.histogram.trend_smoothing = o.number(scheme, "trend_smoothing", 0.1, 0.0, 1.0);
  p.histogram.settle_steps = o.integer(scheme, "settle_steps", 20, 0, 1000000);
  p.histogram.mantissa_bits = static_cast<int>(o.integer(scheme, "mantissa_bits", 7, 0, 10));
  p.exact.mantissa_bits = p.histogram.mantissa_bits;
  p.histogram.floor_factor = o.number(scheme, "floor_factor", 0.7, 0.0, 1.0, true);
  p.histogram.settled_candidates_low = o.number(scheme, "candidates_low", 1.2, 1.0, 1000.0);
  p.histogram.settled_candidates_high = o.number(scheme, "candidates_high", 2.0, 1.0, 1000.0);
  if (!(p.histogram.settled_candidates_high > p.histogram.settled_candidates_low)) {
    throw InvalidArgument(
        fmt::format("[{}] option candidates_high={} must exceed candidates_low={}", scheme,
                    p.histogram.settled_candidates_high, p.histogram.settled_candidates_low));
  }
  p.table.initial = o.number(scheme, "initial_threshold", 0.0, 0.0, 1e30);
  p.table.up_fast = o.number(scheme, "up_fast", 1.005, 0.0, 10.0, true);
  p.table.up_slow = o.number(scheme, "up_slow", 1.00125, 0.0, 10.0, true);
  p.table.down = o.number(scheme, "down", 0.995, 0.0, 10.0, true);
  p.table.high = o.number(scheme, "high", 1.1, 0.0, 100.0);
  p.table.low = o.number(scheme, "low", 0.909, 0.0, 100.0);
  p.padding = o.flag(scheme, "padding", false);
  if (scheme == "micro") {
    p.layout = Layout::kEqual;
    return p;
  }
  const std::string balancer = o.choice(scheme, "balancer", faithful ? "sweep" : "cyclic",
                                        {"cyclic", "scattered", "counts", "sweep"});
  p.layout = balancer == "sweep"    ? Layout::kSweep
             : balancer == "counts" ? Layout::kBalanced
             : balancer == "cyclic" ? Layout::kCyclic
                                    : Layout::kScattered;
  p.blocks = static_cast<int>(o.integer(scheme, "blocks", 1024, 1, 1 << 24));
  p.blocks_per_rank = static_cast<int>(o.integer(scheme, "blocks_per_rank", 64, 1, 1 << 16));
  p.alignment = static_cast<int>(o.integer(scheme, "alignment", 32, 1, 1 << 20));
  p.spread_remainder = o.flag(scheme, "spread_remainder", !faithful);
  p.sweep.band = o.number(scheme, "band", 1.05, 1.0, 10.0);
  const auto min_blocks = static_cast<int>(o.integer(scheme, "min_blocks", 0, 0, 1 << 24));
  p.sweep.min_blocks = min_blocks;
  p.balance.min_blocks = min_blocks;
  p.balance.max_move = static_cast<int>(o.integer(scheme, "max_move", 0, 0, 1 << 24));
  p.balance_smoothing = o.number(scheme, "balance_smoothing", 0.1, 0.0, 1.0, true);
  return p;
}

namespace schemes {
namespace {

template <const char* kName>
void build_partitioned(const SchemeOptions& options, const CommonOptions&, SchemeParts& parts) {
  parts.sparsifier = make_partitioned_sparsifier(partitioned_options_from(kName, options));
}

constexpr char kMicro[] = "micro";
constexpr char kExDyna[] = "exdyna";
constexpr char kExDynaFaithful[] = "exdyna-faithful";

// `bench sparsifiers -d 1000000 -c C -n N --steps 60 --warmup-steps 20
// --schemes exdyna-faithful` for C in 0.01, 0.001 and N in 2..64: K/k 74
// and 570-580 at every N, so no built-in statistic stands for it.
constexpr std::string_view kFaithfulUnpriced =
    "its threshold table starts from 1/(2 sqrt(k)), blind to the gradient's scale, so K/k "
    "depends on the run (74 and 580 on the synthetic stream after 60 steps)";

// MiCRO's partitions are ranges; ExDyna's are blocks (the faithful one's
// sweep: contiguous runs of blocks, so ranges too), spanning the model.
// ExDyna's exact controller caps each rank by default (option cap).
template <const char* kName>
SchemeDefinition partitioned_definition(std::string summary) {
  return {.name = kName,
          .summary = std::move(summary),
          .traits = {.selection = SchemeTraits::Selection::kPartitioned,
                     .spans_the_model = true,
                     .capped_threshold = std::string_view(kName) == kExDyna,
                     .ranged_partitions = std::string_view(kName) != kExDyna,
                     .unpriced_because = std::string_view(kName) == kExDynaFaithful
                                             ? kFaithfulUnpriced
                                             : std::string_view()},
          .options = partitioned_option_specs(kName),
          .build = build_partitioned<kName>};
}

}  // namespace

SchemeDefinition micro_definition() {
  return partitioned_definition<kMicro>(
      "threshold selection in n equal exclusive partitions rotating every step; this step's "
      "threshold from all-reduced histograms (K within a bin of k every step)");
}
SchemeDefinition exdyna_definition() {
  return partitioned_definition<kExDyna>(
      "MiCRO on block-cyclic partitions rotating every step; this step's threshold from "
      "all-reduced histograms, no rank above 1.05 k/n (K within a bin of k, balanced)");
}
SchemeDefinition exdyna_faithful_definition() {
  return partitioned_definition<kExDynaFaithful>(
      "ExDyna as the reference: one-block sweep and threshold table (undershoots the density)");
}

}  // namespace schemes
}  // namespace sparsecomm
