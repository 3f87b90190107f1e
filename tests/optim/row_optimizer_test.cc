// Lazy row optimizers: lazy SGD is dense SGD where they must agree, the
// momentum and Adagrad rules against the formulas by hand, state that
// resumes exactly, bad input refused.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/row_optimizer.h"
#include "sparsecomm/optim/sgd.h"

namespace sparsecomm {
namespace {

constexpr std::size_t kRows = 6;
constexpr std::size_t kWidth = 3;

RowSparse gradient_of(std::vector<Index> ids, float base) {
  RowSparse g;
  g.reset(kRows, kWidth);
  g.ids.assign(ids.begin(), ids.end());
  for (std::size_t j = 0; j < ids.size(); ++j)
    for (std::size_t c = 0; c < kWidth; ++c)
      g.values.push_back(base + 0.25f * static_cast<float>(j) - 0.5f * static_cast<float>(c));
  return g;
}

std::vector<float> densify(const RowSparse& g) {
  std::vector<float> dense(g.rows * g.width, 0.0f);
  for (std::size_t j = 0; j < g.touched(); ++j)
    for (std::size_t c = 0; c < g.width; ++c)
      dense[g.ids[j] * g.width + c] = g.values[j * g.width + c];
  return dense;
}

std::vector<float> initial_table() {
  std::vector<float> t(kRows * kWidth);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.1f * static_cast<float>(i) - 0.7f;
  return t;
}

TEST(RowSgd, WithoutMomentumOrDecayIsDenseSgdBitForBit) {
  std::vector<float> lazy = initial_table(), dense = initial_table();
  RowSgd rows(RowSgdOptions{});
  FlatSgd flat(SgdOptions{.momentum = 0.0});
  const std::vector<std::vector<Index>> touched{{0, 3}, {}, {1, 3, 5}, {2}};
  for (std::size_t t = 0; t < touched.size(); ++t) {
    const RowSparse g = gradient_of(touched[t], 1.0f + static_cast<float>(t));
    rows.step(lazy, g, 0.05, 0.5);
    std::vector<float> mean = densify(g);
    for (float& v : mean) v *= 0.5f;
    flat.step(dense, mean, 0.05);
  }
  EXPECT_EQ(std::memcmp(lazy.data(), dense.data(), lazy.size() * sizeof(float)), 0);
}

TEST(RowSgd, MomentumAndDecayTouchOnlyTheTouchedRows) {
  const float lr = 0.1f, mu = 0.9f, wd = 0.01f;
  RowSgd rows(RowSgdOptions{.momentum = mu, .weight_decay = wd});
  std::vector<float> table = initial_table();
  std::vector<float> want = initial_table();
  std::vector<float> buffer(kRows * kWidth, 0.0f);
  std::vector<bool> started(kRows, false);
  const std::vector<std::vector<Index>> touched{{1, 4}, {4}, {0, 1}};
  for (std::size_t t = 0; t < touched.size(); ++t) {
    const RowSparse g = gradient_of(touched[t], 0.5f * static_cast<float>(t + 1));
    rows.step(table, g, lr);
    for (std::size_t j = 0; j < g.touched(); ++j) {
      const std::size_t row = g.ids[j];
      for (std::size_t c = 0; c < kWidth; ++c) {
        float& p = want[row * kWidth + c];
        float& b = buffer[row * kWidth + c];
        const float d = 1.0f * g.values[j * kWidth + c] + wd * p;
        b = started[row] ? mu * b + d : d;
        p -= lr * b;
      }
      started[row] = true;
    }
  }
  EXPECT_EQ(table, want);
  // Rows 2, 3 and 5 were never touched: not decayed.
  for (const std::size_t row : {2, 3, 5})
    for (std::size_t c = 0; c < kWidth; ++c)
      EXPECT_EQ(table[row * kWidth + c], initial_table()[row * kWidth + c]);
}

TEST(RowAdagrad, OneAccumulatorPerRowOfTheMeanSquare) {
  const float lr = 0.2f, eps = 1e-8f;
  RowAdagrad adagrad(RowAdagradOptions{.eps = eps, .initial_accumulator = 0.1});
  std::vector<float> table = initial_table();
  std::vector<float> want = initial_table();
  std::vector<float> accumulator(kRows, 0.1f);
  const std::vector<std::vector<Index>> touched{{2, 5}, {5}, {0, 2, 5}};
  for (std::size_t t = 0; t < touched.size(); ++t) {
    const RowSparse g = gradient_of(touched[t], -0.3f * static_cast<float>(t + 1));
    adagrad.step(table, g, lr);
    for (std::size_t j = 0; j < g.touched(); ++j) {
      const std::size_t row = g.ids[j];
      float squares = 0.0f;
      for (std::size_t c = 0; c < kWidth; ++c)
        squares += g.values[j * kWidth + c] * g.values[j * kWidth + c];
      accumulator[row] += squares / static_cast<float>(kWidth);
      const float step = lr / (std::sqrt(accumulator[row]) + eps);
      for (std::size_t c = 0; c < kWidth; ++c)
        want[row * kWidth + c] -= step * g.values[j * kWidth + c];
    }
  }
  EXPECT_EQ(table, want);
  ASSERT_EQ(adagrad.accumulators().size(), kRows);
  for (std::size_t row = 0; row < kRows; ++row)
    EXPECT_EQ(adagrad.accumulators()[row], accumulator[row]) << row;
}

TEST(RowOptimizers, StateResumesExactly) {
  const std::vector<std::vector<Index>> touched{{1, 4}, {0, 4}, {2, 3}, {4}};
  // Straight through.
  std::vector<float> straight = initial_table();
  RowSgd sgd(RowSgdOptions{.momentum = 0.9});
  RowAdagrad adagrad(RowAdagradOptions{});
  std::vector<float> straight_adagrad = initial_table();
  for (std::size_t t = 0; t < touched.size(); ++t) {
    sgd.step(straight, gradient_of(touched[t], 1.0f + static_cast<float>(t)), 0.1);
    adagrad.step(straight_adagrad, gradient_of(touched[t], 1.0f + static_cast<float>(t)), 0.1);
  }
  // Two steps, save, two more on fresh optimizers.
  std::vector<float> resumed = initial_table(), resumed_adagrad = initial_table();
  RowSgd first(RowSgdOptions{.momentum = 0.9});
  RowAdagrad first_adagrad(RowAdagradOptions{});
  for (std::size_t t = 0; t < 2; ++t) {
    first.step(resumed, gradient_of(touched[t], 1.0f + static_cast<float>(t)), 0.1);
    first_adagrad.step(resumed_adagrad, gradient_of(touched[t], 1.0f + static_cast<float>(t)), 0.1);
  }
  StateWriter writer;
  first.save(writer);
  first_adagrad.save(writer);
  StateReader reader(writer.bytes());
  RowSgd second(RowSgdOptions{.momentum = 0.9});
  RowAdagrad second_adagrad(RowAdagradOptions{});
  second.load(reader);
  second_adagrad.load(reader);
  for (std::size_t t = 2; t < touched.size(); ++t) {
    second.step(resumed, gradient_of(touched[t], 1.0f + static_cast<float>(t)), 0.1);
    second_adagrad.step(resumed_adagrad, gradient_of(touched[t], 1.0f + static_cast<float>(t)),
                        0.1);
  }
  EXPECT_EQ(resumed, straight);
  EXPECT_EQ(resumed_adagrad, straight_adagrad);
}

TEST(RowOptimizers, BadOptionsAndMismatchedTablesAreRefused) {
  EXPECT_THROW(RowSgd(RowSgdOptions{.momentum = 1.0}), InvalidArgument);
  EXPECT_THROW(RowSgd(RowSgdOptions{.weight_decay = -1.0}), InvalidArgument);
  EXPECT_THROW(RowAdagrad(RowAdagradOptions{.eps = 0.0}), InvalidArgument);
  EXPECT_THROW(RowAdagrad(RowAdagradOptions{.initial_accumulator = -1.0}), InvalidArgument);
  RowSgd sgd(RowSgdOptions{});
  std::vector<float> short_table(kRows * kWidth - 1);
  try {
    sgd.step(short_table, gradient_of({1}, 1.0f), 0.1);
    ADD_FAILURE() << "a short table accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the table has 17 floats, a 6 x 3 gradient needs 18"),
              std::string::npos)
        << e.what();
  }
  std::vector<float> table = initial_table();
  RowSparse unsorted = gradient_of({3, 1}, 1.0f);
  EXPECT_THROW(sgd.step(table, unsorted, 0.1), InvalidArgument);
  EXPECT_EQ(table, initial_table()) << "nothing applied before the check";
}

}  // namespace
}  // namespace sparsecomm
