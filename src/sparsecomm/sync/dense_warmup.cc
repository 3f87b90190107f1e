#include "sparsecomm/sync/dense_warmup.h"

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

class DenseWarmupSync final : public GradientSyncDecorator {
 public:
  DenseWarmupSync(std::unique_ptr<GradientSync> inner, std::int64_t steps,
                  NonFinitePolicy nonfinite)
      : GradientSyncDecorator(std::move(inner)),
        dense_(make_gradient_sync("dense", SchemeOptions{}, nonfinite)),
        steps_(steps) {}

  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override {
    if (ctx.step < steps_) return dense_->synchronize(gradient, ctx, comm);
    return inner_->synchronize(gradient, ctx, comm);
  }

  void save(StateWriter& writer) const override {
    writer.tag("dense_warmup");
    writer.value<std::int64_t>(steps_);
    inner_->save(writer);
    dense_->save(writer);
  }

  void load(StateReader& reader) override {
    reader.expect_tag("dense_warmup");
    const auto steps = reader.value<std::int64_t>();
    if (steps != steps_) {
      throw Error(fmt::format("[dense warm-up] the saved state has {} dense steps, this run {}",
                              steps, steps_));
    }
    inner_->load(reader);
    dense_->load(reader);
  }

 private:
  std::unique_ptr<GradientSync> dense_;
  std::int64_t steps_;
};

}  // namespace

std::unique_ptr<GradientSync> with_dense_warmup(std::unique_ptr<GradientSync> inner,
                                                std::int64_t steps, NonFinitePolicy nonfinite) {
  if (steps < 0) {
    throw InvalidArgument(fmt::format("[dense warm-up] {} steps: give 0 (none) or more", steps));
  }
  if (steps == 0 || inner->method() == "dense") return inner;
  return std::make_unique<DenseWarmupSync>(std::move(inner), steps, nonfinite);
}

}  // namespace sparsecomm
