#include "sparsecomm/sync/dense_layers.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

bool DenseLayerRule::matches(const LayerSpan& layer) const {
  if (layer.size < min_numel) return true;
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& pattern) {
    return fnmatch(pattern.c_str(), layer.name.c_str(), 0) == 0;
  });
}

std::size_t dense_numel(const DenseLayerRule& rule, std::span<const LayerSpan> layers,
                        std::string_view model, const DenseRuleWords& words) {
  if (rule.empty()) return 0;
  for (const std::string& pattern : rule.patterns) {
    DenseLayerRule one;
    one.patterns = {pattern};
    if (std::none_of(layers.begin(), layers.end(),
                     [&](const LayerSpan& layer) { return one.matches(layer); })) {
      std::vector<std::string> names;
      for (const LayerSpan& layer : layers) {
        names.push_back(fmt::format("{} ({})", layer.name, layer.size));
      }
      throw InvalidArgument(
          fmt::format("{} '{}' matches no tensor of the {} model; its tensors (elements) are: {}",
                      words.exclude, pattern, model, fmt::join(names, ", ")));
    }
  }
  std::size_t dense = 0;
  std::size_t total = 0;
  for (const LayerSpan& layer : layers) {
    total += layer.size;
    if (rule.matches(layer)) dense += layer.size;
  }
  if (dense == total) {
    throw InvalidArgument(fmt::format(
        "{} no tensor of the {} model to sparsify: every tensor would be averaged densely; {}, "
        "{}",
        rule.patterns.empty() ? fmt::format("{} {} leaves", words.min_numel, rule.min_numel)
                              : fmt::format("{} and {} leave", words.min_numel, words.exclude),
        model,
        rule.patterns.empty() ? fmt::format("lower {}", words.min_numel) : "exclude fewer tensors",
        words.all_dense));
  }
  return dense;
}

namespace {

// The decorator. Per step: the dense tensors are gathered and ring
// all-reduced first (so a non-finite value there skips or stops the whole
// step on every rank alike), then the method runs on the other tensors,
// packed, or in place when they are one contiguous run.
class DenseLayersSync final : public GradientSyncDecorator {
 public:
  DenseLayersSync(std::unique_ptr<GradientSync> inner, DenseLayerRule rule,
                  NonFinitePolicy nonfinite)
      : GradientSyncDecorator(std::move(inner)),
        dense_(make_gradient_sync("dense", SchemeOptions{}, nonfinite)),
        rule_(std::move(rule)) {}

  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override {
    plan(gradient.size(), ctx.layers);

    gather_runs(gradient, dense_runs_, dense_values_);
    StepMetrics dense;
    if (!dense_values_.empty()) dense = dense_->synchronize(dense_values_, ctx, comm);
    if (dense.skipped_nonfinite) {  // the same average, so the same decision, on every rank
      std::fill(gradient.begin(), gradient.end(), 0.0f);
      StepMetrics m = dense;
      m.numel = gradient.size();
      m.target = m.selected = m.union_size = 0;
      m.density_ratio = 0.0;
      m.dense_numel = dense.numel;
      return m;
    }

    StepMetrics m;
    if (sparse_layers_.empty()) {  // a pipelined bucket of dense tensors only
      m.step = ctx.step;
    } else {
      const bool in_place = sparse_runs_.size() == 1;
      std::span<float> part = in_place
                                  ? gradient.subspan(sparse_runs_[0].begin, sparse_runs_[0].size())
                                  : std::span<float>(packed_);
      if (!in_place) gather_runs(gradient, sparse_runs_, packed_);
      StepContext inner_ctx = ctx;
      inner_ctx.layers = sparse_layers_;
      m = inner_->synchronize(part, inner_ctx, comm);
      if (!in_place) scatter_runs(packed_, sparse_runs_, gradient);
    }

    if (m.skipped_nonfinite) {
      std::fill(gradient.begin(), gradient.end(), 0.0f);
    } else {
      scatter_runs(dense_values_, dense_runs_, gradient);
    }
    m.numel += dense.numel;
    m.dense_numel = dense.numel;
    m.exchange_s += dense.exchange_s;
    m.bytes_sent += dense.bytes_sent;
    m.bytes_received += dense.bytes_received;
    return m;
  }

  std::span<const float> kept() const override {
    const std::span<const float> inner = inner_->kept();
    if (inner.empty()) return {};
    kept_.assign(numel_, 0.0f);
    scatter_runs(inner, sparse_runs_, kept_);
    return kept_;
  }

  void save(StateWriter& writer) const override {
    writer.tag("dense_layers");
    writer.value<std::uint64_t>(numel_);
    inner_->save(writer);
    dense_->save(writer);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("dense_layers");
    const auto numel = reader.value<std::uint64_t>();
    if (numel_ != 0 && numel != 0 && numel != numel_) {
      throw Error(fmt::format(
          "[dense layers] the saved state covers a gradient of {} elements, this one has {}", numel,
          numel_));
    }
    inner_->load(reader);
    dense_->load(reader);
  }

 private:
  // Splits the tensors by the rule, once; later steps must bring the same
  // layout.
  void plan(std::size_t numel, std::span<const LayerSpan> layers) {
    if (planned_) {
      if (numel != numel_ || layers.size() != layer_count_) {
        throw InvalidArgument(fmt::format(
            "[dense layers] the gradient changed shape: {} elements in {} tensors, was {} in {}",
            numel, layers.size(), numel_, layer_count_));
      }
      return;
    }
    if (layers.empty() && numel > 0) {
      throw InvalidArgument(
          "[dense layers] sending small or named tensors densely needs the tensor layout of the "
          "gradient (StepContext::layers); none was given");
    }
    std::size_t at = 0;
    std::size_t packed = 0;
    std::size_t dense = 0;
    for (const LayerSpan& layer : layers) {
      if (layer.offset != at) {
        throw InvalidArgument(fmt::format(
            "[dense layers] the tensors must tile the gradient in order: '{}' starts at {}, "
            "expected {}",
            layer.name, layer.offset, at));
      }
      at += layer.size;
      const bool to_dense = rule_.matches(layer);
      std::vector<Range>& runs = to_dense ? dense_runs_ : sparse_runs_;
      if (!runs.empty() && runs.back().end == layer.offset) {
        runs.back().end = at;
      } else if (layer.size > 0) {
        runs.push_back({layer.offset, at});
      }
      if (to_dense) {
        dense += layer.size;
      } else {
        sparse_layers_.push_back({layer.name, packed, layer.size, layer.rows});
        packed += layer.size;
      }
    }
    if (at != numel) {
      throw InvalidArgument(fmt::format(
          "[dense layers] the tensors cover {} elements of a gradient of {}", at, numel));
    }
    dense_values_.assign(dense, 0.0f);
    if (sparse_runs_.size() > 1) packed_.assign(packed, 0.0f);
    numel_ = numel;
    layer_count_ = layers.size();
    planned_ = true;
  }

  // Copies the runs of `full` one after another into `packed`.
  static void gather_runs(std::span<const float> full, const std::vector<Range>& runs,
                          std::span<float> packed) {
    std::size_t at = 0;
    for (const Range r : runs) {
      std::copy(full.begin() + r.begin, full.begin() + r.end, packed.begin() + at);
      at += r.size();
    }
  }
  // The inverse: `packed`, one run after another, back into the runs of `full`.
  static void scatter_runs(std::span<const float> packed, const std::vector<Range>& runs,
                           std::span<float> full) {
    std::size_t at = 0;
    for (const Range r : runs) {
      std::copy(packed.begin() + at, packed.begin() + at + r.size(), full.begin() + r.begin);
      at += r.size();
    }
  }

  std::unique_ptr<GradientSync> dense_;
  DenseLayerRule rule_;
  bool planned_ = false;
  std::size_t numel_ = 0;
  std::size_t layer_count_ = 0;
  std::vector<Range> dense_runs_;         // in the full gradient
  std::vector<Range> sparse_runs_;        // in the full gradient
  std::vector<LayerSpan> sparse_layers_;  // offsets in the packed part
  std::vector<float> dense_values_;
  std::vector<float> packed_;  // only when the sparse tensors are not one run
  mutable std::vector<float> kept_;
};

}  // namespace

std::unique_ptr<GradientSync> with_dense_layers(std::unique_ptr<GradientSync> inner,
                                                const DenseLayerRule& rule,
                                                NonFinitePolicy nonfinite) {
  for (const std::string& pattern : rule.patterns) {
    if (pattern.empty()) {
      throw InvalidArgument("[dense layers] an empty name pattern matches nothing; drop it");
    }
  }
  if (rule.empty() || inner->method() == "dense") return inner;
  if (inner->applies_momentum()) {
    throw InvalidArgument(fmt::format(
        "[dense layers] {} applies momentum itself (memory=momentum, or DeMo's own), so the "
        "optimizer runs without it and tensors sent densely would get no momentum at all; drop "
        "--min-numel and --exclude{}",
        inner->method(), inner->method() == "demo" ? "" : ", or use memory=ef"));
  }
  return std::make_unique<DenseLayersSync>(std::move(inner), rule, nonfinite);
}

}  // namespace sparsecomm
