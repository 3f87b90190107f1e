// The selection kernels against short reference implementations, on every
// SIMD level this CPU runs. tests/sparsify/kernel_timing.cc prints the throughput
// figures of docs/algorithms.md ("Selection kernels").

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sparsify/kernels/simd.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"
#include "sparsecomm/sparsify/kernels/topk.h"
#include "sparsify/kernel_inputs.h"

namespace sparsecomm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const std::vector<std::size_t> kSizes = {0,    1,    2,    7,    8,    15,     16,  17,
                                         31,   32,   33,   63,   64,   65,     127, 1000,
                                         4095, 4096, 4097, 4113, 9000, 1000000};

std::vector<float> normal_vector(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// Few distinct magnitudes: heavy ties, both signs, signed zeros.
std::vector<float> tied_vector(std::size_t n, std::uint64_t seed) {
  static constexpr float kValues[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.5f};
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  for (float& v : x) v = kValues[rng() % 7];
  return x;
}

void reference_threshold(std::span<const float> x, float threshold, Index base,
                         SparseSelection& out) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) >= threshold) {  // false for NaN
      out.indices.push_back(base + static_cast<Index>(i));
      out.values.push_back(x[i]);
    }
  }
}

std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

// Same indices and bit-identical values (NaN payloads and signed zeros too).
void expect_same(const SparseSelection& got, const SparseSelection& want, const std::string& what) {
  ASSERT_EQ(got.indices.size(), got.values.size()) << what;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got.indices[i], want.indices[i]) << what << " at " << i;
    ASSERT_EQ(bits(got.values[i]), bits(want.values[i])) << what << " at " << i;
  }
}

class KernelTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  SimdLevel level() const { return GetParam(); }
};

std::string level_name(const ::testing::TestParamInfo<SimdLevel>& info) {
  return std::string(simd_level_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllLevels, KernelTest, ::testing::ValuesIn(supported_simd_levels()),
                         level_name);

// ---- SIMD level detection ----

TEST(SimdLevels, DetectedIsSupportedAndNamesRoundTrip) {
  const std::vector<SimdLevel> levels = supported_simd_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), SimdLevel::kScalar);
  EXPECT_TRUE(std::is_sorted(levels.begin(), levels.end()));
  EXPECT_NE(std::find(levels.begin(), levels.end(), detected_simd_level()), levels.end());
  for (SimdLevel l : levels) EXPECT_EQ(parse_simd_level(simd_level_name(l)), l);
  EXPECT_THROW(parse_simd_level("sse9"), InvalidArgument);
  EXPECT_THROW(parse_simd_level(""), InvalidArgument);
  for (SimdLevel l : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (std::find(levels.begin(), levels.end(), l) == levels.end()) {
      EXPECT_THROW(parse_simd_level(simd_level_name(l)), NotSupported);
      const std::vector<float> x(4, 1.0f);
      EXPECT_THROW(read_pass(x, l), NotSupported);
    }
  }
}

// ---- threshold_select / count_at_least ----

TEST_P(KernelTest, ThresholdSelectMatchesReference) {
  for (std::size_t n : kSizes) {
    const std::vector<float> x = normal_vector(n, 11 + n);
    for (float threshold : {0.0f, 0.5f, 1.5f, 2.5f, 3.5f, kInf}) {
      for (Index base : {Index{0}, Index{13}}) {
        const std::string what = "n=" + std::to_string(n) + " thr=" + std::to_string(threshold) +
                                 " base=" + std::to_string(base);
        SparseSelection want;
        reference_threshold(x, threshold, base, want);
        SparseSelection got;
        EXPECT_EQ(threshold_select(x, threshold, base, got, level()), want.size()) << what;
        expect_same(got, want, what);
        EXPECT_EQ(count_at_least(x, threshold, level()), want.size()) << what;
      }
    }
  }
}

// compact_at_least on a candidate list (indices not contiguous, values with
// NaN, infinities and signed zeros) equals selecting from the list directly.
TEST_P(KernelTest, CompactAtLeastKeepsTheSelectedInOrder) {
  for (std::size_t n : kSizes) {
    std::vector<float> x = normal_vector(n, 23 + n);
    for (std::size_t i = 0; i < n; i += 7) x[i] = i % 3 == 0 ? kNaN : (i % 3 == 1 ? -kInf : -0.0f);
    for (float threshold : {0.0f, 0.5f, 1.5f, 3.5f, kInf}) {
      const std::string what = "n=" + std::to_string(n) + " thr=" + std::to_string(threshold);
      SparseSelection list;
      for (std::size_t i = 0; i < n; ++i) {
        list.indices.push_back(static_cast<Index>(3 * i + 1));
        list.values.push_back(x[i]);
      }
      SparseSelection want;
      for (std::size_t i = 0; i < n; ++i) {
        if (std::fabs(x[i]) >= threshold) {
          want.indices.push_back(list.indices[i]);
          want.values.push_back(x[i]);
        }
      }
      EXPECT_EQ(compact_at_least(list, threshold, level()), want.size()) << what;
      expect_same(list, want, what);
    }
  }
  SparseSelection any;
  EXPECT_THROW(compact_at_least(any, kNaN, level()), InvalidArgument);
}

TEST_P(KernelTest, ThresholdSelectEveryDensity) {
  // From nothing to everything selected, across block boundaries.
  const std::vector<float> x = heavy_tailed_vector(50000, 3);
  for (std::size_t rank : {1, 10, 100, 1000, 10000, 49999, 50000}) {
    const float threshold = magnitude_at_rank(x, rank);
    SparseSelection want;
    reference_threshold(x, threshold, 0, want);
    SparseSelection got;
    threshold_select(x, threshold, 0, got, level());
    expect_same(got, want, "rank " + std::to_string(rank));
    EXPECT_GE(got.size(), rank);
  }
}

TEST_P(KernelTest, ThresholdSelectDensityChangesAlongTheVector) {
  // Segments alternate between dense (half selected) and sparse (almost
  // nothing), with lengths that do not align with the kernel's blocks, so
  // the dense and sparse loops take turns within one call.
  std::vector<float> x = normal_vector(300000, 21, 0.1f);
  for (std::size_t seg = 0; seg * 7001 < x.size(); seg += 2) {
    for (std::size_t i = seg * 7001; i < std::min(x.size(), (seg + 1) * 7001); ++i) x[i] *= 100.0f;
  }
  for (float threshold : {0.3f, 5.0f}) {
    SparseSelection want;
    reference_threshold(x, threshold, 9, want);
    SparseSelection got;
    threshold_select(x, threshold, 9, got, level());
    expect_same(got, want, "alternating density, thr=" + std::to_string(threshold));
  }
}

TEST_P(KernelTest, ThresholdSelectAppendsAndReusesCapacity) {
  const std::vector<float> a = normal_vector(10000, 1);
  const std::vector<float> b = normal_vector(777, 2);
  SparseSelection want;
  reference_threshold(a, 1.0f, 0, want);
  reference_threshold(b, 1.0f, 10000, want);
  SparseSelection got;
  threshold_select(a, 1.0f, 0, got, level());
  const std::size_t added = threshold_select(b, 1.0f, 10000, got, level());
  EXPECT_EQ(added, want.size() - count_at_least(a, 1.0f, level()));
  expect_same(got, want, "two appends");
  // A second round into the cleared selection must not allocate.
  const Index* data = got.indices.data();
  got.clear();
  threshold_select(a, 1.0f, 0, got, level());
  EXPECT_EQ(got.indices.data(), data);
}

TEST_P(KernelTest, ThresholdSelectLargeBase) {
  const std::vector<float> x = normal_vector(100, 5);
  const Index base = std::numeric_limits<Index>::max() - 100;
  SparseSelection want;
  reference_threshold(x, 0.7f, base, want);
  SparseSelection got;
  threshold_select(x, 0.7f, base, got, level());
  expect_same(got, want, "large base");
  EXPECT_THROW(threshold_select(x, 0.7f, base + 1, got, level()), InvalidArgument);
}

TEST_P(KernelTest, ThresholdSelectNonFinite) {
  for (std::size_t n : {1, 5, 16, 33, 100, 5000}) {
    std::vector<float> x = normal_vector(n, 7 + n);
    for (std::size_t i = 0; i < n; i += 3) x[i] = kNaN;
    for (std::size_t i = 1; i < n; i += 7) x[i] = (i % 2 == 0) ? kInf : -kInf;
    for (std::size_t i = 2; i < n; i += 11) x[i] = -0.0f;
    x[n - 1] = -kNaN;
    for (float threshold : {0.0f, -0.0f, 1.0f, std::numeric_limits<float>::max(), kInf}) {
      const std::string what = "n=" + std::to_string(n) + " thr=" + std::to_string(threshold);
      SparseSelection want;
      reference_threshold(x, threshold, 0, want);
      SparseSelection got;
      threshold_select(x, threshold, 0, got, level());
      expect_same(got, want, what);
      EXPECT_EQ(count_at_least(x, threshold, level()), want.size()) << what;
      for (float v : got.values) EXPECT_FALSE(std::isnan(v)) << what;
    }
  }
}

TEST_P(KernelTest, ThresholdSelectAllZero) {
  const std::vector<float> x(3000, 0.0f);
  SparseSelection got;
  EXPECT_EQ(threshold_select(x, 0.0f, 0, got, level()), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got.indices[i], i);
  got.clear();
  EXPECT_EQ(threshold_select(x, std::numeric_limits<float>::denorm_min(), 0, got, level()), 0u);
  EXPECT_TRUE(got.empty());
}

TEST_P(KernelTest, ThresholdSelectRejectsBadThreshold) {
  const std::vector<float> x(10, 1.0f);
  SparseSelection out;
  EXPECT_THROW(threshold_select(x, kNaN, 0, out, level()), InvalidArgument);
  EXPECT_THROW(threshold_select(x, -1.0f, 0, out, level()), InvalidArgument);
  EXPECT_THROW(count_at_least(x, kNaN, level()), InvalidArgument);
  EXPECT_THROW(count_at_least(x, -kInf, level()), InvalidArgument);
}

// ---- read_pass, all_finite, moments ----

TEST_P(KernelTest, ReadPassSumsMagnitudes) {
  for (std::size_t n : kSizes) {
    const std::vector<float> x = normal_vector(n, 100 + n);
    double want = 0.0;
    for (float v : x) want += std::fabs(static_cast<double>(v));
    const double got = read_pass(x, level());
    EXPECT_NEAR(got, want, 1e-5 * want + 1e-6) << "n=" << n;
  }
}

TEST_P(KernelTest, AllFinite) {
  for (std::size_t n : kSizes) {
    std::vector<float> x = normal_vector(n, 200 + n, 1e30f);
    EXPECT_TRUE(all_finite(x, level())) << "n=" << n;
    if (n == 0) continue;
    // A single bad element anywhere (every position for short vectors).
    const std::size_t step = n <= 200 ? 1 : n / 97;
    for (float bad : {kNaN, -kNaN, kInf, -kInf}) {
      for (std::size_t i = 0; i < n; i += step) {
        const float keep = x[i];
        x[i] = bad;
        ASSERT_FALSE(all_finite(x, level())) << "n=" << n << " at " << i << " value " << bad;
        x[i] = keep;
      }
      x[n - 1] = bad;
      EXPECT_FALSE(all_finite(x, level()));
      x[n - 1] = 1.0f;
    }
    x[n / 2] = std::numeric_limits<float>::max();
    x[0] = -std::numeric_limits<float>::max();
    EXPECT_TRUE(all_finite(x, level())) << "n=" << n;
  }
}

Moments reference_moments(const std::vector<float>& x) {
  Moments m;
  if (x.empty()) return m;
  long double sum = 0;
  for (float v : x) sum += v;
  const long double mean = sum / static_cast<long double>(x.size());
  long double sq = 0;
  for (float v : x) sq += (v - mean) * (v - mean);
  m.mean = static_cast<double>(mean);
  m.stddev = static_cast<double>(std::sqrt(sq / static_cast<long double>(x.size())));
  return m;
}

TEST_P(KernelTest, MomentsMatchTwoPassReference) {
  for (std::size_t n : kSizes) {
    for (float offset : {0.0f, 1000.0f}) {
      std::vector<float> x = normal_vector(n, 300 + n, 0.01f);
      for (float& v : x) v += offset;
      const Moments want = reference_moments(x);
      const Moments got = moments(x, level());
      const std::string what = "n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      EXPECT_NEAR(got.mean, want.mean, 1e-12 * (std::fabs(want.mean) + 1.0)) << what;
      EXPECT_NEAR(got.stddev, want.stddev, 1e-9 * (want.stddev + 1e-6)) << what;
    }
  }
  const std::vector<float> constant(1001, -3.0f);
  const Moments c = moments(constant, level());
  EXPECT_EQ(c.mean, -3.0);
  EXPECT_EQ(c.stddev, 0.0);
}

TEST_P(KernelTest, MomentsNonFinite) {
  for (float bad : {kNaN, kInf}) {
    for (std::size_t pos : {0, 5, 40}) {
      std::vector<float> x = normal_vector(41, 9);
      x[pos] = bad;
      const Moments m = moments(x, level());
      EXPECT_FALSE(std::isfinite(m.mean) && std::isfinite(m.stddev)) << pos;
    }
  }
}

// ---- sampled_threshold (DGC) ----

float direct_sampled_threshold(const std::vector<float>& x, double density, std::uint64_t start) {
  const std::size_t d = x.size();
  const std::size_t size = std::max(d / 100, std::min<std::size_t>(d, 1000));
  const std::size_t stride = d / size;
  std::vector<float> sample;
  for (std::size_t j = 0; j < size; ++j)
    sample.push_back(std::fabs(x[start % stride + j * stride]));
  std::sort(sample.begin(), sample.end(), std::greater<float>());
  const auto rank = static_cast<std::size_t>(std::ceil(density * static_cast<double>(size)));
  return sample[std::clamp<std::size_t>(rank, 1, size) - 1];
}

TEST(SampledThreshold, MatchesDirectComputation) {
  UninitVector<float> scratch;
  EXPECT_EQ(sampled_threshold({}, 0.01, 0, scratch), kInf);
  for (std::size_t d : {1, 2, 999, 1000, 1001, 5000, 99999, 100000, 123457, 1000000}) {
    const std::vector<float> x = heavy_tailed_vector(d, d);
    for (double density : {1e-6, 0.001, 0.01, 0.1, 0.5, 1.0}) {
      for (std::uint64_t start : {0ull, 1ull, 12345ull, 0xffffffffffffull}) {
        EXPECT_EQ(sampled_threshold(x, density, start, scratch),
                  direct_sampled_threshold(x, density, start))
            << "d=" << d << " c=" << density << " start=" << start;
      }
    }
  }
}

TEST(SampledThreshold, SampleSizeAndStride) {
  // d = 250000: 2500 samples at stride 100; only the sampled positions are
  // large, so the threshold at rank 1 reveals where the sample starts.
  std::vector<float> x(250000, 0.0f);
  for (std::size_t j = 0; j < 2500; ++j) x[37 + j * 100] = static_cast<float>(j + 1);
  UninitVector<float> scratch;
  EXPECT_EQ(sampled_threshold(x, 1e-6, 137, scratch), 2500.0f);
  EXPECT_EQ(sampled_threshold(x, 0.5, 37, scratch), 1251.0f);
  EXPECT_EQ(sampled_threshold(x, 1.0, 37, scratch), 1.0f);
  EXPECT_EQ(sampled_threshold(x, 1.0, 38, scratch), 0.0f);
}

// ---- TopKSelector ----

std::vector<std::size_t> k_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> ks = {0, 1, 2, n / 1000, n / 100, n / 10, n / 2, n - 1, n, n + 5};
  for (int i = 0; i < 3; ++i) ks.push_back(n == 0 ? 0 : rng() % n);
  return ks;
}

void check_topk(TopKSelector& selector, const std::vector<float>& x, std::size_t k, Index base,
                const std::string& what) {
  SparseSelection want;
  topk_reference(x, k, base, want);
  SparseSelection got;
  got.indices.push_back(7);  // select appends
  got.values.push_back(-1.0f);
  selector.select(x, k, base, got);
  ASSERT_EQ(got.size(), want.size() + 1) << what;
  EXPECT_EQ(got.indices[0], 7u);
  got.indices.erase(got.indices.begin());
  got.values.erase(got.values.begin());
  expect_same(got, want, what);
}

TEST_P(KernelTest, TopKMatchesReference) {
  TopKSelector selector(level());  // one selector for all: no stale state
  // Up to 8191 elements every one is a candidate; from 8192 on the sample
  // picks them.
  for (std::size_t n : {0, 1, 2, 31, 32, 33, 1000, 4097, 8191, 8192, 20000, 140000}) {
    for (int kind = 0; kind < 3; ++kind) {
      const std::vector<float> x = kind == 0   ? normal_vector(n, n + 1)
                                   : kind == 1 ? heavy_tailed_vector(n, n + 2)
                                               : tied_vector(n, n + 3);
      for (std::size_t k : k_values(n, n + 4)) {
        check_topk(
            selector, x, k, 3,
            "n=" + std::to_string(n) + " kind=" + std::to_string(kind) + " k=" + std::to_string(k));
      }
    }
  }
}

TEST_P(KernelTest, TopKLargeSampledPath) {
  TopKSelector selector(level());
  const std::vector<float> x = heavy_tailed_vector(1000000, 77);
  for (std::size_t k : {1, 1000, 10000}) {
    check_topk(selector, x, k, 0, "k=" + std::to_string(k));
    EXPECT_EQ(selector.last_passes(), 1) << k;
  }
  const std::vector<float> ties = tied_vector(300000, 78);
  for (std::size_t k : {1, 300, 3000, 100000}) check_topk(selector, ties, k, 0, "ties");
  const std::vector<float> zeros(300000, 0.0f);
  for (std::size_t k : {1, 150000}) check_topk(selector, zeros, k, 5, "zeros");
}

TEST_P(KernelTest, TopKTiesAtTheUpperBound) {
  // 30000 elements of 10 among small values: the sample's upper bound lands
  // on 10, so exactly k (or k -+ 1) candidates lie at or above it.
  const std::size_t n = 200000;
  std::vector<float> x = normal_vector(n, 8, 0.1f);
  std::mt19937_64 rng(9);
  std::size_t placed = 0;
  while (placed < 30000) {
    float& v = x[rng() % n];
    if (std::fabs(v) != 10.0f) {
      v = (placed % 2 == 0) ? 10.0f : -10.0f;
      ++placed;
    }
  }
  TopKSelector selector(level());
  for (std::size_t k : {29999, 30000, 30001, 20000, 40000}) {
    check_topk(selector, x, k, 0, "ties at the bound, k=" + std::to_string(k));
  }
}

TEST_P(KernelTest, TopKRetriesWhenTheSampleMisleads) {
  // Large values at every fourth position, small ones elsewhere. n is a power
  // of two, so the selector's strided sample (stride >= 8, a power of two
  // here, offset stride / 2) sees only large values: the first bound is far
  // too high for k > n / 4.
  const std::size_t n = std::size_t{1} << 19;
  std::vector<float> x = normal_vector(n, 5, 0.1f);
  for (std::size_t i = 0; i < n; i += 4) x[i] = 100.0f + static_cast<float>(i % 7);
  TopKSelector selector(level());
  check_topk(selector, x, 200000, 0, "misleading sample");
  EXPECT_GT(selector.last_passes(), 1);
  check_topk(selector, x, 10, 0, "misleading sample, small k");
  EXPECT_EQ(selector.last_passes(), 1);
}

TEST_P(KernelTest, TopKNonFinite) {
  TopKSelector selector(level());
  for (std::size_t n : {10, 100, 300000}) {
    std::vector<float> x = heavy_tailed_vector(n, n);
    for (std::size_t i = 0; i < n; i += 4) x[i] = kNaN;
    x[1] = kInf;
    x[n - 1] = -kInf;
    for (std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{3}, n / 2, n * 3 / 4,
                          n * 3 / 4 + 1, n - 1, n}) {
      check_topk(selector, x, k, 0, "n=" + std::to_string(n) + " k=" + std::to_string(k));
    }
  }
  const std::vector<float> all_nan(50, kNaN);
  check_topk(selector, all_nan, 7, 0, "all NaN");
}

TEST(TopKSelector, RejectsIndexOverflow) {
  TopKSelector selector;
  const std::vector<float> x(10, 1.0f);
  SparseSelection out;
  EXPECT_THROW(selector.select(x, 3, std::numeric_limits<Index>::max() - 5, out), InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm
