#include "sparsecomm/sparsify/kernels/estimate.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/kernels/simd_impl.h"

namespace sparsecomm {
namespace detail::scalar {

float abs_sum(const float* x, std::size_t n) {
  float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (std::size_t l = 0; l < 4; ++l) a[l] += std::fabs(x[i + l]);
  }
  for (; i < n; ++i) a[0] += std::fabs(x[i]);
  return (a[0] + a[1]) + (a[2] + a[3]);
}

bool all_finite(const float* x, std::size_t n) {
  // An all-ones exponent marks NaN and infinity. Branch-free integer code the
  // compiler vectorizes with baseline SSE2.
  constexpr std::uint32_t kExponent = 0x7f800000u;
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bad |= (std::bit_cast<std::uint32_t>(x[i]) & kExponent) == kExponent ? 1u : 0u;
  }
  return bad == 0;
}

MomentSums moment_sums(const float* x, std::size_t n, double shift) {
  // Four independent chains: one chain would be bound by the add latency.
  double sum[4] = {0.0, 0.0, 0.0, 0.0};
  double sq[4] = {0.0, 0.0, 0.0, 0.0};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (std::size_t l = 0; l < 4; ++l) {
      const double d = static_cast<double>(x[i + l]) - shift;
      sum[l] += d;
      sq[l] += d * d;
    }
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - shift;
    sum[0] += d;
    sq[0] += d * d;
  }
  MomentSums r;
  r.sum = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  r.sum_sq = (sq[0] + sq[1]) + (sq[2] + sq[3]);
  return r;
}

}  // namespace detail::scalar

float sampled_threshold(std::span<const float> x, double density, std::uint64_t start,
                        UninitVector<float>& scratch) {
  if (std::isnan(density)) throw InvalidArgument("[sampled_threshold] density is NaN");
  const std::size_t d = x.size();
  if (d == 0) return std::numeric_limits<float>::infinity();
  const std::size_t size = std::max(d / 100, std::min<std::size_t>(d, 1000));
  const std::size_t stride = d / size;
  const std::size_t first = static_cast<std::size_t>(start % stride);
  scratch.resize(size);
  for (std::size_t j = 0; j < size; ++j) {
    const float a = std::fabs(x[first + j * stride]);
    scratch[j] = std::isnan(a) ? 0.0f : a;  // NaN ranks below every number
  }
  // Rank ceil(density * size) from the top, 1-based, clamped to [1, size].
  const double want = std::ceil(density * static_cast<double>(size));
  const std::size_t rank =
      want <= 1.0 ? 1 : (want >= static_cast<double>(size) ? size : static_cast<std::size_t>(want));
  const auto nth = scratch.begin() + static_cast<std::ptrdiff_t>(rank - 1);
  std::nth_element(scratch.begin(), nth, scratch.end(), std::greater<float>());
  return *nth;
}

Moments moments(std::span<const float> x, SimdLevel level) {
  detail::require_simd_level(level, "moments");
  Moments m;
  if (x.empty()) return m;
  // Sums around the first element keep E[x^2] - E[x]^2 from cancelling when
  // |mean| >> stddev.
  const double shift = x[0];
  detail::MomentSums s;
  switch (level) {
    case SimdLevel::kAvx512:
      s = detail::avx512::moment_sums(x.data(), x.size(), shift);
      break;
    case SimdLevel::kAvx2:
      s = detail::avx2::moment_sums(x.data(), x.size(), shift);
      break;
    default:
      s = detail::scalar::moment_sums(x.data(), x.size(), shift);
      break;
  }
  const double n = static_cast<double>(x.size());
  const double mean_d = s.sum / n;
  double var = s.sum_sq / n - mean_d * mean_d;
  if (var < 0.0) var = 0.0;  // rounding; NaN stays NaN
  m.mean = shift + mean_d;
  m.stddev = std::sqrt(var);
  return m;
}

bool all_finite(std::span<const float> x, SimdLevel level) {
  detail::require_simd_level(level, "all_finite");
  switch (level) {
    case SimdLevel::kAvx512:
      return detail::avx512::all_finite(x.data(), x.size());
    case SimdLevel::kAvx2:
      return detail::avx2::all_finite(x.data(), x.size());
    default:
      return detail::scalar::all_finite(x.data(), x.size());
  }
}

float read_pass(std::span<const float> x, SimdLevel level) {
  detail::require_simd_level(level, "read_pass");
  switch (level) {
    case SimdLevel::kAvx512:
      return detail::avx512::abs_sum(x.data(), x.size());
    case SimdLevel::kAvx2:
      return detail::avx2::abs_sum(x.data(), x.size());
    default:
      return detail::scalar::abs_sum(x.data(), x.size());
  }
}

}  // namespace sparsecomm
