#include "sparsecomm/sparsify/density_controller.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"

namespace sparsecomm {
namespace {

// Smallest threshold ever used: zeros are never selected.
constexpr float kMinThreshold = std::numeric_limits<float>::min();
// Highest candidate floor / threshold.
constexpr double kMaxFloorFactor = 0.95;

class HistogramController final : public DensityController {
 public:
  explicit HistogramController(const HistogramControllerOptions& options) : options_(options) {
    if (options.mantissa_bits < 0 || options.mantissa_bits > 10 || options.window_binades < 2 ||
        !(options.floor_factor > 0 && options.floor_factor <= 1) ||
        !(options.gain >= 0 && options.gain <= 1) ||
        !(options.smoothing > 0 && options.smoothing <= 1) ||
        !(options.trend_smoothing >= 0 && options.trend_smoothing <= 1) ||
        options.settle_steps < 0 || !(options.candidates_low >= 1.0) ||
        !(options.candidates_high > options.candidates_low) ||
        !(options.settled_candidates_low >= 1.0) ||
        !(options.settled_candidates_high > options.settled_candidates_low)) {
      throw InvalidArgument(fmt::format(
          "[density] histogram controller: mantissa_bits {} (0..10), window_binades {} (>= 2), "
          "floor_factor {} ((0, 1]), gain {} ([0, 1]), smoothing {} ((0, 1]), candidate bands "
          "[{}, {}] and [{}, {}] (1 <= low < high) out of range",
          options.mantissa_bits, options.window_binades, options.floor_factor, options.gain,
          options.smoothing, options.candidates_low, options.candidates_high,
          options.settled_candidates_low, options.settled_candidates_high));
    }
    shift_ = 23 - options.mantissa_bits;
    window_ = static_cast<std::size_t>(options.window_binades) << options.mantissa_bits;
    floor_factor_ = options.floor_factor;
  }

  std::string_view name() const override { return "histogram"; }
  bool started() const override { return started_; }

  // Step 0: every bin of the float range (8 exponent bits + mantissa bits).
  std::size_t initial_counts() const override { return std::size_t{256} << options_.mantissa_bits; }
  void contribute_initial(std::span<const float> own,
                          std::span<std::int64_t> counts) const override {
    for (float v : own) {
      const std::uint32_t bin = magnitude_bits(v) >> shift_;
      if (bin < counts.size()) ++counts[bin];  // NaN/inf bins are past the end of finite ones
    }
  }
  void start(std::span<const std::int64_t> global_counts, std::size_t k) override {
    threshold_ = std::max(kMinThreshold, crossing(global_counts, 0, k, /*clamped_top=*/false));
    log_ideal_ = std::log(static_cast<double>(threshold_));
    started_ = true;
  }

  float threshold() const override { return threshold_; }
  float candidate_floor() const override {
    return std::max(kMinThreshold, static_cast<float>(threshold_ * floor_factor_));
  }

  // [histogram of the window | count selected with the current threshold]
  std::size_t step_counts() const override { return window_ + 1; }
  void contribute(std::span<const float> candidates, std::size_t selected,
                  std::span<std::int64_t> counts) const override {
    const float* const c = candidates.data();
    bin_candidates(candidates.size(), [c](std::size_t i) { return c[i]; });
    add_bins(counts);
    counts[window_] += static_cast<std::int64_t>(selected);
  }

  // Bins the candidates, then keeps those >= the threshold with the SIMD
  // compaction kernel.
  void contribute_and_select(SparseSelection& candidates,
                             std::span<std::int64_t> counts) const override {
    const float* const values = candidates.values.data();
    bin_candidates(candidates.size(), [values](std::size_t i) { return values[i]; });
    add_bins(counts);
    counts[window_] += static_cast<std::int64_t>(compact_at_least(candidates, threshold_));
  }

  void update(std::span<const std::int64_t> all_counts, std::size_t k) override {
    if (k == 0) return;
    const auto histogram = all_counts.first(window_);
    const std::int64_t selected = all_counts[window_];
    std::int64_t total = 0;
    for (std::int64_t c : histogram) total += c;
    const std::uint32_t base = floor_bin();
    const auto want = static_cast<std::int64_t>(k);
    double ideal;  // the threshold that would have selected exactly k this step
    if (total < want) {
      // The crossing lies below the candidate floor: all we know is that it
      // is below; look lower next time.
      ideal = std::max(kMinThreshold, candidate_floor() * 0.5f);
      floor_factor_ = std::max(floor_factor_ * 0.5, 1.0 / 1024);
    } else {
      ideal = std::max(kMinThreshold, crossing(histogram, base, k, /*clamped_top=*/true));
      // Keep the candidates a small multiple of k: few enough that counting
      // them costs little next to the read pass, enough to see the crossing
      // and the slope around it next step. While settling the band is wide
      // (1.5-4 k) and the floor moves in big steps; once settled the count
      // above the floor tracks K closely (their ratio depends only on the
      // shape of the tail), so the band narrows (1.2-2 k) with small steps:
      // on a steep tail that halves the candidates, which keeps the
      // selection pass on its sparse loop.
      const bool settled = updates_ >= options_.settle_steps;
      const double low = settled ? options_.settled_candidates_low : options_.candidates_low;
      const double high = settled ? options_.settled_candidates_high : options_.candidates_high;
      const double total_ratio = static_cast<double>(total) / static_cast<double>(want);
      if (total_ratio > high) {
        floor_factor_ = std::min(floor_factor_ * (settled ? 1.05 : 1.25), kMaxFloorFactor);
      } else if (total_ratio < low) {
        floor_factor_ = std::max(floor_factor_ * (settled ? 0.85 : 0.8), 1.0 / 1024);
      }
    }
    // Feed-forward: Holt's linear smoothing of log(ideal), a level and a
    // per-step trend, so a steady drift (learning-rate decay, the residual
    // building up after the start) is predicted rather than lagged.
    const double previous_level = log_ideal_;
    ++updates_;
    if (updates_ <= options_.settle_steps) {
      // Settling: while error feedback builds the residual up after a cold
      // start, the ideal threshold climbs fast and then levels off; follow
      // it directly, so the trend and the integral do not wind up on it.
      log_ideal_ = std::log(ideal);
      log_trend_ = 0.0;
    } else {
      log_ideal_ = options_.smoothing * std::log(ideal) +
                   (1.0 - options_.smoothing) * (log_ideal_ + log_trend_);
      log_trend_ = options_.trend_smoothing * (log_ideal_ - previous_level) +
                   (1.0 - options_.trend_smoothing) * log_trend_;
      // Feedback on the count achieved with the threshold in use. The error
      // is K/k - 1, not log(K/k): on real gradients K/k varies a lot from
      // step to step (p95 |K/k - 1| ~ 0.4 on a CNN), and driving the mean of
      // log(K/k) to 0 leaves the arithmetic mean exp(var/2) above 1 (a 3-4%
      // bias measured); the linear error drives the mean itself to 1. Capped
      // so one wild step cannot throw the threshold far.
      const double achieved =
          static_cast<double>(std::max<std::int64_t>(selected, 1)) / static_cast<double>(want);
      log_correction_ +=
          options_.gain * std::min(achieved - 1.0, 2.0) / slope(histogram, base, ideal);
    }
    log_correction_ = std::clamp(log_correction_, -3.0, 3.0);
    threshold_ = std::max(kMinThreshold,
                          static_cast<float>(std::exp(log_ideal_ + log_trend_ + log_correction_)));
  }

  void observe(std::size_t, std::size_t) override {}

  void save(StateWriter& writer) const override {
    writer.tag("histogram-controller");
    writer.value(started_);
    writer.value(threshold_);
    writer.value(floor_factor_);
    writer.value(log_ideal_);
    writer.value(log_trend_);
    writer.value(log_correction_);
    writer.value(updates_);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("histogram-controller");
    started_ = reader.value<bool>();
    threshold_ = reader.value<float>();
    floor_factor_ = reader.value<double>();
    log_ideal_ = reader.value<double>();
    log_trend_ = reader.value<double>();
    log_correction_ = reader.value<double>();
    updates_ = reader.value<std::int64_t>();
  }

 private:
  std::uint32_t floor_bin() const { return magnitude_bits(candidate_floor()) >> shift_; }

  // Bins the `size` candidates value(i) into sub_: four interleaved
  // sub-histograms of 32-bit counters. Candidates cluster in the few bins
  // just above the floor, and one counter incremented by consecutive
  // elements is a chain through memory (a store forwarded to the next load)
  // that ran ~6x slower than four independent ones. (A sub-histogram holds
  // at most a quarter of < 2^32 candidates.)
  template <class Value>
  void bin_candidates(std::size_t size, Value value) const {
    const auto base = static_cast<std::int32_t>(floor_bin());
    const auto last = static_cast<std::int32_t>(window_ - 1);
    const int shift = shift_;
    sub_.assign(4 * window_, 0u);
    std::uint32_t* const s0 = sub_.data();
    std::uint32_t* const s1 = s0 + window_;
    std::uint32_t* const s2 = s1 + window_;
    std::uint32_t* const s3 = s2 + window_;
    const auto slot = [&](std::uint32_t bits) {
      const auto bin = static_cast<std::int32_t>(bits >> shift);
      return static_cast<std::size_t>(std::clamp(bin - base, 0, last));
    };
    std::size_t i = 0;
    for (; i + 4 <= size; i += 4) {
      const std::uint32_t b0 = magnitude_bits(value(i));
      const std::uint32_t b1 = magnitude_bits(value(i + 1));
      const std::uint32_t b2 = magnitude_bits(value(i + 2));
      const std::uint32_t b3 = magnitude_bits(value(i + 3));
      ++s0[slot(b0)];
      ++s1[slot(b1)];
      ++s2[slot(b2)];
      ++s3[slot(b3)];
    }
    for (; i < size; ++i) ++s0[slot(magnitude_bits(value(i)))];
  }
  // counts[0, window) += the sum of the sub-histograms.
  void add_bins(std::span<std::int64_t> counts) const {
    const std::uint32_t* const s0 = sub_.data();
    for (std::size_t b = 0; b < window_; ++b) {
      counts[b] += static_cast<std::int64_t>(s0[b]) + s0[b + window_] + s0[b + 2 * window_] +
                   s0[b + 3 * window_];
    }
  }

  // Lower edge and upper edge of histogram bin `bin` (absolute bin number).
  float bin_low(std::uint32_t bin) const { return std::bit_cast<float>(bin << shift_); }
  float bin_high(std::uint32_t bin) const { return std::bit_cast<float>((bin + 1) << shift_); }

  // The magnitude where the cumulative count from the top reaches k, linear
  // inside the bin. Bins are absolute bin numbers base + slot. With
  // clamped_top the last slot holds everything above the window: its
  // elements are taken to lie at its lower edge.
  float crossing(std::span<const std::int64_t> counts, std::uint32_t base, std::size_t k,
                 bool clamped_top) const {
    std::int64_t above = 0;
    const auto want = static_cast<std::int64_t>(k);
    for (std::size_t slot = counts.size(); slot-- > 0;) {
      const std::int64_t here = counts[slot];
      if (here == 0) continue;
      const auto bin = static_cast<std::uint32_t>(base + slot);
      if (above + here >= want) {
        if (clamped_top && slot + 1 == counts.size()) return bin_low(bin);
        const double fraction = static_cast<double>(want - above) / static_cast<double>(here);
        const double high = bin_high(bin);
        const double low = bin_low(bin);
        if (!(low > 0)) return static_cast<float>(high - fraction * (high - low));
        return static_cast<float>(high * std::pow(low / high, fraction));  // log-linear
      }
      above += here;
    }
    return bin_low(base);  // fewer than k elements in all: select all of them
  }

  // -d log(count above v) / d log v around `at`, from the counts at bin
  // edges a factor of 2 apart, clamped to [0.5, 50]: turns a count error
  // into a threshold error.
  double slope(std::span<const std::int64_t> counts, std::uint32_t base, double at) const {
    const auto above = [&](double v) {
      const std::uint32_t bin = magnitude_bits(static_cast<float>(v)) >> shift_;
      std::int64_t n = 0;
      for (std::size_t slot = counts.size(); slot-- > 0;) {
        if (base + slot < bin) break;
        n += counts[slot];
      }
      return static_cast<double>(std::max<std::int64_t>(n, 1));
    };
    const double low = std::max(at / std::sqrt(2.0), static_cast<double>(bin_low(base)));
    const double high = std::max(low * 1.01, at * std::sqrt(2.0));
    const double s = std::log(above(low) / above(high)) / std::log(high / low);
    return std::clamp(std::isfinite(s) ? s : 1.0, 0.5, 50.0);
  }

  HistogramControllerOptions options_;
  int shift_ = 16;
  std::size_t window_ = 512;
  bool started_ = false;
  float threshold_ = kMinThreshold;
  double floor_factor_ = 0.7;
  double log_ideal_ = 0.0;
  double log_trend_ = 0.0;
  double log_correction_ = 0.0;
  std::int64_t updates_ = 0;
  mutable std::vector<std::uint32_t> sub_;  // contribute()'s scratch
};

class TableController final : public DensityController {
 public:
  explicit TableController(const TableControllerOptions& options) : options_(options) {
    if (!(options.initial >= 0) || !(options.up_fast > 0) || !(options.up_slow > 0) ||
        !(options.down > 0) || !(options.low < options.high)) {
      throw InvalidArgument(
          "[density] table controller: factors must be > 0, initial >= 0, low < high");
    }
  }
  std::string_view name() const override { return "table"; }
  bool started() const override { return started_; }
  std::size_t initial_counts() const override { return 0; }
  void contribute_initial(std::span<const float>, std::span<std::int64_t>) const override {}
  void start(std::span<const std::int64_t>, std::size_t k) override {
    threshold_ =
        options_.initial > 0
            ? static_cast<float>(options_.initial)
            : static_cast<float>(
                  1.0 / (2.0 * std::sqrt(static_cast<double>(std::max<std::size_t>(k, 1)))));
    started_ = true;
  }
  float threshold() const override { return threshold_; }
  float candidate_floor() const override { return threshold_; }
  std::size_t step_counts() const override { return 0; }
  void contribute(std::span<const float>, std::size_t, std::span<std::int64_t>) const override {}
  void update(std::span<const std::int64_t>, std::size_t) override {}
  void observe(std::size_t union_size, std::size_t k) override {
    if (k == 0) return;
    const double e = static_cast<double>(union_size) / static_cast<double>(k);
    double factor = options_.down;
    if (e > options_.high) {
      factor = options_.up_fast;
    } else if (e > options_.low) {
      factor = options_.up_slow;  // the reference's middle band: always up
    }
    threshold_ = std::max(kMinThreshold, static_cast<float>(threshold_ * factor));
  }
  void save(StateWriter& writer) const override {
    writer.tag("table-controller");
    writer.value(started_);
    writer.value(threshold_);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("table-controller");
    started_ = reader.value<bool>();
    threshold_ = reader.value<float>();
  }

 private:
  TableControllerOptions options_;
  bool started_ = false;
  float threshold_ = kMinThreshold;
};

}  // namespace

void DensityController::contribute_and_select(SparseSelection& candidates,
                                              std::span<std::int64_t> counts) const {
  const float threshold_now = threshold();
  std::size_t selected = 0;
  for (const float v : candidates.values) selected += std::fabs(v) >= threshold_now ? 1 : 0;
  contribute(std::span<const float>(candidates.values.data(), candidates.size()), selected, counts);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const float v = candidates.values[i];
    candidates.indices[kept] = candidates.indices[i];
    candidates.values[kept] = v;
    kept += std::fabs(v) >= threshold_now ? 1 : 0;
  }
  candidates.indices.resize(kept);
  candidates.values.resize(kept);
}

std::unique_ptr<DensityController> make_histogram_controller(
    const HistogramControllerOptions& options) {
  return std::make_unique<HistogramController>(options);
}
std::unique_ptr<DensityController> make_table_controller(const TableControllerOptions& options) {
  return std::make_unique<TableController>(options);
}

}  // namespace sparsecomm
