#include "sparsecomm/optim/newton_schulz.h"

#include <cmath>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

namespace {

constexpr float kA = 3.4445f;
constexpr float kB = -4.7750f;
constexpr float kC = 2.0315f;

// out (m x n) = left (m x k) * right (k x n), row-major, as rows of axpys:
// out_i = sum_t left[i][t] * right_t, summed in the order of t, so that
// vectorizing over a row's n elements changes no element's rounding. This
// file is compiled without contraction into fused multiply-adds
// (-ffp-contract=off), so that every instruction set gives the same bits.
[[gnu::always_inline]] inline void multiply_body(const float* left, const float* right, float* out,
                                                 std::size_t m, std::size_t k, std::size_t n) {
  for (std::size_t i = 0; i < m; ++i) {
    float* row = out + i * n;
    for (std::size_t j = 0; j < n; ++j) row[j] = 0.0f;
    for (std::size_t t = 0; t < k; ++t) {
      const float scale = left[i * k + t];
      const float* from = right + t * n;
      for (std::size_t j = 0; j < n; ++j) row[j] += scale * from[j];
    }
  }
}

// out (m x m) = left (m x k) * right (k x m) where the product is known to
// be symmetric (X X^T, or A A for a symmetric A): only the upper triangle
// is summed, each row as in multiply_body(), and mirrored. out[j][i] would
// sum the same products in the same order (the factors swapped, which IEEE
// multiplication does not see), so the mirror is exactly what the full
// product gives, at about half its work.
[[gnu::always_inline]] inline void multiply_symmetric_body(const float* left, const float* right,
                                                           float* out, std::size_t m,
                                                           std::size_t k) {
  for (std::size_t i = 0; i < m; ++i) {
    float* row = out + i * m;
    for (std::size_t j = i; j < m; ++j) row[j] = 0.0f;
    for (std::size_t t = 0; t < k; ++t) {
      const float scale = left[i * k + t];
      const float* from = right + t * m;
      for (std::size_t j = i; j < m; ++j) row[j] += scale * from[j];
    }
  }
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < i; ++j) out[i * m + j] = out[j * m + i];
  }
}

// The bodies compiled for AVX-512, AVX2 and the baseline, picked once by
// what the CPU supports. Plain function pointers rather than target_clones:
// the latter's ifunc resolvers run while the dynamic loader relocates,
// before a sanitizer's runtime is up, and crash instrumented test binaries.
struct Kernels {
  void (*multiply)(const float*, const float*, float*, std::size_t, std::size_t, std::size_t);
  void (*multiply_symmetric)(const float*, const float*, float*, std::size_t, std::size_t);
};

[[gnu::target("avx512f")]] void multiply_avx512(const float* l, const float* r, float* o,
                                                std::size_t m, std::size_t k, std::size_t n) {
  multiply_body(l, r, o, m, k, n);
}
[[gnu::target("avx512f")]] void multiply_symmetric_avx512(const float* l, const float* r, float* o,
                                                          std::size_t m, std::size_t k) {
  multiply_symmetric_body(l, r, o, m, k);
}
[[gnu::target("avx2")]] void multiply_avx2(const float* l, const float* r, float* o, std::size_t m,
                                           std::size_t k, std::size_t n) {
  multiply_body(l, r, o, m, k, n);
}
[[gnu::target("avx2")]] void multiply_symmetric_avx2(const float* l, const float* r, float* o,
                                                     std::size_t m, std::size_t k) {
  multiply_symmetric_body(l, r, o, m, k);
}
void multiply_generic(const float* l, const float* r, float* o, std::size_t m, std::size_t k,
                      std::size_t n) {
  multiply_body(l, r, o, m, k, n);
}
void multiply_symmetric_generic(const float* l, const float* r, float* o, std::size_t m,
                                std::size_t k) {
  multiply_symmetric_body(l, r, o, m, k);
}

const Kernels& kernels() {
  static const Kernels chosen = [] {
    if (__builtin_cpu_supports("avx512f")) {
      return Kernels{multiply_avx512, multiply_symmetric_avx512};
    }
    if (__builtin_cpu_supports("avx2")) return Kernels{multiply_avx2, multiply_symmetric_avx2};
    return Kernels{multiply_generic, multiply_symmetric_generic};
  }();
  return chosen;
}

void multiply(const float* left, const float* right, float* out, std::size_t m, std::size_t k,
              std::size_t n) {
  kernels().multiply(left, right, out, m, k, n);
}

void multiply_symmetric(const float* left, const float* right, float* out, std::size_t m,
                        std::size_t k) {
  kernels().multiply_symmetric(left, right, out, m, k);
}

void transpose(const float* in, float* out, std::size_t rows, std::size_t cols) {
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * cols + j];
  }
}

}  // namespace

void newton_schulz(std::span<float> matrix, std::size_t rows, std::size_t cols, int steps,
                   NewtonSchulzScratch& scratch) {
  if (rows * cols != matrix.size() || rows == 0 || cols == 0) {
    throw InvalidArgument(fmt::format("[newton_schulz] a {} x {} matrix cannot hold {} elements",
                                      rows, cols, matrix.size()));
  }
  if (steps < 1) {
    throw InvalidArgument(fmt::format("[newton_schulz] {} iterations: need at least 1", steps));
  }
  // Work on the wide orientation r x c with r <= c.
  const bool tall = rows > cols;
  const std::size_t r = tall ? cols : rows;
  const std::size_t c = tall ? rows : cols;
  scratch.x.resize(r * c);
  scratch.xt.resize(r * c);
  scratch.gram.resize(r * r);
  scratch.gram2.resize(r * r);
  scratch.next.resize(r * c);
  float* x = scratch.x.data();
  if (tall) {
    transpose(matrix.data(), x, rows, cols);
  } else {
    for (std::size_t i = 0; i < matrix.size(); ++i) x[i] = matrix[i];
  }
  double squares = 0.0;
  for (std::size_t i = 0; i < r * c; ++i) squares += static_cast<double>(x[i]) * x[i];
  const auto inverse_norm = static_cast<float>(1.0 / (std::sqrt(squares) + 1e-7));
  for (std::size_t i = 0; i < r * c; ++i) x[i] *= inverse_norm;

  float* xt = scratch.xt.data();
  float* gram = scratch.gram.data();
  float* gram2 = scratch.gram2.data();
  float* next = scratch.next.data();
  for (int step = 0; step < steps; ++step) {
    transpose(x, xt, r, c);
    multiply_symmetric(x, xt, gram, r, c);        // A = X X^T
    multiply_symmetric(gram, gram, gram2, r, r);  // A A
    for (std::size_t i = 0; i < r * r; ++i) gram2[i] = kB * gram[i] + kC * gram2[i];
    multiply(gram2, x, next, r, r, c);  // (b A + c A A) X
    for (std::size_t i = 0; i < r * c; ++i) x[i] = kA * x[i] + next[i];
  }
  if (tall) {
    transpose(x, matrix.data(), r, c);
  } else {
    for (std::size_t i = 0; i < matrix.size(); ++i) matrix[i] = x[i];
  }
}

}  // namespace sparsecomm
