#include "sparsecomm/sparsify/schemes/partitioned.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm {
namespace {

using Layout = PartitionedOptions::Layout;
using ControllerKind = PartitionedOptions::Controller;

class PartitionedSparsifier final : public Sparsifier {
 public:
  explicit PartitionedSparsifier(const PartitionedOptions& options) : options_(options) {
    if (options.controller == ControllerKind::kHistogram) {
      controller_ = make_histogram_controller(options.histogram);
    } else {
      controller_ = make_table_controller(options.table);
    }
  }

  std::string_view name() const override { return options_.name; }
  ExchangePattern default_exchange() const override { return ExchangePattern::kUnionAllreduce; }
  std::size_t target(std::size_t numel, const StepContext&) const override {
    return target_count(options_.density, numel);
  }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator& comm,
              SparseSelection& out) override {
    prepare(accumulated.size(), comm.size());
    const std::size_t k = target(accumulated.size(), ctx);
    const Range range = partition(owned_partition(ctx.step, comm.rank(), comm.size()));
    const auto own = accumulated.subspan(range.begin, range.size());
    read_only(range);
    if (!controller_->started()) start_controller(own, k, comm);

    // One pass over the own partition collects every candidate >= the floor
    // into `out`; the controller bins them and compacts the (few) candidates
    // >= the threshold in place: they are the selection.
    out.clear();
    threshold_select(own, controller_->candidate_floor(), static_cast<Index>(range.begin), out);
    const std::size_t controller_counts = controller_->step_counts();
    const std::size_t block_counts =
        options_.layout == Layout::kBalanced ? static_cast<std::size_t>(grid_.blocks) : 0;
    shared_.assign(controller_counts + block_counts, 0);
    controller_->contribute_and_select(out,
                                       std::span<std::int64_t>(shared_.data(), controller_counts));
    if (options_.padding && out.empty() && !range.empty()) {
      const std::size_t i = range.begin + static_cast<std::size_t>(ctx.step) % range.size();
      out.indices.push_back(static_cast<Index>(i));
      out.values.push_back(accumulated[i]);
    }
    if (block_counts > 0) {
      count_per_block(owned_partition(ctx.step, comm.rank(), comm.size()), out,
                      std::span<std::int64_t>(shared_.data() + controller_counts, block_counts));
    }
    share_counts(controller_counts, block_counts, k, comm);
  }

  void observe(const ExchangeOutcome& outcome, const StepContext& ctx) override {
    controller_->observe(outcome.union_size, outcome.target);
    if (options_.layout != Layout::kSweep) return;
    // Partition ((t + i) mod n) was rank i's this step.
    const int n = layout_.parts();
    std::vector<std::int64_t> loads(static_cast<std::size_t>(n), 0);
    for (int i = 0; i < n && i < static_cast<int>(outcome.counts.size()); ++i) {
      loads[static_cast<std::size_t>(owned_partition(ctx.step, i, n))] =
          static_cast<std::int64_t>(outcome.counts[static_cast<std::size_t>(i)]);
    }
    SweepOptions sweep = options_.sweep;
    faithful_sweep(layout_, loads, static_cast<std::int64_t>(outcome.union_size), grid_, sweep);
  }

  void save(StateWriter& writer) const override {
    writer.tag("partitioned");
    writer.string(options_.name);
    writer.value<std::uint64_t>(numel_);
    writer.value<std::int32_t>(world_);
    writer.array(std::span<const int>(layout_.first));
    writer.array(std::span<const double>(block_average_));
    controller_->save(writer);
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
    layout_.first = reader.array<int>();
    block_average_ = reader.array<double>();
    controller_->load(reader);
    // Forget the current geometry, then rebuild it for the saved one (a state
    // saved before the first step has none: the next select() builds it).
    numel_ = 0;
    world_ = 0;
    equal_.clear();
    if (numel != 0) prepare(static_cast<std::size_t>(numel), world, /*keep_layout=*/true);
  }

 private:
  void prepare(std::size_t numel, int world, bool keep_layout = false) {
    if (numel == numel_ && world == world_) return;
    if (world_ != 0 && !keep_layout) {
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
    grid_ = make_block_grid(numel, options_.blocks, static_cast<std::size_t>(options_.alignment),
                            options_.spread_remainder);
    if (!keep_layout || layout_.parts() != world || layout_.first.back() != grid_.blocks) {
      layout_ = initial_layout(grid_.blocks, world);
    }
    if (options_.sweep.min_blocks <= 0)
      options_.sweep.min_blocks = std::max(1, grid_.blocks / (4 * world));
    // The counts balancer needs no large minimum: it balances the selected
    // load exactly; a floor of B/(4n) (the sweep's) would keep partitions
    // from narrowing onto a hot region.
    if (options_.balance.min_blocks <= 0) options_.balance.min_blocks = 1;
  }

  Range partition(int p) const {
    return options_.layout == Layout::kEqual ? equal_[static_cast<std::size_t>(p)]
                                             : layout_.range(grid_, p);
  }

  void start_controller(std::span<const float> own, std::size_t k, Communicator& comm) {
    initial_.assign(controller_->initial_counts(), 0);
    controller_->contribute_initial(own, initial_);
    if (!initial_.empty()) allreduce(comm, std::span<std::int64_t>(initial_));
    controller_->start(initial_, k);
  }

  // Selected indices per block of partition p (the selection lies in it,
  // ascending): one binary search per block boundary, no division per index.
  void count_per_block(int p, const SparseSelection& out, std::span<std::int64_t> counts) const {
    const Index* at = out.indices.data();
    const Index* const end = at + out.size();
    const int first = layout_.first[static_cast<std::size_t>(p)];
    const int last = layout_.first[static_cast<std::size_t>(p) + 1];
    for (int b = first; b < last && at != end; ++b) {
      const Index* const next =
          b + 1 == last ? end : std::lower_bound(at, end, static_cast<Index>(grid_.block(b).end));
      counts[static_cast<std::size_t>(b)] = next - at;
      at = next;
    }
  }

  // One all-reduce of shared_ = [controller counts | per-block selected
  // counts], then the controller's update and (ExDyna) the new boundaries.
  void share_counts(std::size_t controller_counts, std::size_t block_counts, std::size_t k,
                    Communicator& comm) {
    if (controller_counts + block_counts == 0) return;
    allreduce(comm, std::span<std::int64_t>(shared_));
    controller_->update(std::span<const std::int64_t>(shared_.data(), controller_counts), k);
    if (block_counts > 0) {
      // A running average of the per-block counts: a block selected heavily
      // this step has its residual reset, so the last step alone over-states
      // where the next selections fall.
      const bool first = block_average_.size() != block_counts;
      block_average_.resize(block_counts, 0.0);
      const double weight = first ? 1.0 : options_.balance_smoothing;
      for (std::size_t b = 0; b < block_counts; ++b) {
        block_average_[b] +=
            weight * (static_cast<double>(shared_[controller_counts + b]) - block_average_[b]);
      }
      balance_from_block_counts(layout_, block_average_, options_.balance);
    }
  }

  PartitionedOptions options_;
  std::unique_ptr<DensityController> controller_;
  std::size_t numel_ = 0;
  int world_ = 0;
  std::vector<Range> equal_;
  BlockGrid grid_;
  BlockLayout layout_;
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
      {"controller", faithful ? "table" : "histogram",
       "density controller: histogram (on target) or table (the reference's, undershoots)"},
      {"gain", "0.1", "histogram controller: integral gain on log(K/k) / slope"},
      {"smoothing", "0.3", "histogram controller: weight of the newest ideal threshold"},
      {"trend_smoothing", "0.1", "histogram controller: weight of the newest change in its trend"},
      {"settle_steps", "20",
       "histogram controller: first steps that follow the ideal threshold directly"},
      {"mantissa_bits", "7", "histogram controller: bins per binade = 2^mantissa_bits"},
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
    specs.push_back({"balancer", faithful ? "sweep" : "counts",
                     "counts (boundaries from all-reduced per-block counts) or sweep (reference)"});
    specs.push_back({"blocks", "1024", "block count B"});
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
    specs.push_back(
        {"balance_smoothing", "0.1", "counts balancer: weight of the newest block counts"});
  }
  return specs;
}

PartitionedOptions partitioned_options_from(std::string_view scheme, const SchemeOptions& o) {
  PartitionedOptions p;
  p.name = std::string(scheme);
  p.density = o.number(scheme, "density", 0.01, 0.0, 1.0, /*min_exclusive=*/true);
  const bool faithful = scheme == "exdyna-faithful";
  const std::string controller =
      o.choice(scheme, "controller", faithful ? "table" : "histogram", {"histogram", "table"});
  p.controller = controller == "table" ? ControllerKind::kTable : ControllerKind::kHistogram;
  p.histogram.gain = o.number(scheme, "gain", 0.1, 0.0, 1.0);
  p.histogram.smoothing = o.number(scheme, "smoothing", 0.3, 0.0, 1.0, true);
  p.histogram.trend_smoothing = o.number(scheme, "trend_smoothing", 0.1, 0.0, 1.0);
  p.histogram.settle_steps = o.integer(scheme, "settle_steps", 20, 0, 1000000);
  p.histogram.mantissa_bits = static_cast<int>(o.integer(scheme, "mantissa_bits", 7, 0, 10));
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
  const std::string balancer =
      o.choice(scheme, "balancer", faithful ? "sweep" : "counts", {"counts", "sweep"});
  p.layout = balancer == "sweep" ? Layout::kSweep : Layout::kBalanced;
  p.blocks = static_cast<int>(o.integer(scheme, "blocks", 1024, 1, 1 << 24));
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

template <const char* kName>
SchemeDefinition partitioned_definition(std::string summary) {
  SchemeDefinition definition;
  definition.name = kName;
  definition.summary = std::move(summary);
  definition.default_exchange = ExchangePattern::kUnionAllreduce;
  definition.options = partitioned_option_specs(kName);
  definition.build = build_partitioned<kName>;
  return definition;
}

}  // namespace

SchemeDefinition micro_definition() {
  return partitioned_definition<kMicro>(
      "threshold selection in n equal exclusive partitions rotating every step; on-target density");
}
SchemeDefinition exdyna_definition() {
  return partitioned_definition<kExDyna>(
      "MiCRO on blocks with partitions rebalanced from all-reduced block counts; on-target "
      "density");
}
SchemeDefinition exdyna_faithful_definition() {
  return partitioned_definition<kExDynaFaithful>(
      "ExDyna as the reference: one-block sweep and threshold table (undershoots the density)");
}

}  // namespace schemes
}  // namespace sparsecomm
