// Hard threshold: each rank selects |a_r| >= lambda for a constant lambda.
// The reference default 1/(2*sqrt(k)) has no scale meaning (it ignores the
// gradient's magnitude); option lambda sets it. Default exchange: sparse
// allgather.

#include <cmath>
#include <limits>

#include "sparsecomm/sparsify/kernels/threshold_select.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm::schemes {
namespace {

class HardThreshold final : public DensitySparsifier {
 public:
  // lambda < 0: the reference default 1/(2*sqrt(k)), from this step's k.
  HardThreshold(double density, double lambda) : DensitySparsifier(density), lambda_(lambda) {}

  std::string_view name() const override { return "threshold"; }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator&,
              SparseSelection& out) override {
    const std::size_t k = start_full_read(accumulated, ctx, out);
    if (k == 0) return;
    threshold_select(accumulated, threshold_for(k), 0, out);
  }

  float threshold_for(std::size_t k) const {
    if (lambda_ >= 0.0) return static_cast<float>(lambda_);
    return static_cast<float>(1.0 / (2.0 * std::sqrt(static_cast<double>(k))));
  }

 private:
  double lambda_;
};

void build_threshold(const SchemeOptions& options, const CommonOptions& common,
                     SchemeParts& parts) {
  const double lambda = options.has("lambda")
                            ? options.number(common.scheme, "lambda", 0.0, 0.0,
                                             std::numeric_limits<double>::infinity())
                            : -1.0;
  parts.sparsifier = std::make_unique<HardThreshold>(common.density, lambda);
}

constexpr std::string_view kThresholdDeviceOptions[] = {"density", "lambda", "memory=ef"};

}  // namespace

SchemeDefinition threshold_definition() {
  return {.name = "threshold",
          .summary = "hard threshold: every rank selects |g + e| >= lambda",
          .traits = {.selection = SchemeTraits::Selection::kIndependent,
                     .unpriced_because =
                         "its count follows lambda and the gradient's scale, not the density",
                     .device_options = kThresholdDeviceOptions},
          .options = {{"lambda", "1/(2*sqrt(k))",
                       "the constant threshold (>= 0); the default is the reference's, which "
                       "ignores the gradient's scale"}},
          .build = build_threshold};
}

}  // namespace sparsecomm::schemes
