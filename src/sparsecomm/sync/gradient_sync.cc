#include "sparsecomm/sync/gradient_sync.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/skip_reduce.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/timeline.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sync/demo.h"
#include "sparsecomm/sync/powersgd.h"
#include "sparsecomm/sync/sparsify_exchange_step.h"

namespace sparsecomm {
namespace {

std::vector<OptionSpec> dense_option_specs() {
  return {
      {"allreduce", "ring",
       "all-reduce algorithm: ring (ours, fixed reduction order) | native (MPI's)"},
      {"segment_kb", "1024", "ring segment size in KiB (two segments in flight)"},
      {"values", "fp32",
       "values on the ring's wire: fp32 | fp16 | bf16 (half the bytes; each hop's partial sum "
       "rounded to 16 bits, as PyTorch's fp16 hook; fp16 saturates at 65504)"},
  };
}

std::vector<OptionSpec> skipreduce_option_specs() {
  return {
      {"skip", "-1", "skip s in [0, n-1]: each chunk sums n-s contributions (-1: floor(n/2))"},
      {"min_elements", "100000", "protection: gradients with fewer elements are reduced in full"},
      {"rescale", "false", "multiply partial sums by n/(n-s) (not with memory=ef)"},
      {"memory", "none",
       "none: dropped contributions are lost | ef: each rank keeps its dropped chunks in its "
       "residual (delayed, not lost)"},
      {"seed", "0", "key of the rotation draws (identical on all ranks)"},
      {"segment_kb", "1024", "ring segment size in KiB"},
  };
}

// A non-finite average is identical on every rank (it went through the same
// all-reduce), so every rank decides the same without a message.
bool handle_nonfinite(std::span<float> average, NonFinitePolicy policy, std::string_view method,
                      std::int64_t step) {
  if (all_finite(average)) return false;
  if (policy == NonFinitePolicy::kStop) {
    throw NonFiniteGradient(fmt::format(
        "[{}] step {}: the all-reduced gradient holds NaN or inf (some rank's gradient was not "
        "finite); lower the learning rate, or pass --nonfinite skip to skip such steps",
        method, step));
  }
  std::fill(average.begin(), average.end(), 0.0f);
  return true;
}

void scale(std::span<float> values, float factor) {
  for (float& v : values) v *= factor;
}

// GradientSync "dense": all-reduce of the whole gradient, then / n.
class DenseSync final : public GradientSync {
 public:
  DenseSync(const SchemeOptions& options, NonFinitePolicy policy) : policy_(policy) {
    options.check_known("dense", dense_option_specs());
    allreduce_.algorithm =
        parse_allreduce_algorithm(options.choice("dense", "allreduce", "ring", {"ring", "native"}));
    allreduce_.segment_bytes =
        static_cast<std::size_t>(options.integer("dense", "segment_kb", 1024, 1, 1 << 20)) * 1024;
    allreduce_.wire =
        parse_value_encoding(options.choice("dense", "values", "fp32", {"fp32", "fp16", "bf16"}));
    if (allreduce_.wire != ValueEncoding::kFloat32 &&
        allreduce_.algorithm != AllreduceAlgorithm::kRing) {
      throw InvalidArgument(fmt::format(
          "[dense] values={} travels on our ring; allreduce=native sends fp32: drop one of them",
          value_encoding_name(allreduce_.wire)));
    }
  }
  std::string_view method() const override { return "dense"; }

  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override {
    StepMetrics m;
    m.step = ctx.step;
    m.numel = m.target = m.selected = m.union_size = gradient.size();
    m.density_ratio = gradient.empty() ? 0.0 : 1.0;
    AllreduceReport report;
    TimedSpan exchange("exchange", "exchange");
    allreduce(comm, gradient, allreduce_, &report);
    scale(gradient, 1.0f / static_cast<float>(comm.size()));
    m.exchange_s = exchange.stop();
    m.bytes_sent = report.bytes_sent;
    m.bytes_received = report.bytes_received;
    m.skipped_nonfinite = handle_nonfinite(gradient, policy_, method(), ctx.step);
    return m;
  }

  void save(StateWriter& writer) const override { writer.tag("dense"); }
  void load(StateReader& reader) override { reader.expect_tag("dense"); }

 private:
  AllreduceOptions allreduce_;
  NonFinitePolicy policy_;
};

// GradientSync "skipreduce": Skip-Reduce (index-free pruning inside the
// ring), optionally with error feedback of the dropped chunks.
class SkipReduceSync final : public GradientSync {
 public:
  SkipReduceSync(const SchemeOptions& options, NonFinitePolicy policy) : policy_(policy) {
    constexpr std::string_view kName = "skipreduce";
    options.check_known(kName, skipreduce_option_specs());
    skip_ = static_cast<int>(options.integer(kName, "skip", -1, -1, 1 << 20));
    base_.min_elements = static_cast<std::size_t>(options.integer(
        kName, "min_elements", 100000, 0, std::numeric_limits<std::int64_t>::max()));
    base_.rescale = options.flag(kName, "rescale", false);
    base_.seed = static_cast<std::uint64_t>(
        options.integer(kName, "seed", 0, 0, std::numeric_limits<std::int64_t>::max()));
    base_.segment_bytes =
        static_cast<std::size_t>(options.integer(kName, "segment_kb", 1024, 1, 1 << 20)) * 1024;
    error_feedback_ = options.choice(kName, "memory", "none", {"none", "ef"}) == "ef";
    if (error_feedback_ && base_.rescale) {
      throw InvalidArgument(
          "[skipreduce] rescale=true and memory=ef exclude each other: with error feedback the "
          "dropped part is delayed, not lost, so it must not be rescaled; drop one of them");
    }
  }
  std::string_view method() const override { return "skipreduce"; }

  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override {
    const int n = comm.size();
    SkipReduceOptions options = base_;
    options.skip = skip_ >= 0 ? skip_ : n / 2;
    if (options.skip > n - 1) {
      throw InvalidArgument(
          fmt::format("[skipreduce] skip={} needs more ranks: it must lie in [0, n-1] = [0, {}]",
                      options.skip, n - 1));
    }
    options.step = ctx.step;
    options.bucket = ctx.bucket;

    StepMetrics m;
    m.step = ctx.step;
    m.numel = m.target = m.union_size = gradient.size();
    m.density_ratio = gradient.empty() ? 0.0 : 1.0;
    Stopwatch watch;
    std::size_t dropped = 0;
    if (error_feedback_) {
      // A value that is not finite in a chunk this rank drops would enter the
      // residual unseen by the average: the ranks agree first, as the sparse
      // path does, and a skipped step leaves the residual as it was.
      const Stopwatch agreement;
      const bool finite = agree_all_finite(gradient, ctx, comm, policy_, finite_flags_);
      m.agreement_s = agreement.seconds();
      if (!finite) {
        std::fill(gradient.begin(), gradient.end(), 0.0f);
        m.selected = 0;
        m.exchange_s = m.agreement_s;
        m.skipped_nonfinite = true;
        m.residual_norm = std::sqrt(sum_of_squares(residual_));
        return m;
      }
      watch.restart();
      // a = g + e; the chunks that will drop this rank's contribution stay in
      // the residual, the rest is sent: decoded + residual = old residual + g.
      residual_.resize(gradient.size(), 0.0f);
      for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] += residual_[i];
      std::fill(residual_.begin(), residual_.end(), 0.0f);
      const SkipSchedule schedule = skip_reduce_schedule(n, gradient.size(), options);
      for (const SkipChunk& chunk : schedule.chunks) {
        if (!chunk.dropped(comm.rank(), n)) continue;
        std::copy(gradient.begin() + chunk.begin, gradient.begin() + chunk.end,
                  residual_.begin() + chunk.begin);
        dropped += chunk.end - chunk.begin;
      }
      m.residual_norm = std::sqrt(sum_of_squares(residual_));
    }
    m.accumulate_s = watch.seconds();
    Stopwatch exchange_watch;
    SkipReduceReport report;
    skip_reduce(comm, gradient, options, &report);
    scale(gradient, 1.0f / static_cast<float>(n));
    m.exchange_s = exchange_watch.seconds() + m.agreement_s;
    if (!error_feedback_) {
      for (const SkipChunk& chunk : report.schedule.chunks) {
        if (chunk.dropped(comm.rank(), n)) dropped += chunk.end - chunk.begin;
      }
    }
    m.selected = gradient.size() - dropped;
    m.skip_subject = report.elements_subject_to_skipping;
    m.bytes_sent = report.phases.bytes_sent;
    m.bytes_received = report.phases.bytes_received;
    m.skipped_nonfinite = handle_nonfinite(gradient, policy_, method(), ctx.step);
    return m;
  }

  std::span<const float> kept() const override { return residual_; }

  void save(StateWriter& writer) const override {
    writer.tag("skipreduce");
    writer.array<float>(residual_);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("skipreduce");
    residual_ = reader.array<float>();
  }

 private:
  SkipReduceOptions base_;
  int skip_ = -1;
  bool error_feedback_ = false;
  NonFinitePolicy policy_;
  std::vector<float> residual_;
  std::vector<std::uint8_t> finite_flags_;  // every rank's, with error feedback
};

}  // namespace

const std::vector<SyncMethodInfo>& sync_methods() {
  static const std::vector<SyncMethodInfo> methods = [] {
    std::vector<SyncMethodInfo> out;
    out.push_back({.name = "dense",
                   .summary = "all-reduce of the whole gradient",
                   .options = dense_option_specs(),
                   .device_path = true});
    out.push_back({.name = "skipreduce",
                   .summary = "Skip-Reduce: index-free pruning inside the ring all-reduce",
                   .options = skipreduce_option_specs()});
    out.push_back({.name = "powersgd",
                   .summary = "PowerSGD: each matrix as a rank-r product P Q^T, two all-reduces, "
                              "error feedback, warm start; vectors and small tensors averaged "
                              "whole",
                   .options = powersgd_option_specs()});
    out.push_back({.name = "demo",
                   .summary = "DeMo: each rank's own momentum, the topk largest DCT coefficients "
                              "of every chunk sent (allgather), the sign of their mean applied; "
                              "SGD without momentum",
                   .options = demo_option_specs()});
    for (const SchemeInfo& scheme : scheme_registry()) {
      const std::span<const std::string_view> device = scheme.traits.device_options;
      out.push_back({.name = scheme.name,
                     .summary = scheme.summary,
                     .options = scheme.options,
                     .has_density = !scheme.traits.every_coordinate,
                     .device_path = !device.empty(),
                     .device_options = {device.begin(), device.end()}});
    }
    return out;
  }();
  return methods;
}

bool SyncMethodInfo::device_takes(std::string_view option, std::string_view value) const {
  for (const std::string& taken : device_options) {
    if (taken == option) return true;
    const std::size_t equals = taken.find('=');
    if (equals != std::string::npos && std::string_view(taken).substr(0, equals) == option &&
        std::string_view(taken).substr(equals + 1) == value) {
      return true;
    }
  }
  return false;
}

std::string sync_method_names() {
  std::string out;
  for (const SyncMethodInfo& info : sync_methods()) {
    if (!out.empty()) out += ", ";
    out += info.name;
  }
  return out;
}

const SyncMethodInfo* find_sync_method(std::string_view name) {
  for (const SyncMethodInfo& info : sync_methods()) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

const SyncMethodInfo& sync_method(std::string_view name) {
  if (const SyncMethodInfo* info = find_sync_method(name)) return *info;
  throw InvalidArgument(
      fmt::format("unknown synchronization method '{}'; valid: {}", name, sync_method_names()));
}

std::map<std::string, std::string> round_options(std::string_view method,
                                                 std::map<std::string, std::string> options) {
  const SyncMethodInfo& info = sync_method(method);
  const bool takes_clip = std::any_of(info.options.begin(), info.options.end(),
                                      [](const OptionSpec& s) { return s.name == "clip_ratio"; });
  if (takes_clip && !options.count("clip_ratio")) options["clip_ratio"] = "0";
  return options;
}

std::unique_ptr<GradientSync> make_gradient_sync(std::string_view method,
                                                 const SchemeOptions& options,
                                                 NonFinitePolicy nonfinite) {
  sync_method(method);  // unknown names: InvalidArgument
  if (method == "dense") return std::make_unique<DenseSync>(options, nonfinite);
  if (method == "skipreduce") return std::make_unique<SkipReduceSync>(options, nonfinite);
  if (method == "powersgd") return make_powersgd(options, nonfinite);
  if (method == "demo") return make_demo(options, nonfinite);
  return std::make_unique<SparsifyExchangeStep>(make_scheme(method, options), nonfinite);
}

}  // namespace sparsecomm
