// AVX-512 (F, BW, VL, DQ) kernels. Compiled with AVX-512 flags; reached only
// through the dispatchers after a CPU check. Only file-local templates here
// (see simd_impl.h).

// GCC 12's AVX-512 headers build their "undefined" vectors by self-
// initialization, which -Wuninitialized flags inside the intrinsics we call.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "sparsecomm/sparsify/kernels/simd_impl.h"

namespace sparsecomm::detail::avx512 {
namespace {

constexpr std::size_t kLanes = 16;
// Every loop below handles rounds of four vectors (four cache lines).
constexpr std::size_t kRound = 4 * kLanes;
// Software prefetch distance in floats (32 KiB). Streaming reads reach ~10%
// more bandwidth with it than with the hardware prefetchers alone.
constexpr std::size_t kAhead = 8192;

__mmask16 live_mask(std::size_t remaining) {
  return remaining >= kLanes ? static_cast<__mmask16>(0xffff)
                             : static_cast<__mmask16>((1u << remaining) - 1u);
}

__m512 abs_ps(__m512 v) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

unsigned popcount16(__mmask16 m) { return static_cast<unsigned>(_mm_popcnt_u32(m)); }

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

// Selected lanes of (v, idx) packed to the front of registers, then written
// with full stores: Zen 4 runs vcompressps to memory very slowly.
__attribute__((always_inline)) inline void emit(__mmask16 m, __m512 v, __m512i idx, Index* indices,
                                                float* values, std::size_t& count) {
  _mm512_storeu_ps(values + count, _mm512_maskz_compress_ps(m, v));
  _mm512_storeu_si512(indices + count, _mm512_maskz_compress_epi32(m, idx));
  count += popcount16(m);
}

// Tags picking the select loop at compile time.
struct DenseLoop {
  static constexpr bool kDense = true;
};
struct SparseLoop {
  static constexpr bool kDense = false;
};

}  // namespace

std::size_t select(const float* x, std::size_t n, std::size_t readable, bool dense, float threshold,
                   Index base, Index* indices, float* values) {
  const __m512 thr = _mm512_set1_ps(threshold);
  const __m512i step = _mm512_set1_epi32(static_cast<int>(kLanes));
  __m512i idx =
      _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                       _mm512_set1_epi32(static_cast<int>(base)));
  std::size_t count = 0;
  std::size_t i = 0;
  // Sparse: a round without a hit (most rounds at low density) costs one
  // well-predicted branch. Dense: no branch, always compress and store.
  auto round = [&](std::size_t at, auto mode) {
    const __m512 v0 = _mm512_loadu_ps(x + at);
    const __m512 v1 = _mm512_loadu_ps(x + at + kLanes);
    const __m512 v2 = _mm512_loadu_ps(x + at + 2 * kLanes);
    const __m512 v3 = _mm512_loadu_ps(x + at + 3 * kLanes);
    const __mmask16 m0 = _mm512_cmp_ps_mask(abs_ps(v0), thr, _CMP_GE_OQ);
    const __mmask16 m1 = _mm512_cmp_ps_mask(abs_ps(v1), thr, _CMP_GE_OQ);
    const __mmask16 m2 = _mm512_cmp_ps_mask(abs_ps(v2), thr, _CMP_GE_OQ);
    const __mmask16 m3 = _mm512_cmp_ps_mask(abs_ps(v3), thr, _CMP_GE_OQ);
    if (decltype(mode)::kDense || (m0 | m1 | m2 | m3) != 0) {
      const __m512i idx1 = _mm512_add_epi32(idx, step);
      const __m512i idx2 = _mm512_add_epi32(idx1, step);
      const __m512i idx3 = _mm512_add_epi32(idx2, step);
      emit(m0, v0, idx, indices, values, count);
      emit(m1, v1, idx1, indices, values, count);
      emit(m2, v2, idx2, indices, values, count);
      emit(m3, v3, idx3, indices, values, count);
    }
    idx = _mm512_add_epi32(idx, _mm512_set1_epi32(static_cast<int>(kRound)));
  };
  if (dense) {
    for_rounds(x, i, n, readable, [&](std::size_t at) { round(at, DenseLoop{}); });
  } else {
    for_rounds(x, i, n, readable, [&](std::size_t at) { round(at, SparseLoop{}); });
  }
  for (; i < n; i += kLanes) {
    const __mmask16 live = live_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + i);
    emit(_mm512_mask_cmp_ps_mask(live, abs_ps(v), thr, _CMP_GE_OQ), v, idx, indices, values, count);
    idx = _mm512_add_epi32(idx, step);
  }
  return count;
}

std::size_t compact(Index* indices, float* values, std::size_t n, float threshold) {
  const __m512 thr = _mm512_set1_ps(threshold);
  std::size_t kept = 0;
  std::size_t i = 0;
  // The full stores write [kept, kept + 16) with kept <= i: inside what this
  // or an earlier vector already read.
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 v = _mm512_loadu_ps(values + i);
    const __m512i idx = _mm512_loadu_si512(indices + i);
    emit(_mm512_cmp_ps_mask(abs_ps(v), thr, _CMP_GE_OQ), v, idx, indices, values, kept);
  }
  for (; i < n; ++i) {
    const float v = values[i];
    const Index index = indices[i];
    indices[kept] = index;
    values[kept] = v;
    kept += (v < 0.0f ? -v : v) >= threshold ? 1u : 0u;
  }
  return kept;
}

std::size_t count_at_least(const float* x, std::size_t n, float threshold) {
  const __m512 thr = _mm512_set1_ps(threshold);
  // Per-lane counters: subtracting an all-ones (-1) lane adds one. Flushed
  // every 2^30 elements, long before a 32-bit lane could overflow.
  const __m512i minus_one = _mm512_set1_epi32(-1);
  std::size_t total = 0;
  std::size_t i = 0;
  while (i + kRound <= n) {
    const std::size_t chunk_end = n - i > (std::size_t{1} << 30) ? i + (std::size_t{1} << 30) : n;
    __m512i c0 = _mm512_setzero_si512();
    __m512i c1 = _mm512_setzero_si512();
    for_rounds(x, i, chunk_end, n, [&](std::size_t at) {
      for (std::size_t j = 0; j < kRound; j += 2 * kLanes) {
        const __m512 a0 = abs_ps(_mm512_loadu_ps(x + at + j));
        const __m512 a1 = abs_ps(_mm512_loadu_ps(x + at + j + kLanes));
        c0 = _mm512_mask_sub_epi32(c0, _mm512_cmp_ps_mask(a0, thr, _CMP_GE_OQ), c0, minus_one);
        c1 = _mm512_mask_sub_epi32(c1, _mm512_cmp_ps_mask(a1, thr, _CMP_GE_OQ), c1, minus_one);
      }
    });
    total += static_cast<std::uint32_t>(_mm512_reduce_add_epi32(_mm512_add_epi32(c0, c1)));
  }
  for (; i < n; i += kLanes) {
    const __mmask16 live = live_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + i);
    total += popcount16(_mm512_mask_cmp_ps_mask(live, abs_ps(v), thr, _CMP_GE_OQ));
  }
  return total;
}

float abs_sum(const float* x, std::size_t n) {
  __m512 a0 = _mm512_setzero_ps();
  __m512 a1 = _mm512_setzero_ps();
  __m512 a2 = _mm512_setzero_ps();
  __m512 a3 = _mm512_setzero_ps();
  std::size_t i = 0;
  for_rounds(x, i, n, n, [&](std::size_t at) {
    a0 = _mm512_add_ps(a0, abs_ps(_mm512_loadu_ps(x + at)));
    a1 = _mm512_add_ps(a1, abs_ps(_mm512_loadu_ps(x + at + kLanes)));
    a2 = _mm512_add_ps(a2, abs_ps(_mm512_loadu_ps(x + at + 2 * kLanes)));
    a3 = _mm512_add_ps(a3, abs_ps(_mm512_loadu_ps(x + at + 3 * kLanes)));
  });
  for (; i < n; i += kLanes)
    a0 = _mm512_add_ps(a0, abs_ps(_mm512_maskz_loadu_ps(live_mask(n - i), x + i)));
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

bool all_finite(const float* x, std::size_t n) {
  // The largest |x| bit pattern seen; above the largest finite float's means
  // an infinity or a NaN.
  const __m512i abs_bits = _mm512_set1_epi32(0x7fffffff);
  __m512i m0 = _mm512_setzero_si512();
  __m512i m1 = _mm512_setzero_si512();
  std::size_t i = 0;
  for_rounds(x, i, n, n, [&](std::size_t at) {
    for (std::size_t j = 0; j < kRound; j += 2 * kLanes) {
      m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + at + j), abs_bits));
      m1 =
          _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(x + at + j + kLanes), abs_bits));
    }
  });
  for (; i < n; i += kLanes) {
    m0 = _mm512_max_epu32(
        m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(live_mask(n - i), x + i), abs_bits));
  }
  return _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1)) <= 0x7f7fffffu;
}

MomentSums moment_sums(const float* x, std::size_t n, double shift) {
  const __m512d s = _mm512_set1_pd(shift);
  // Four chains each of sums and squares: the adds' latency, not the
  // bandwidth, would limit fewer.
  __m512d sum[4];
  __m512d sq[4];
  for (int a = 0; a < 4; ++a) {
    sum[a] = _mm512_setzero_pd();
    sq[a] = _mm512_setzero_pd();
  }
  std::size_t i = 0;
  for_rounds(x, i, n, n, [&](std::size_t at) {
    for (std::size_t j = 0; j < kRound / 8; ++j) {
      const __m512d d = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + at + 8 * j)), s);
      sum[j % 4] = _mm512_add_pd(sum[j % 4], d);
      sq[j % 4] = _mm512_fmadd_pd(d, d, sq[j % 4]);
    }
  });
  for (; i < n; i += 8) {
    const std::size_t left = n - i;
    const __mmask8 live = static_cast<__mmask8>(left >= 8 ? 0xffu : (1u << left) - 1u);
    const __m512d d =
        _mm512_maskz_sub_pd(live, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(live, x + i)), s);
    sum[0] = _mm512_add_pd(sum[0], d);
    sq[0] = _mm512_fmadd_pd(d, d, sq[0]);
  }
  MomentSums r;
  r.sum = _mm512_reduce_add_pd(
      _mm512_add_pd(_mm512_add_pd(sum[0], sum[1]), _mm512_add_pd(sum[2], sum[3])));
  r.sum_sq =
      _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(sq[0], sq[1]), _mm512_add_pd(sq[2], sq[3])));
  return r;
}

}  // namespace sparsecomm::detail::avx512
