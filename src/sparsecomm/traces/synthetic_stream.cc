// The synthetic gradient stream.
//
// g_r(t)[i] = drift(t) * profile[i] * (a * shared_t[i] + b * noise_{r,t}[i])
//
//  - profile[i] (fixed): layer scale (per-layer differences spanning
//    layer_scale_range), regional skew (a ramp with a bump over the flat
//    index space) and a per-element heavy-tail factor exp(tail * N(0,1))
//    (some coordinates are persistently large, as in real models);
//  - shared_t and noise_{r,t}: standard normals read contiguously from a
//    fixed pool of 2^22 normals at offsets drawn from Philox(seed) keyed by
//    (step) and (step, rank), so a fill costs a few multiply-adds per element
//    and vectorizes; a = sqrt(shared_fraction), b = sqrt(1 - shared_fraction);
//  - drift(t) = drift_factor^(-min(t, drift_steps) / drift_steps).

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/traces/gradient_stream.h"

namespace sparsecomm {
namespace {

constexpr std::size_t kPoolBits = 22;
constexpr std::size_t kPoolSize = std::size_t{1} << kPoolBits;
constexpr std::uint64_t kSaltPool = 0x51a7e0001ull;
constexpr std::uint64_t kSaltTail = 0x51a7e0002ull;
constexpr std::uint64_t kSaltOffsets = 0x51a7e0003ull;

// Standard normal from two 32-bit uniforms (Box-Muller, first output).
double normal_from(std::uint32_t u0, std::uint32_t u1) {
  const double a = (static_cast<double>(u0) + 0.5) / 4294967296.0;
  const double b = static_cast<double>(u1) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(a)) * std::cos(2.0 * std::numbers::pi * b);
}

class SyntheticStream final : public GradientStream {
 public:
  explicit SyntheticStream(const SyntheticStreamOptions& options) : options_(options) {
    validate();
    build_layers();
    build_profile();
    build_pool();
  }

  std::size_t numel() const override { return options_.numel; }
  std::int64_t steps() const override { return std::numeric_limits<std::int64_t>::max(); }
  int world() const override { return std::numeric_limits<int>::max(); }
  std::span<const LayerSpan> layers() const override { return layers_; }

  void fill(int rank, std::int64_t step, std::span<float> out) const override {
    if (out.size() != options_.numel) {
      throw InvalidArgument(fmt::format("[synthetic] fill: buffer of {} elements, stream has {}",
                                        out.size(), options_.numel));
    }
    const Philox offsets(options_.seed ^ kSaltOffsets);
    const auto t = static_cast<std::uint64_t>(step);
    const std::size_t shared_offset = offsets.u64(t, 0) & (kPoolSize - 1);
    const std::size_t noise_offset =
        offsets.u64(t, 1 + static_cast<std::uint64_t>(rank)) & (kPoolSize - 1);
    const double progress =
        options_.drift_steps > 0
            ? static_cast<double>(std::min<std::int64_t>(step, options_.drift_steps)) /
                  static_cast<double>(options_.drift_steps)
            : 0.0;
    const auto drift = static_cast<float>(std::pow(options_.drift_factor, -progress));
    const auto a = static_cast<float>(std::sqrt(options_.shared_fraction)) * drift;
    const auto b = static_cast<float>(std::sqrt(1.0 - options_.shared_fraction)) * drift;
    const float* pool = pool_.data();
    const float* profile = profile_.data();
    float* dst = out.data();
    // Walk in runs that do not wrap around the pool, so the inner loop is a
    // plain contiguous multiply-add.
    std::size_t i = 0;
    while (i < out.size()) {
      const std::size_t s = (shared_offset + i) & (kPoolSize - 1);
      const std::size_t r = (noise_offset + i) & (kPoolSize - 1);
      const std::size_t run = std::min({out.size() - i, kPoolSize - s, kPoolSize - r});
      const float* shared = pool + s;
      const float* noise = pool + r;
      for (std::size_t j = 0; j < run; ++j) {
        dst[i + j] = profile[i + j] * (a * shared[j] + b * noise[j]);
      }
      i += run;
    }
  }

  std::string describe() const override {
    return fmt::format(
        "synthetic(numel={}, layers={}, scale_range={}, tail={}, skew={}, drift={}x over {} "
        "steps, shared={}, seed={})",
        options_.numel, options_.layers, options_.layer_scale_range, options_.tail, options_.skew,
        options_.drift_factor, options_.drift_steps, options_.shared_fraction, options_.seed);
  }

 private:
  void validate() const {
    const auto fail = [](const std::string& what) { throw InvalidArgument("[synthetic] " + what); };
    if (options_.numel > std::numeric_limits<Index>::max()) {
      fail(fmt::format("numel {} exceeds the index range (2^32 - 1)", options_.numel));
    }
    if (options_.layers < 1) fail(fmt::format("layers must be >= 1, got {}", options_.layers));
    if (!(options_.layer_scale_range >= 1.0)) {
      fail(fmt::format("layer_scale_range must be >= 1, got {}", options_.layer_scale_range));
    }
    if (!(options_.tail >= 0.0)) fail(fmt::format("tail must be >= 0, got {}", options_.tail));
    if (!(options_.skew >= 0.0)) fail(fmt::format("skew must be >= 0, got {}", options_.skew));
    if (!(options_.drift_factor > 0.0)) {
      fail(fmt::format("drift_factor must be > 0, got {}", options_.drift_factor));
    }
    if (options_.drift_steps < 0) {
      fail(fmt::format("drift_steps must be >= 0, got {}", options_.drift_steps));
    }
    if (!(options_.shared_fraction >= 0.0 && options_.shared_fraction <= 1.0)) {
      fail(fmt::format("shared_fraction must be in [0, 1], got {}", options_.shared_fraction));
    }
  }

  // Layer sizes vary by up to 8x in a fixed irregular pattern; scales are
  // spread geometrically over [1/range, 1] in an order that alternates big
  // and small layers.
  void build_layers() {
    const std::size_t count = std::min<std::size_t>(static_cast<std::size_t>(options_.layers),
                                                    std::max<std::size_t>(options_.numel, 1));
    std::vector<double> weights(count);
    for (std::size_t l = 0; l < count; ++l) weights[l] = 1.0 + static_cast<double>((l * 5 + 3) % 8);
    double total = 0;
    for (double w : weights) total += w;
    std::size_t offset = 0;
    for (std::size_t l = 0; l < count; ++l) {
      std::size_t size =
          l + 1 == count
              ? options_.numel - offset
              : static_cast<std::size_t>(static_cast<double>(options_.numel) * weights[l] / total);
      size = std::min(size, options_.numel - offset);
      layers_.push_back({fmt::format("layer{}", l), offset, size});
      offset += size;
    }
    layer_scales_.resize(count);
    for (std::size_t l = 0; l < count; ++l) {
      const double position =
          count == 1 ? 0.0 : static_cast<double>((l * 7) % count) / static_cast<double>(count - 1);
      layer_scales_[l] = std::pow(options_.layer_scale_range, -position);
    }
  }

  void build_profile() {
    profile_.assign(options_.numel, 0.0f);
    const Philox tail_rng(options_.seed ^ kSaltTail);
    const double d = static_cast<double>(std::max<std::size_t>(options_.numel, 1));
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      for (std::size_t i = layers_[l].offset; i < layers_[l].offset + layers_[l].size; ++i) {
        const double x = static_cast<double>(i) / d;
        const double skew =
            std::exp(options_.skew * (0.7 * x + 0.3 * std::sin(4.0 * std::numbers::pi * x)));
        const Philox::Block bits = tail_rng.block(i, 0);
        const double tail = std::exp(options_.tail * normal_from(bits[0], bits[1]));
        profile_[i] = static_cast<float>(layer_scales_[l] * skew * tail);
      }
    }
  }

  void build_pool() {
    pool_.resize(kPoolSize);
    const Philox rng(options_.seed ^ kSaltPool);
    for (std::size_t i = 0; i < kPoolSize; ++i) {
      const Philox::Block bits = rng.block(i, 0);
      pool_[i] = static_cast<float>(normal_from(bits[0], bits[1]));
    }
  }

  SyntheticStreamOptions options_;
  std::vector<LayerSpan> layers_;
  std::vector<double> layer_scales_;
  std::vector<float> profile_;
  std::vector<float> pool_;
};

}  // namespace

std::unique_ptr<GradientStream> make_synthetic_stream(const SyntheticStreamOptions& options) {
  return std::make_unique<SyntheticStream>(options);
}

}  // namespace sparsecomm
