// FlatMuon and its Newton-Schulz orthogonalization: the iteration acts on
// each singular value alone, a tall matrix is the transpose of the wide
// one, the elements outside the matrices step as AdamW, the matrices as the
// scaled orthogonalized momentum, state round trips, bad options.

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/muon.h"
#include "sparsecomm/optim/newton_schulz.h"

namespace sparsecomm {
namespace {

// The quintic iteration on one normalized singular value, in double.
double iterate(double s, int steps) {
  for (int i = 0; i < steps; ++i) s = 3.4445 * s - 4.7750 * s * s * s + 2.0315 * s * s * s * s * s;
  return s;
}

std::vector<float> wavy(std::size_t n, float phase) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = std::sin(0.9f * static_cast<float>(i + 1) + phase) * (1.0f + static_cast<float>(i % 4));
  }
  return v;
}

// A 3 x 5 matrix with singular values 3, 1 and 0.2 on a permuted, signed
// diagonal: its singular vectors are coordinate axes, so the result is the
// same pattern with each value iterated on its own.
TEST(NewtonSchulz, MovesEachSingularValueByTheQuinticAlone) {
  const std::vector<double> singular = {3.0, 1.0, 0.2};
  const double norm = std::sqrt(9.0 + 1.0 + 0.04);
  std::vector<float> m(15, 0.0f);
  m[0 * 5 + 3] = 3.0f;
  m[1 * 5 + 0] = -1.0f;
  m[2 * 5 + 4] = 0.2f;
  NewtonSchulzScratch scratch;
  newton_schulz(m, 3, 5, 5, scratch);
  std::vector<float> expected(15, 0.0f);
  expected[0 * 5 + 3] = static_cast<float>(iterate(3.0 / norm, 5));
  expected[1 * 5 + 0] = static_cast<float>(-iterate(1.0 / norm, 5));
  expected[2 * 5 + 4] = static_cast<float>(iterate(0.2 / norm, 5));
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_NEAR(m[i], expected[i], 1e-5) << i;
  // Muon's promise: values that were far apart end near 1.
  EXPECT_GT(expected[3], 0.6f);
  EXPECT_LT(expected[3], 1.25f);
  EXPECT_GT(-expected[5], 0.6f);
  EXPECT_GT(expected[14], 0.6f);
}

TEST(NewtonSchulz, ATallMatrixGivesTheTransposeOfTheWideOnesResult) {
  const std::size_t rows = 7, cols = 4;
  const std::vector<float> tall = wavy(rows * cols, 0.3f);
  std::vector<float> wide(rows * cols);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) wide[j * rows + i] = tall[i * cols + j];
  }
  NewtonSchulzScratch scratch;
  std::vector<float> a = tall;
  std::vector<float> b = wide;
  newton_schulz(a, rows, cols, 5, scratch);
  newton_schulz(b, cols, rows, 5, scratch);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) EXPECT_EQ(a[i * cols + j], b[j * rows + i]);
  }
}

// The kernels (vectorized, triangles mirrored) give exactly the bits of
// plain loops that sum every element in the order of its inner index.
TEST(NewtonSchulz, EqualsPlainLoopsBitForBit) {
  const std::size_t r = 9, c = 21;
  std::vector<float> x = wavy(r * c, 0.7f);
  std::vector<float> kernel = x;
  NewtonSchulzScratch scratch;
  newton_schulz(kernel, r, c, 3, scratch);
  double squares = 0.0;
  for (const float v : x) squares += static_cast<double>(v) * v;
  const auto inverse_norm = static_cast<float>(1.0 / (std::sqrt(squares) + 1e-7));
  for (float& v : x) v *= inverse_norm;
  auto product = [](const std::vector<float>& a, const std::vector<float>& b, std::size_t m,
                    std::size_t k, std::size_t n, bool b_transposed) {
    std::vector<float> out(m * n);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (std::size_t t = 0; t < k; ++t) {
          const float term = a[i * k + t] * (b_transposed ? b[j * k + t] : b[t * n + j]);
          sum = sum + term;
        }
        out[i * n + j] = sum;
      }
    }
    return out;
  };
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> gram = product(x, x, r, c, r, true);
    std::vector<float> square = product(gram, gram, r, r, r, false);
    for (std::size_t i = 0; i < r * r; ++i) square[i] = -4.7750f * gram[i] + 2.0315f * square[i];
    const std::vector<float> next = product(square, x, r, r, c, false);
    for (std::size_t i = 0; i < r * c; ++i) x[i] = 3.4445f * x[i] + next[i];
  }
  EXPECT_EQ(kernel, x);
}

TEST(NewtonSchulz, ZerosStayZeroAndBadShapesAreRefused) {
  std::vector<float> zeros(12, 0.0f);
  NewtonSchulzScratch scratch;
  newton_schulz(zeros, 3, 4, 5, scratch);
  EXPECT_EQ(zeros, std::vector<float>(12, 0.0f));
  EXPECT_THROW(newton_schulz(zeros, 5, 4, 5, scratch), InvalidArgument);
  EXPECT_THROW(newton_schulz(zeros, 3, 4, 0, scratch), InvalidArgument);
}

// Layout: [rest 0..3) [matrix 2 x 3 at 3] [rest 9..11) [matrix 3 x 2 at 11] [rest 17..19).
MuonOptions two_matrices() {
  MuonOptions options;
  options.matrices = {{.offset = 3, .rows = 2, .cols = 3}, {.offset = 11, .rows = 3, .cols = 2}};
  return options;
}

TEST(FlatMuon, TheRestStepsAsAdamWAndEachMatrixByItsScaledOrthogonalizedMomentum) {
  const AdamWOptions adamw{.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  MuonOptions options = two_matrices();
  options.momentum = 0.8;
  options.nesterov = false;
  FlatMuon muon(options, adamw);
  FlatAdamW reference(adamw);
  const std::size_t n = 19;
  std::vector<float> p = wavy(n, 1.0f);
  std::vector<float> rest = {p[0], p[1], p[2], p[9], p[10], p[17], p[18]};
  std::vector<float> momentum(n, 0.0f);
  std::vector<float> expected = p;
  NewtonSchulzScratch scratch;
  const double lr = 0.01;
  for (int t = 0; t < 3; ++t) {
    const std::vector<float> g = wavy(n, 0.5f * static_cast<float>(t));
    const std::vector<float> rest_gradient = {g[0], g[1], g[2], g[9], g[10], g[17], g[18]};
    reference.step(rest, rest_gradient, lr);
    for (const MatrixBlock& m : options.matrices) {
      std::vector<float> u(m.rows * m.cols);
      for (std::size_t i = 0; i < u.size(); ++i) {
        float& b = momentum[m.offset + i];
        b = 0.8f * b + 0.2f * g[m.offset + i];
        u[i] = b;
      }
      newton_schulz(u, m.rows, m.cols, 5, scratch);
      const auto step = static_cast<float>(lr * 0.2 * std::sqrt(3.0));
      for (std::size_t i = 0; i < u.size(); ++i) {
        float& w = expected[m.offset + i];
        w *= static_cast<float>(1.0 - lr * 0.1);
        w -= step * u[i];
      }
    }
    muon.step(p, g, lr);
  }
  const std::vector<std::size_t> rest_at = {0, 1, 2, 9, 10, 17, 18};
  for (std::size_t i = 0; i < rest_at.size(); ++i) EXPECT_EQ(p[rest_at[i]], rest[i]);
  for (const MatrixBlock& m : options.matrices) {
    for (std::size_t i = 0; i < m.rows * m.cols; ++i) {
      EXPECT_EQ(p[m.offset + i], expected[m.offset + i]) << m.offset + i;
    }
  }
}

TEST(FlatMuon, SaveLoadContinuesBitExactly) {
  const AdamWOptions adamw{.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  FlatMuon straight(two_matrices(), adamw);
  std::vector<float> p = wavy(19, 2.0f);
  for (int t = 0; t < 3; ++t) straight.step(p, wavy(19, 0.1f * static_cast<float>(t)), 0.01);
  StateWriter writer;
  straight.save(writer);
  std::vector<float> q = p;
  FlatMuon resumed(two_matrices(), adamw);
  StateReader reader(writer.bytes());
  resumed.load(reader);
  EXPECT_TRUE(reader.at_end());
  for (int t = 3; t < 6; ++t) {
    straight.step(p, wavy(19, 0.1f * static_cast<float>(t)), 0.01);
    resumed.step(q, wavy(19, 0.1f * static_cast<float>(t)), 0.01);
  }
  EXPECT_EQ(p, q);
}

TEST(FlatMuon, RefusesBadOptionsAndLayouts) {
  const AdamWOptions adamw;
  EXPECT_THROW(FlatMuon(MuonOptions{}, adamw), InvalidArgument);  // no matrix
  MuonOptions overlapping;
  overlapping.matrices = {{.offset = 0, .rows = 2, .cols = 3}, {.offset = 5, .rows = 1, .cols = 2}};
  EXPECT_THROW(FlatMuon(overlapping, adamw), InvalidArgument);
  MuonOptions empty_matrix;
  empty_matrix.matrices = {{.offset = 0, .rows = 0, .cols = 3}};
  EXPECT_THROW(FlatMuon(empty_matrix, adamw), InvalidArgument);
  MuonOptions momentum_one = two_matrices();
  momentum_one.momentum = 1.0;
  EXPECT_THROW(FlatMuon(momentum_one, adamw), InvalidArgument);
  FlatMuon muon(two_matrices(), adamw);
  std::vector<float> short_vector(12, 0.0f);  // the second matrix ends at 17
  EXPECT_THROW(muon.step(short_vector, short_vector, 0.01), InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm
