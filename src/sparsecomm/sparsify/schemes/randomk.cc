// Random-k: all ranks draw the same k distinct indices (without
// replacement) from Philox keyed by the seed, with the step as counter, so
// no index needs to travel: the default exchange all-reduces the k values
// ("shared").
//
// Sampling: Floyd's algorithm (for j = d-k .. d-1: draw t uniform in
// [0, j]; take t, or j if t is already taken) gives a uniform k-subset in k
// draws. Membership lives in a bitmap of d bits (1/32 of the gradient's
// size, reused across steps), which one scan then turns into the sorted
// index list while clearing it for the next step: O(k + d/64).
//
// With error feedback (the default) values are not rescaled. Without it,
// option rescale makes the estimate unbiased: a = (d/k) * g (the memory
// applies the factor, see make_rescaled_no_memory).

#include <algorithm>
#include <bit>
#include <cstdint>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm::schemes {
namespace {

class RandomK final : public DensitySparsifier {
 public:
  RandomK(double density, std::uint64_t seed) : DensitySparsifier(density), rng_(seed) {}

  std::string_view name() const override { return "randomk"; }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator&,
              SparseSelection& out) override {
    out.clear();
    read_nothing();  // k scattered values
    const std::size_t d = accumulated.size();
    const std::size_t k = target(d, ctx);
    if (k == 0) return;
    const std::size_t words = (d + 63) / 64;
    if (bitmap_.size() != words) {
      bitmap_.resize(words);
      std::fill(bitmap_.begin(), bitmap_.end(), std::uint64_t{0});
    }
    const auto step = static_cast<std::uint64_t>(ctx.step);
    for (std::size_t j = d - k; j < d; ++j) {
      const std::uint64_t t = rng_.below(j + 1, step, (kRandomKStream << 32) | j);
      const std::uint64_t pick = test(t) ? j : t;
      bitmap_[pick / 64] |= std::uint64_t{1} << (pick % 64);
    }
    out.indices.resize(k);
    out.values.resize(k);
    std::size_t n = 0;
    for (std::size_t w = 0; w < words; ++w) {
      std::uint64_t bits = bitmap_[w];
      if (bits == 0) continue;
      bitmap_[w] = 0;
      while (bits != 0) {
        const auto i =
            static_cast<Index>(w * 64 + static_cast<std::size_t>(std::countr_zero(bits)));
        out.indices[n] = i;
        out.values[n] = accumulated[i];
        ++n;
        bits &= bits - 1;
      }
    }
  }

 private:
  bool test(std::uint64_t i) const { return ((bitmap_[i / 64] >> (i % 64)) & 1u) != 0; }

  Philox rng_;
  UninitVector<std::uint64_t> bitmap_;  // all zero between calls
};

void build_randomk(const SchemeOptions& options, const CommonOptions& common, SchemeParts& parts) {
  const bool rescale = options.flag(common.scheme, "rescale", false);
  if (rescale) {
    if (common.memory != "none") {
      throw InvalidArgument(fmt::format(
          "[{}] option rescale=true needs memory=none: with error feedback what is not sent is "
          "delayed, not lost, so scaling by d/k would over-count it",
          common.scheme));
    }
    parts.memory = make_rescaled_no_memory(common.density);
  }
  parts.sparsifier = std::make_unique<RandomK>(common.density, common.seed);
}

}  // namespace

SchemeDefinition randomk_definition() {
  return {.name = "randomk",
          .summary = "the same k random coordinates on every rank (Philox by seed and step)",
          .traits = {.selection = SchemeTraits::Selection::kShared},
          .options = {{"rescale", "false",
                       "scale the sent values by d/k (unbiased); only with memory=none"}},
          .build = build_randomk};
}

}  // namespace sparsecomm::schemes
