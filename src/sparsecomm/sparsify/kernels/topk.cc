#include "sparsecomm/sparsify/kernels/topk.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"

namespace sparsecomm {
namespace {

// The threshold estimate samples every kSampleStride-th element or more
// sparsely, at most kMaxSample of them; inputs too small for kMinSample
// skip it and take every non-NaN element as a candidate.
constexpr std::size_t kMaxSample = 32768;
constexpr std::size_t kSampleStride = 8;
constexpr std::size_t kMinSample = 1024;

// upper_bits when the sample gives no upper bound: above every magnitude.
constexpr std::uint32_t kNoUpperBound = 0xffffffffu;

// Rank queries on the sample bucket magnitudes by the top 12 of their 31
// bits (the exponent and three mantissa bits).
constexpr int kBucketBits = 12;
constexpr std::size_t kBuckets = std::size_t{1} << kBucketBits;
constexpr int kBucketShift = 31 - kBucketBits;

// The bit pattern of the sample's magnitude at descending rank `rank`
// (1-based, <= sample.size()); sample values are magnitudes, no NaN. One pass
// histograms the buckets, a second collects the bucket holding that rank,
// std::nth_element finishes inside it: O(s), several times faster than
// std::nth_element over the whole sample. `scratch` holds histogram and bucket.
std::uint32_t sample_bits_at_rank(std::span<const float> sample, std::size_t rank,
                                  UninitVector<std::uint32_t>& scratch) {
  scratch.resize(kBuckets + sample.size());
  std::uint32_t* hist = scratch.data();
  std::fill_n(hist, kBuckets, 0u);
  for (float v : sample) ++hist[std::bit_cast<std::uint32_t>(v) >> kBucketShift];
  std::size_t bucket = kBuckets - 1;
  std::size_t higher = 0;  // sample values in the buckets above `bucket`
  while (higher + hist[bucket] < rank) higher += hist[bucket--];
  std::uint32_t* members = hist + kBuckets;
  std::size_t m = 0;
  for (float v : sample) {
    const std::uint32_t key = std::bit_cast<std::uint32_t>(v);
    members[m] = key;
    m += (key >> kBucketShift) == bucket ? 1 : 0;
  }
  std::uint32_t* nth = members + (rank - higher - 1);
  std::nth_element(members, nth, members + m, std::greater<std::uint32_t>());
  return *nth;
}

void check_fits(std::size_t n, Index base) {
  if (static_cast<std::uint64_t>(base) + n > std::numeric_limits<Index>::max()) {
    throw InvalidArgument("[topk] base " + std::to_string(base) + " + size " + std::to_string(n) +
                          " does not fit in a 32-bit index");
  }
}

void append_all(std::span<const float> x, Index base, SparseSelection& out) {
  const std::size_t start = out.indices.size();
  out.indices.resize(start + x.size());
  out.values.resize(start + x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    out.indices[start + i] = base + static_cast<Index>(i);
    out.values[start + i] = x[i];
  }
}

// Fewer than k non-NaN elements: all of them, then the lowest-index NaNs.
void append_with_nans(std::span<const float> x, std::size_t k, std::size_t non_nan, Index base,
                      SparseSelection& out) {
  std::size_t nans_left = k - non_nan;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool nan = std::isnan(x[i]);
    if (!nan || nans_left > 0) {
      out.indices.push_back(base + static_cast<Index>(i));
      out.values.push_back(x[i]);
      nans_left -= nan ? 1 : 0;
    }
  }
}

// Step 4 of TopKSelector::select: appends to `out`, in ascending index,
// every candidate whose magnitude is above `kth` and the lowest-index ones
// equal to it, k in all (`above` of them strictly above). Branch-free, so
// one slot of slack.
void emit_top(const SparseSelection& candidates, std::uint32_t kth, std::size_t above,
              std::size_t k, SparseSelection& out) {
  const std::size_t count = candidates.size();
  const float* val = candidates.values.data();
  std::size_t ties_left = k - above;
  const Index* idx = candidates.indices.data();
  const std::size_t start = out.indices.size();
  out.indices.resize(start + k + 1);
  out.values.resize(start + k + 1);
  Index* out_idx = out.indices.data() + start;
  float* out_val = out.values.data() + start;
  std::size_t kept = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint32_t a = magnitude_bits(val[j]);
    const bool tie = a == kth;
    const bool take = a > kth || (tie && ties_left > 0);
    out_idx[kept] = idx[j];
    out_val[kept] = val[j];
    kept += take ? 1 : 0;
    ties_left -= (tie && take) ? 1 : 0;
  }
  out.indices.resize(start + k);
  out.values.resize(start + k);
}

}  // namespace

void TopKSelector::select(std::span<const float> x, std::size_t k, Index base,
                          SparseSelection& out) {
  last_passes_ = 0;
  const std::size_t n = x.size();
  check_fits(n, base);
  k = std::min(k, n);
  if (k == 0) return;
  if (k == n) {
    append_all(x, base, out);
    return;
  }

  // 1. Bounds on the k-th largest |x| from a strided sample of s elements
  // (magnitudes in sample_, NaN as 0: ranked low). The k-th element sits near
  // sample rank r = k * s / n; ranks r -+ (3 sqrt(r) + 3) bracket it unless
  // the sample is off by more than three standard deviations. The lower
  // bound picks the candidates (about (1 + 3 / sqrt(r)) k of them); the upper
  // one splits off those certainly selected, so the exact selection only
  // sorts out the band between the two.
  float threshold = 0.0f;
  std::uint32_t upper_bits = kNoUpperBound;
  std::size_t rank = 0;  // 1-based rank of `threshold` in the sample; 0: none
  std::size_t sample_size = std::min(kMaxSample, n / kSampleStride);
  if (sample_size < kMinSample) {
    sample_size = 0;
  } else {
    const std::size_t stride = n / sample_size;
    sample_.resize(sample_size);
    for (std::size_t j = 0; j < sample_size; ++j) {
      const float a = std::fabs(x[j * stride + stride / 2]);
      sample_[j] = std::isnan(a) ? 0.0f : a;
    }
    const double r =
        static_cast<double>(k) * static_cast<double>(sample_size) / static_cast<double>(n);
    const double margin = 3.0 * std::sqrt(r) + 3.0;
    rank = std::min(sample_size, static_cast<std::size_t>(std::ceil(r + margin)));
    threshold = std::bit_cast<float>(sample_bits_at_rank(sample_, rank, order_));
    if (r - margin >= 1.0) {
      upper_bits = sample_bits_at_rank(sample_, static_cast<std::size_t>(r - margin), order_);
    }
  }

  // 2. Candidates: every |x| >= threshold. Too few (the sample misled us):
  // lower the bound to a sample rank four times deeper, at least halving it,
  // and down to 0 (every non-NaN element) in the end.
  for (;;) {
    candidates_.clear();
    threshold_select(x, threshold, base, candidates_, level_);
    ++last_passes_;
    if (candidates_.size() >= k) break;
    if (threshold == 0.0f) {
      append_with_nans(x, k, candidates_.size(), base, out);
      return;
    }
    if (rank == 0 || rank >= sample_size) {
      threshold = 0.0f;
      continue;
    }
    rank = std::min(sample_size, rank * 4);
    threshold = std::min(std::bit_cast<float>(sample_bits_at_rank(sample_, rank, order_)),
                         threshold * 0.5f);
    if (!(threshold >= std::numeric_limits<float>::min())) threshold = 0.0f;
  }
  const std::size_t count = candidates_.size();
  if (count == k) {
    out.indices.insert(out.indices.end(), candidates_.indices.begin(), candidates_.indices.end());
    out.values.insert(out.values.end(), candidates_.values.begin(), candidates_.values.end());
    return;
  }

  // 3. The k-th largest magnitude `kth` among the candidates (no NaN there).
  // `above` candidates lie at or above the upper bound; if fewer than k, they
  // are all selected and the rest comes from the band below them, else all k
  // come from above it. order_ holds the magnitudes of the side searched;
  // `above` ends as the number of candidates strictly above kth.
  const float* val = candidates_.values.data();
  order_.resize(count);
  std::uint32_t* keys = order_.data();
  std::size_t above = 0;
  std::size_t band = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint32_t a = magnitude_bits(val[j]);
    keys[band] = a;
    band += a < upper_bits ? 1 : 0;
  }
  above = count - band;
  std::size_t need = k - above;  // rank of kth within the band
  if (above >= k) {
    band = 0;
    for (std::size_t j = 0; j < count; ++j) {
      const std::uint32_t a = magnitude_bits(val[j]);
      keys[band] = a;
      band += a >= upper_bits ? 1 : 0;
    }
    need = k;
    above = 0;
  }
  // need >= 1 here; every key strictly above kth ends before position need - 1.
  const auto kth_it = order_.begin() + static_cast<std::ptrdiff_t>(need - 1);
  std::nth_element(order_.begin(), kth_it, order_.begin() + static_cast<std::ptrdiff_t>(band),
                   std::greater<std::uint32_t>());
  const std::uint32_t kth = *kth_it;
  for (auto it = order_.begin(); it != kth_it; ++it) above += *it > kth ? 1 : 0;

  // 4. Emit, in ascending index: every candidate above kth and the
  // lowest-index ones equal to it.
  emit_top(candidates_, kth, above, k, out);
}

void topk_reference(std::span<const float> x, std::size_t k, Index base, SparseSelection& out) {
  // Rank key: |x|, with NaN below every number.
  auto key = [&](std::size_t i) {
    return std::isnan(x[i]) ? -1.0 : std::fabs(static_cast<double>(x[i]));
  };
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return key(a) > key(b); });
  order.resize(std::min(k, x.size()));
  std::sort(order.begin(), order.end());
  for (std::size_t i : order) {
    out.indices.push_back(base + static_cast<Index>(i));
    out.values.push_back(x[i]);
  }
}

}  // namespace sparsecomm
