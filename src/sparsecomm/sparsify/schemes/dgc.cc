// DGC (Deep Gradient Compression): a sampled threshold with a search
// around it, momentum correction, optional local clipping, and a warm-up of
// the density. Default exchange: sparse allgather.
//
// Selection on |v| (v = the momentum memory's accumulated velocity):
//  1. thr = sampled_threshold(v, c_t, start): a strided sample of
//     max(1% of d, min(d, 1000)) elements from a random start drawn from
//     Philox(seed) at (t, rank); thr is the sample's value at rank
//     ceil(c_t * sample size) from the top.
//  2. Select |v| >= thr (one pass). More than 1.3k: keep the exact top-k of
//     the selected (which is the exact top-k of v, since everything not
//     selected is smaller). Fewer than 0.8k: thr *= 0.8 and select again,
//     at most 10 passes in all; then keep what the last one selected.
// Warm-up (warmup_epochs W > 0): at fractional epoch e < W the density is
// c^((e+1)/(W+1)) (25%, 6.3%, 1.6%, 0.4% at e = 0..3 for c = 0.1%, W = 4),
// then c.

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"
#include "sparsecomm/sparsify/kernels/topk.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm::schemes {
namespace {

constexpr int kMaxRounds = 10;
constexpr double kTooMany = 1.3;
constexpr double kTooFew = 0.8;
constexpr float kLowerFactor = 0.8f;

class Dgc final : public DensitySparsifier {
 public:
  Dgc(double density, double warmup_epochs, std::uint64_t seed)
      : DensitySparsifier(density), warmup_epochs_(warmup_epochs), rng_(seed) {}

  std::string_view name() const override { return "dgc"; }

  // The density at this step, after the warm-up.
  double density_at(const StepContext& ctx) const {
    if (warmup_epochs_ > 0.0 && ctx.epoch < warmup_epochs_) {
      const double e = std::max(0.0, ctx.epoch);
      return std::pow(density_, (e + 1.0) / (warmup_epochs_ + 1.0));
    }
    return density_;
  }

  std::size_t target(std::size_t numel, const StepContext& ctx) const override {
    return target_count(density_at(ctx), numel);
  }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator& comm,
              SparseSelection& out) override {
    const std::size_t k = start_full_read(accumulated, ctx, out);
    if (k == 0) return;
    const std::uint64_t start =
        rng_.u64(static_cast<std::uint64_t>(ctx.step),
                 (kDgcStartStream << 32) | static_cast<std::uint32_t>(comm.rank()));
    float threshold = sampled_threshold(accumulated, density_at(ctx), start, sample_);
    // Only a non-finite v (an overflow of e + g) can make this NaN; then
    // select on 0, which falls back to the exact top-k below.
    if (std::isnan(threshold)) threshold = 0.0f;

    const auto too_many = static_cast<double>(k) * kTooMany;
    const auto too_few = static_cast<double>(k) * kTooFew;
    const ThresholdSearch& search =
        search_threshold(accumulated, threshold, kMaxRounds, out,
                         [&](std::size_t found, float current) -> std::optional<float> {
                           if (static_cast<double>(found) >= too_few) return std::nullopt;
                           return current * kLowerFactor;
                         });
    if (static_cast<double>(search.found) > too_many) keep_top_k(k, out);
  }

 private:
  // Trims `out` to the exact top-k of its values, keeping index order.
  void keep_top_k(std::size_t k, SparseSelection& out) {
    picked_.clear();
    top_k_.select(std::span<const float>(out.values.data(), out.values.size()), k, 0, picked_);
    // picked_.indices are ascending positions into out, each >= its own
    // rank, so compacting forward in place is safe.
    for (std::size_t j = 0; j < picked_.size(); ++j) {
      out.indices[j] = out.indices[picked_.indices[j]];
      out.values[j] = picked_.values[j];
    }
    out.indices.resize(picked_.size());
    out.values.resize(picked_.size());
  }

  double warmup_epochs_;
  Philox rng_;
  UninitVector<float> sample_;
  TopKSelector top_k_;
  SparseSelection picked_;
};

void build_dgc(const SchemeOptions& options, const CommonOptions& common, SchemeParts& parts) {
  const std::string_view scheme = common.scheme;
  const double inf = std::numeric_limits<double>::infinity();
  const double warmup_epochs = options.number(scheme, "warmup_epochs", 0.0, 0.0, inf);
  if (std::isinf(warmup_epochs)) {
    throw InvalidArgument(fmt::format("[{}] option warmup_epochs must be finite", scheme));
  }
  parts.sparsifier = std::make_unique<Dgc>(common.density, warmup_epochs, common.seed);
}

}  // namespace

SchemeDefinition dgc_definition() {
  return {.name = "dgc",
          .summary =
              "Deep Gradient Compression: sampled threshold, momentum correction, "
              "warm-up, clipping",
          .traits = {.selection = SchemeTraits::Selection::kIndependent},
          .memories = {"momentum", "ef", "none", "ef21"},
          .options = {{"warmup_epochs", "0",
                       "W: density c^((e+1)/(W+1)) at fractional epoch e < W (0 = off)"}},
          .build = build_dgc};
}

}  // namespace sparsecomm::schemes
