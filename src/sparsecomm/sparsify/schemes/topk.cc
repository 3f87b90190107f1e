// Top-k ("TopK-SGD"): each rank selects the k largest |a_r| over the whole
// vector, exactly, ties broken by the lower index. Default exchange: sparse
// allgather; the union may grow up to n*k ("gradient build-up").

#include "sparsecomm/sparsify/kernels/topk.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm::schemes {
namespace {

class TopK final : public DensitySparsifier {
 public:
  using DensitySparsifier::DensitySparsifier;

  std::string_view name() const override { return "topk"; }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator&,
              SparseSelection& out) override {
    const std::size_t k = start_full_read(accumulated, ctx, out);
    if (k == 0) return;
    selector_.select(accumulated, k, 0, out);
  }

 private:
  TopKSelector selector_;
};

// The device path's top-k (a histogram of log2|a|, then an exact top-k
// above the k-th largest's bin) with error feedback.
constexpr std::string_view kTopkDeviceOptions[] = {"density", "memory=ef"};

}  // namespace

SchemeDefinition topk_definition() {
  return {.name = "topk",
          .summary = "exact local top-k of |g + e| on every rank",
          .traits = {.selection = SchemeTraits::Selection::kIndependent,
                     .device_options = kTopkDeviceOptions},
          .build = build_with_density<TopK>};
}

}  // namespace sparsecomm::schemes
