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
  ExchangePattern default_exchange() const override { return ExchangePattern::kSparseAllgather; }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator&,
              SparseSelection& out) override {
    out.clear();
    read_only({0, accumulated.size()});
    const std::size_t k = target(accumulated.size(), ctx);
    if (k == 0) return;
    selector_.select(accumulated, k, 0, out);
  }

 private:
  TopKSelector selector_;
};

void build_topk(const SchemeOptions&, const CommonOptions& common, SchemeParts& parts) {
  parts.sparsifier = std::make_unique<TopK>(common.density);
}

}  // namespace

SchemeDefinition topk_definition() {
  SchemeDefinition definition;
  definition.name = "topk";
  definition.summary = "exact local top-k of |g + e| on every rank";
  definition.default_exchange = ExchangePattern::kSparseAllgather;
  definition.build = build_topk;
  return definition;
}

}  // namespace sparsecomm::schemes
