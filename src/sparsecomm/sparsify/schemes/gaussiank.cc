// Gaussian-k: treats a_r as normal, thr = |mu| + sigma * z with
// z = Phi^-1(1 - c/2), then corrects the count: outside [2k/3, 4k/3] the
// threshold is multiplied by 0.8 (too few) or 1.25 (too many) and the
// selection redone, at most 5 passes in all; the last selection is kept,
// unless it is empty: then the exact top-k (a count that alternates across
// the whole band can end on a pass that selects nothing, and a step that
// sends nothing while the accumulator holds mass only grows the residual).
// sigma == 0 (a constant vector) selects nothing when mu == 0, else the
// first k indices. Default exchange: sparse allgather.

#include <cmath>
#include <limits>

#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"
#include "sparsecomm/sparsify/kernels/topk.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm::schemes {

// Acklam's rational approximation of Phi^-1: a central rational function of
// (p - 1/2)^2 and a tail one of sqrt(-2 log p), switching at p = 0.02425
// (relative error < 1.2e-9), then one Halley step on Phi(x) - p, computed
// with erfc, which brings it to about machine precision.
double inverse_normal_cdf(double p) {
  if (std::isnan(p) || p < 0.0 || p > 1.0) return std::numeric_limits<double>::quiet_NaN();
  if (p == 0.0) return -std::numeric_limits<double>::infinity();
  if (p == 1.0) return std::numeric_limits<double>::infinity();
  constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                          1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                          6.680131188771972e+01, -1.328068155288572e+01};
  constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                          -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                          3.754408661907416e+00};
  constexpr double kLow = 0.02425;

  // The lower tail in q = min(p, 1-p) keeps full precision for small p.
  const double q = p < 0.5 ? p : 1.0 - p;
  double x;
  if (q < kLow) {
    const double s = std::sqrt(-2.0 * std::log(q));
    x = (((((c[0] * s + c[1]) * s + c[2]) * s + c[3]) * s + c[4]) * s + c[5]) /
        ((((d[0] * s + d[1]) * s + d[2]) * s + d[3]) * s + 1.0);
  } else {
    const double s = q - 0.5;
    const double r = s * s;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * s /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
  }
  // Halley step on Phi(x) - q; x <= 0 here, where Phi is computed without
  // cancellation as erfc(-x / sqrt 2) / 2.
  constexpr double kSqrt2 = 1.4142135623730951;
  constexpr double kSqrt2Pi = 2.5066282746310002;
  const double e = 0.5 * std::erfc(-x / kSqrt2) - q;
  const double u = e * kSqrt2Pi * std::exp(0.5 * x * x);
  x = x - u / (1.0 + 0.5 * x * u);
  return p < 0.5 ? x : -x;
}

namespace {

constexpr int kMaxRefineRounds = 5;
constexpr float kRefineLowerFactor = 0.8f;
constexpr float kRefineRaiseFactor = 1.25f;

class GaussianK final : public DensitySparsifier {
 public:
  explicit GaussianK(double density)
      : DensitySparsifier(density), z_(-inverse_normal_cdf(density / 2.0)) {}

  std::string_view name() const override { return "gaussiank"; }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator&,
              SparseSelection& out) override {
    const std::size_t k = start_full_read(accumulated, ctx, out);
    if (k == 0) return;
    const Moments m = moments(accumulated);
    if (!std::isfinite(m.mean) || !std::isfinite(m.stddev)) {
      // Only a non-finite a (an overflow of e + g) gets here: never let it
      // reach a threshold; the exact top-k ranks NaN last.
      top_k_.select(accumulated, k, 0, out);
      return;
    }
    if (m.stddev == 0.0) {
      if (m.mean != 0.0) first_k(accumulated, k, out);
      return;
    }
    const auto threshold = static_cast<float>(std::abs(m.mean) + m.stddev * z_);
    const ThresholdSearch& search =
        search_threshold(accumulated, threshold, kMaxRefineRounds, out,
                         [&](std::size_t found, float current) -> std::optional<float> {
                           // [2k/3, 4k/3] in integers: 3 * found against 2k and 4k.
                           const bool too_few = 3 * found < 2 * k;
                           const bool too_many = 3 * found > 4 * k;
                           if (!too_few && !too_many) return std::nullopt;
                           return current * (too_few ? kRefineLowerFactor : kRefineRaiseFactor);
                         });
    if (search.found == 0) top_k_.select(accumulated, k, 0, out);
  }

 private:
  static void first_k(std::span<const float> accumulated, std::size_t k, SparseSelection& out) {
    out.indices.resize(k);
    out.values.resize(k);
    for (std::size_t i = 0; i < k; ++i) {
      out.indices[i] = static_cast<Index>(i);
      out.values[i] = accumulated[i];
    }
  }

  double z_;  // Phi^-1(1 - c/2)
  TopKSelector top_k_;
};

}  // namespace

SchemeDefinition gaussiank_definition() {
  return {.name = "gaussiank",
          .summary = "threshold |mu| + sigma * Phi^-1(1 - c/2) from the moments, count-corrected",
          .traits = {.selection = SchemeTraits::Selection::kIndependent},
          .build = build_with_density<GaussianK>};
}

}  // namespace sparsecomm::schemes
