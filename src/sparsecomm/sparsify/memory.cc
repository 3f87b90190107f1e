// Gradient memories (memory.h): error feedback, no memory (optionally with
// Random-k's rescaling), DGC's momentum correction.
//
// The loops are plain element-wise loops over contiguous floats that the
// compiler vectorizes; the norms sum in double with independent partial
// sums.

#include "sparsecomm/sparsify/memory.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm {

double sum_of_squares(std::span<const float> x) {
  constexpr std::size_t kLanes = 8;
  std::array<double, kLanes> partial{};
  const std::size_t n = x.size();
  const float* p = x.data();
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) {
      const double v = p[i + j];
      partial[j] += v * v;
    }
  }
  for (; i < n; ++i) {
    const double v = p[i];
    partial[0] += v * v;
  }
  double total = 0.0;
  for (const double s : partial) total += s;
  return total;
}

namespace {

// One buffer of the memory's fixed length: sized (and zeroed) by the first
// accumulate() or by load(); a different length later is an error.
class FixedBuffer {
 public:
  // Sizes the buffer on first use; checks the length afterwards.
  void ensure(std::size_t numel, std::string_view memory) {
    if (sized_) {
      if (numel != data_.size()) {
        throw InvalidArgument(fmt::format(
            "[memory] {}: the gradient has {} elements, but the memory holds {} (the length is "
            "fixed by the first step)",
            memory, numel, data_.size()));
      }
      return;
    }
    data_.resize(numel);
    std::fill(data_.begin(), data_.end(), 0.0f);
    sized_ = true;
  }
  std::span<float> span() { return {data_.data(), data_.size()}; }
  std::span<const float> span() const { return {data_.data(), data_.size()}; }
  bool sized() const { return sized_; }

  void save(StateWriter& writer) const {
    writer.value<std::uint8_t>(sized_ ? 1 : 0);
    writer.array(span());
  }
  void load(StateReader& reader) {
    sized_ = reader.value<std::uint8_t>() != 0;
    const std::vector<float> saved = reader.array<float>();
    data_.resize(saved.size());
    std::copy(saved.begin(), saved.end(), data_.begin());
  }

 private:
  UninitVector<float> data_;
  bool sized_ = false;
};

// e += g; the exchange leaves e = a - sent.
class ErrorFeedback final : public GradientMemory {
 public:
  explicit ErrorFeedback(float decay) : decay_(decay) {}
  std::string_view name() const override { return "ef"; }

  void accumulate(std::span<const float> gradient) override {
    residual_.ensure(gradient.size(), name());
    float* e = residual_.span().data();
    const float* g = gradient.data();
    const std::size_t n = gradient.size();
    if (decay_ == 1.0f) {
      for (std::size_t i = 0; i < n; ++i) e[i] += g[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) e[i] = decay_ * e[i] + g[i];
    }
  }
  std::span<float> accumulated() override { return residual_.span(); }
  void after_exchange(std::span<const Index>) override {}
  double residual_norm() const override { return std::sqrt(sum_of_squares(residual_.span())); }

  void save(StateWriter& writer) const override {
    writer.tag("memory.ef");
    residual_.save(writer);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("memory.ef");
    residual_.load(reader);
  }

 private:
  float decay_;
  FixedBuffer residual_;
};

// EF21: a = g - h; after the exchange h = g - leftover at the transmitted
// positions; the average becomes H += average.
class Ef21 final : public GradientMemory {
 public:
  std::string_view name() const override { return "ef21"; }

  void accumulate(std::span<const float> gradient) override {
    const std::size_t n = gradient.size();
    for (FixedBuffer* buffer : {&own_, &mean_, &difference_, &gradient_}) {
      buffer->ensure(n, name());
    }
    const float* g = gradient.data();
    const float* h = own_.span().data();
    float* a = difference_.span().data();
    float* kept = gradient_.span().data();
    for (std::size_t i = 0; i < n; ++i) {
      kept[i] = g[i];
      a[i] = g[i] - h[i];
    }
  }
  std::span<float> accumulated() override { return difference_.span(); }
  // The exchange left a = (g - h) - sent at the transmitted positions.
  void after_exchange(std::span<const Index> transmitted) override {
    float* h = own_.span().data();
    const float* a = difference_.span().data();
    const float* g = gradient_.span().data();
    for (const Index i : transmitted) h[i] = g[i] - a[i];
  }
  bool finishes_average() const override { return true; }
  void finish(std::span<float> average) override {
    float* estimate = mean_.span().data();
    float* out = average.data();
    for (std::size_t i = 0, n = average.size(); i < n; ++i) {
      estimate[i] += out[i];
      out[i] = estimate[i];
    }
  }
  // ||g - h||: what this rank's estimate still misses.
  double residual_norm() const override { return std::sqrt(sum_of_squares(difference_.span())); }

  void save(StateWriter& writer) const override {
    writer.tag("memory.ef21");
    own_.save(writer);
    mean_.save(writer);
    difference_.save(writer);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("memory.ef21");
    own_.load(reader);
    mean_.load(reader);
    difference_.load(reader);
    gradient_ = FixedBuffer();
    if (own_.sized()) gradient_.ensure(own_.span().size(), name());
  }

 private:
  FixedBuffer own_;         // h: this rank's estimate of its gradient
  FixedBuffer mean_;        // H: the mean of the ranks' h, the same on every rank
  FixedBuffer difference_;  // g - h before the exchange, its leftover after
  FixedBuffer gradient_;    // this step's g, between accumulate and after_exchange
};

// a = scale * g each step; after the exchange the leftover is dropped.
class NoMemory final : public GradientMemory {
 public:
  // rescale_density > 0: scale = d / target_count(density, d) (Random-k's
  // unbiased estimate); 0: scale 1.
  explicit NoMemory(double rescale_density) : rescale_density_(rescale_density) {}

  std::string_view name() const override { return "none"; }

  void accumulate(std::span<const float> gradient) override {
    buffer_.ensure(gradient.size(), name());
    float* a = buffer_.span().data();
    const float* g = gradient.data();
    const std::size_t n = gradient.size();
    if (rescale_density_ > 0.0 && n > 0) {
      const float scale = static_cast<float>(
          static_cast<double>(n) / static_cast<double>(target_count(rescale_density_, n)));
      for (std::size_t i = 0; i < n; ++i) a[i] = scale * g[i];
    } else {
      std::copy(g, g + n, a);
    }
  }
  std::span<float> accumulated() override { return buffer_.span(); }
  void after_exchange(std::span<const Index>) override {
    const auto a = buffer_.span();
    std::fill(a.begin(), a.end(), 0.0f);
  }
  // Nothing is kept from one step to the next.
  double residual_norm() const override { return 0.0; }

  void save(StateWriter& writer) const override {
    writer.tag("memory.none");
    writer.value<std::uint8_t>(buffer_.sized() ? 1 : 0);
    writer.value<std::uint64_t>(buffer_.span().size());
  }
  void load(StateReader& reader) override {
    reader.expect_tag("memory.none");
    const bool sized = reader.value<std::uint8_t>() != 0;
    const auto numel = reader.value<std::uint64_t>();
    buffer_ = FixedBuffer();
    if (sized) buffer_.ensure(static_cast<std::size_t>(numel), name());
  }

 private:
  double rescale_density_;
  FixedBuffer buffer_;
};

// DGC: u = m*u + g; v = v + u; select on v; u masked where transmitted.
class MomentumCorrection final : public GradientMemory {
 public:
  MomentumCorrection(double momentum, double clip_norm)
      : momentum_(static_cast<float>(momentum)), clip_norm_(clip_norm) {
    if (!(momentum >= 0.0 && momentum < 1.0)) {
      throw InvalidArgument(fmt::format("[memory] momentum {} is outside [0, 1)", momentum));
    }
    if (!(clip_norm >= 0.0) || std::isinf(clip_norm)) {
      throw InvalidArgument(
          fmt::format("[memory] clip_norm {} must be finite and >= 0 (0 = off)", clip_norm));
    }
  }

  std::string_view name() const override { return "momentum"; }
  bool applies_momentum() const override { return true; }

  void accumulate(std::span<const float> gradient) override {
    momentum_buffer_.ensure(gradient.size(), name());
    velocity_.ensure(gradient.size(), name());
    float* u = momentum_buffer_.span().data();
    float* v = velocity_.span().data();
    const float* g = gradient.data();
    const float m = momentum_;
    const std::size_t n = gradient.size();
    float scale = 1.0f;
    if (clip_norm_ > 0.0) {
      const double norm = std::sqrt(sum_of_squares(gradient));
      if (norm > clip_norm_) scale = static_cast<float>(clip_norm_ / norm);
    }
    if (scale == 1.0f) {
      for (std::size_t i = 0; i < n; ++i) {
        const float ui = m * u[i] + g[i];
        u[i] = ui;
        v[i] += ui;
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const float ui = m * u[i] + scale * g[i];
        u[i] = ui;
        v[i] += ui;
      }
    }
  }
  std::span<float> accumulated() override { return velocity_.span(); }
  // v was already reduced to a - sent by the exchange (0 for fp32).
  void after_exchange(std::span<const Index> transmitted) override {
    float* u = momentum_buffer_.span().data();
    for (const Index i : transmitted) u[i] = 0.0f;
  }
  double residual_norm() const override { return std::sqrt(sum_of_squares(velocity_.span())); }

  // Layout: tag, u, v.
  void save(StateWriter& writer) const override {
    writer.tag("memory.momentum");
    momentum_buffer_.save(writer);
    velocity_.save(writer);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("memory.momentum");
    momentum_buffer_.load(reader);
    velocity_.load(reader);
  }

 private:
  float momentum_;
  double clip_norm_;
  FixedBuffer momentum_buffer_;  // u
  FixedBuffer velocity_;         // v, the accumulated vector
};

// Relative gradient clipping in front of another memory (with_spike_clip).
class SpikeClip final : public GradientMemory {
 public:
  SpikeClip(std::unique_ptr<GradientMemory> inner, double ratio)
      : inner_(std::move(inner)), ratio_(ratio) {}
  std::string_view name() const override { return inner_->name(); }

  void accumulate(std::span<const float> gradient) override {
    const double norm = std::sqrt(sum_of_squares(gradient));
    const double limit = ratio_ * reference_;
    double kept = norm;
    if (reference_ > 0.0 && norm > limit) {
      kept = limit;
      const float scale = static_cast<float>(limit / norm);
      scaled_.resize(gradient.size());
      for (std::size_t i = 0; i < gradient.size(); ++i) scaled_[i] = scale * gradient[i];
      gradient = scaled_;
      ++clipped_;
    }
    reference_ = reference_ == 0.0 ? kept : kMeanWeight * kept + (1.0 - kMeanWeight) * reference_;
    inner_->accumulate(gradient);
  }
  std::span<float> accumulated() override { return inner_->accumulated(); }
  void after_exchange(std::span<const Index> transmitted) override {
    inner_->after_exchange(transmitted);
  }
  bool finishes_average() const override { return inner_->finishes_average(); }
  bool applies_momentum() const override { return inner_->applies_momentum(); }
  void finish(std::span<float> average) override { inner_->finish(average); }
  double residual_norm() const override { return inner_->residual_norm(); }
  std::int64_t clipped_steps() const override { return clipped_; }

  void save(StateWriter& writer) const override {
    writer.tag("memory.spike_clip");
    writer.value<double>(reference_);
    writer.value<std::int64_t>(clipped_);
    inner_->save(writer);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("memory.spike_clip");
    reference_ = reader.value<double>();
    clipped_ = reader.value<std::int64_t>();
    inner_->load(reader);
  }

 private:
  static constexpr double kMeanWeight = 0.1;  // the running mean's weight of the newest norm
  std::unique_ptr<GradientMemory> inner_;
  double ratio_;
  double reference_ = 0.0;  // running mean of the norms that entered (0: none yet)
  std::int64_t clipped_ = 0;
  std::vector<float> scaled_;
};

}  // namespace

std::unique_ptr<GradientMemory> make_error_feedback(double decay) {
  if (!(decay > 0.0 && decay <= 1.0)) {
    throw InvalidArgument(
        fmt::format("[memory] error feedback's decay {} must lie in (0, 1]", decay));
  }
  return std::make_unique<ErrorFeedback>(static_cast<float>(decay));
}

std::unique_ptr<GradientMemory> make_ef21() { return std::make_unique<Ef21>(); }

std::unique_ptr<GradientMemory> make_no_memory() { return std::make_unique<NoMemory>(0.0); }

std::unique_ptr<GradientMemory> make_momentum_correction(double momentum, double clip_norm) {
  return std::make_unique<MomentumCorrection>(momentum, clip_norm);
}

namespace schemes {
std::unique_ptr<GradientMemory> make_rescaled_no_memory(double density) {
  if (!(density > 0.0 && density <= 1.0)) {
    throw InvalidArgument(fmt::format("[memory] rescale density {} is outside (0, 1]", density));
  }
  return std::make_unique<NoMemory>(density);
}
}  // namespace schemes

std::unique_ptr<GradientMemory> with_spike_clip(std::unique_ptr<GradientMemory> inner,
                                                double ratio) {
  if (!(ratio > 1.0) || !std::isfinite(ratio)) {
    throw InvalidArgument(fmt::format(
        "spike clip ratio must be a finite number above 1 (got {}); 0 turns the clip off", ratio));
  }
  return std::make_unique<SpikeClip>(std::move(inner), ratio);
}

}  // namespace sparsecomm
