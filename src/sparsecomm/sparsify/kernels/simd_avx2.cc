// AVX2 + FMA kernels. Compiled with AVX2 flags; reached only through the
// dispatchers after a CPU check. Only file-local templates here (see
// simd_impl.h).

#include <immintrin.h>

#include <cstdint>

#include "sparsecomm/sparsify/kernels/simd_impl.h"

namespace sparsecomm::detail::avx2 {
namespace {

constexpr std::size_t kLanes = 8;
// Every loop below handles rounds of eight vectors (four cache lines).
constexpr std::size_t kRound = 8 * kLanes;
// Software prefetch distance in floats (32 KiB); see simd_avx512.cc.
constexpr std::size_t kAhead = 8192;

// For each 8-bit compare mask, the lanes whose bit is set, in order, one byte
// each (the rest 0): the vpermps indices that pack the selected lanes to the
// front. 2 KiB.
struct CompactTable {
  std::uint64_t lanes[256];
};

constexpr CompactTable make_compact_table() {
  CompactTable t{};
  for (unsigned mask = 0; mask < 256; ++mask) {
    std::uint64_t packed = 0;
    unsigned out = 0;
    for (unsigned lane = 0; lane < 8; ++lane) {
      if ((mask >> lane) & 1u) {
        packed |= static_cast<std::uint64_t>(lane) << (8 * out);
        ++out;
      }
    }
    t.lanes[mask] = packed;
  }
  return t;
}

constexpr CompactTable kCompact = make_compact_table();

__m256 abs_ps(__m256 v) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
}

unsigned compare_mask(__m256 v, __m256 thr) {
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(abs_ps(v), thr, _CMP_GE_OQ)));
}

float abs_scalar(float v) { return v < 0.0f ? -v : v; }

// Calls round(i) for i = i0, i0 + kRound, ... while the round fits below
// `end`, prefetching kAhead floats ahead while that stays inside
// x[0, readable). Leaves i at the first element not handled.
template <class Round>
__attribute__((always_inline)) inline void for_rounds(const float* x, std::size_t& i,
                                                      std::size_t end, std::size_t readable,
                                                      Round&& round) {
  const std::size_t prefetch_end = readable >= kAhead + kRound ? readable - kAhead - kRound + 1 : 0;
  for (; i + kRound <= end && i < prefetch_end; i += kRound) {
    const char* ahead = reinterpret_cast<const char*>(x + i + kAhead);
    _mm_prefetch(ahead, _MM_HINT_T0);
    _mm_prefetch(ahead + 64, _MM_HINT_T0);
    _mm_prefetch(ahead + 128, _MM_HINT_T0);
    _mm_prefetch(ahead + 192, _MM_HINT_T0);
    round(i);
  }
  for (; i + kRound <= end; i += kRound) round(i);
}

// Packs the selected lanes of (v, idx) to the front with one table lookup and
// two permutes, then writes full vectors (the slack absorbs the rest).
__attribute__((always_inline)) inline void emit(unsigned mask, __m256 v, __m256i idx,
                                                Index* indices, float* values, std::size_t& count) {
  const __m256i perm =
      _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kCompact.lanes[mask])));
  _mm256_storeu_ps(values + count, _mm256_permutevar8x32_ps(v, perm));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices + count),
                      _mm256_permutevar8x32_epi32(idx, perm));
  count += static_cast<unsigned>(_mm_popcnt_u32(mask));
}

// Tags picking the select loop at compile time.
struct DenseLoop {
  static constexpr bool kDense = true;
};
struct SparseLoop {
  static constexpr bool kDense = false;
};

}  // namespace

std::size_t compact(Index* indices, float* values, std::size_t n, float threshold) {
  const __m256 thr = _mm256_set1_ps(threshold);
  std::size_t kept = 0;
  std::size_t i = 0;
  // The full stores write [kept, kept + 8) with kept <= i: inside what this
  // or an earlier vector already read.
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 v = _mm256_loadu_ps(values + i);
    const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(indices + i));
    emit(compare_mask(v, thr), v, idx, indices, values, kept);
  }
  for (; i < n; ++i) {
    const float v = values[i];
    const Index index = indices[i];
    indices[kept] = index;
    values[kept] = v;
    kept += abs_scalar(v) >= threshold ? 1u : 0u;
  }
  return kept;
}

std::size_t select(const float* x, std::size_t n, std::size_t readable, bool dense, float threshold,
                   Index base, Index* indices, float* values) {
  const __m256 thr = _mm256_set1_ps(threshold);
  const __m256i step = _mm256_set1_epi32(static_cast<int>(kLanes));
  __m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                 _mm256_set1_epi32(static_cast<int>(base)));
  std::size_t count = 0;
  std::size_t i = 0;
  // Per half round (four vectors): sparse skips a half without a hit behind
  // one well-predicted branch; dense never branches.
  auto half = [&](const float* p, auto mode) {
    const __m256 v0 = _mm256_loadu_ps(p);
    const __m256 v1 = _mm256_loadu_ps(p + kLanes);
    const __m256 v2 = _mm256_loadu_ps(p + 2 * kLanes);
    const __m256 v3 = _mm256_loadu_ps(p + 3 * kLanes);
    const unsigned m0 = compare_mask(v0, thr);
    const unsigned m1 = compare_mask(v1, thr);
    const unsigned m2 = compare_mask(v2, thr);
    const unsigned m3 = compare_mask(v3, thr);
    if (decltype(mode)::kDense || (m0 | m1 | m2 | m3) != 0) {
      const __m256i idx1 = _mm256_add_epi32(idx, step);
      const __m256i idx2 = _mm256_add_epi32(idx1, step);
      const __m256i idx3 = _mm256_add_epi32(idx2, step);
      emit(m0, v0, idx, indices, values, count);
      emit(m1, v1, idx1, indices, values, count);
      emit(m2, v2, idx2, indices, values, count);
      emit(m3, v3, idx3, indices, values, count);
    }
    idx = _mm256_add_epi32(idx, _mm256_set1_epi32(static_cast<int>(4 * kLanes)));
  };
  if (dense) {
    for_rounds(x, i, n, readable, [&](std::size_t at) {
      half(x + at, DenseLoop{});
      half(x + at + 4 * kLanes, DenseLoop{});
    });
  } else {
    for_rounds(x, i, n, readable, [&](std::size_t at) {
      half(x + at, SparseLoop{});
      half(x + at + 4 * kLanes, SparseLoop{});
    });
  }
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 v = _mm256_loadu_ps(x + i);
    emit(compare_mask(v, thr), v, idx, indices, values, count);
    idx = _mm256_add_epi32(idx, step);
  }
  for (; i < n; ++i) {
    indices[count] = base + static_cast<Index>(i);
    values[count] = x[i];
    count += abs_scalar(x[i]) >= threshold ? 1u : 0u;
  }
  return count;
}

std::size_t count_at_least(const float* x, std::size_t n, float threshold) {
  const __m256 thr = _mm256_set1_ps(threshold);
  // Per-lane counters: a true compare lane is -1, so subtracting it adds one.
  // Flushed every 2^30 elements, long before a lane could overflow.
  std::size_t total = 0;
  std::size_t i = 0;
  while (i + kRound <= n) {
    const std::size_t chunk_end = n - i > (std::size_t{1} << 30) ? i + (std::size_t{1} << 30) : n;
    __m256i c0 = _mm256_setzero_si256();
    __m256i c1 = _mm256_setzero_si256();
    for_rounds(x, i, chunk_end, n, [&](std::size_t at) {
      for (std::size_t j = 0; j < kRound; j += 2 * kLanes) {
        const __m256 a0 = abs_ps(_mm256_loadu_ps(x + at + j));
        const __m256 a1 = abs_ps(_mm256_loadu_ps(x + at + j + kLanes));
        c0 = _mm256_sub_epi32(c0, _mm256_castps_si256(_mm256_cmp_ps(a0, thr, _CMP_GE_OQ)));
        c1 = _mm256_sub_epi32(c1, _mm256_castps_si256(_mm256_cmp_ps(a1, thr, _CMP_GE_OQ)));
      }
    });
    alignas(32) std::uint32_t lanes[kLanes];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi32(c0, c1));
    for (std::size_t l = 0; l < kLanes; ++l) total += lanes[l];
  }
  for (; i < n; ++i) total += abs_scalar(x[i]) >= threshold ? 1u : 0u;
  return total;
}

float abs_sum(const float* x, std::size_t n) {
  __m256 acc[4];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  std::size_t i = 0;
  for_rounds(x, i, n, n, [&](std::size_t at) {
    for (std::size_t j = 0; j < kRound / kLanes; ++j) {
      acc[j % 4] = _mm256_add_ps(acc[j % 4], abs_ps(_mm256_loadu_ps(x + at + j * kLanes)));
    }
  });
  for (; i + kLanes <= n; i += kLanes)
    acc[0] = _mm256_add_ps(acc[0], abs_ps(_mm256_loadu_ps(x + i)));
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes,
                  _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  float total = 0.0f;
  for (std::size_t l = 0; l < kLanes; ++l) total += lanes[l];
  for (; i < n; ++i) total += abs_scalar(x[i]);
  return total;
}

bool all_finite(const float* x, std::size_t n) {
  // The largest |x| bit pattern seen; above the largest finite float's means
  // an infinity or a NaN.
  const __m256i abs_bits = _mm256_set1_epi32(0x7fffffff);
  __m256i m0 = _mm256_setzero_si256();
  __m256i m1 = _mm256_setzero_si256();
  std::size_t i = 0;
  for_rounds(x, i, n, n, [&](std::size_t at) {
    for (std::size_t j = 0; j < kRound; j += 2 * kLanes) {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + at + j));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + at + j + kLanes));
      m0 = _mm256_max_epu32(m0, _mm256_and_si256(b0, abs_bits));
      m1 = _mm256_max_epu32(m1, _mm256_and_si256(b1, abs_bits));
    }
  });
  // The masked patterns are below 2^31, so the signed compare is exact.
  const __m256i m = _mm256_max_epu32(m0, m1);
  bool finite = _mm256_movemask_epi8(_mm256_cmpgt_epi32(m, _mm256_set1_epi32(0x7f7fffff))) == 0;
  for (; i < n; ++i) finite = finite && (x[i] - x[i]) == 0.0f;
  return finite;
}

MomentSums moment_sums(const float* x, std::size_t n, double shift) {
  const __m256d s = _mm256_set1_pd(shift);
  // Four chains each of sums and squares: the adds' latency, not the
  // bandwidth, would limit fewer.
  __m256d sum[4];
  __m256d sq[4];
  for (int a = 0; a < 4; ++a) {
    sum[a] = _mm256_setzero_pd();
    sq[a] = _mm256_setzero_pd();
  }
  std::size_t i = 0;
  for_rounds(x, i, n, n, [&](std::size_t at) {
    for (std::size_t j = 0; j < kRound / 4; ++j) {
      const __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + at + 4 * j)), s);
      sum[j % 4] = _mm256_add_pd(sum[j % 4], d);
      sq[j % 4] = _mm256_fmadd_pd(d, d, sq[j % 4]);
    }
  });
  alignas(32) double sums[4];
  alignas(32) double sqs[4];
  _mm256_store_pd(sums,
                  _mm256_add_pd(_mm256_add_pd(sum[0], sum[1]), _mm256_add_pd(sum[2], sum[3])));
  _mm256_store_pd(sqs, _mm256_add_pd(_mm256_add_pd(sq[0], sq[1]), _mm256_add_pd(sq[2], sq[3])));
  MomentSums r;
  for (int l = 0; l < 4; ++l) {
    r.sum += sums[l];
    r.sum_sq += sqs[l];
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - shift;
    r.sum += d;
    r.sum_sq += d * d;
  }
  return r;
}

}  // namespace sparsecomm::detail::avx2
