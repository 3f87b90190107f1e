// FlatAdamW: its state round trip, the local direction, the frozen variance,
// a share of a step and bad options (torch.optim.AdamW as the reference:
// tests/train/adamw_torch_test.cc).

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/adamw.h"
#include "sparsecomm/optim/update_rule.h"

namespace sparsecomm {
namespace {

std::vector<float> gradient_at(int t, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.7f * static_cast<float>(i + 1) + 1.3f * static_cast<float>(t)) *
           (1.0f + static_cast<float>(i % 3));
  }
  return g;
}

TEST(FlatAdamW, SaveLoadContinuesBitExactly) {
  const AdamWOptions options{.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  FlatAdamW straight(options);
  std::vector<float> p(7, 0.5f);
  for (int t = 0; t < 3; ++t) straight.step(p, gradient_at(t, 7), 0.01);
  StateWriter writer;
  straight.save(writer);
  std::vector<float> q = p;
  FlatAdamW resumed(options);
  StateReader reader(writer.bytes());
  resumed.load(reader);
  EXPECT_TRUE(reader.at_end());
  for (int t = 3; t < 6; ++t) {
    straight.step(p, gradient_at(t, 7), 0.01);
    resumed.step(q, gradient_at(t, 7), 0.01);
  }
  EXPECT_EQ(p, q);
}

// direction() is the step without lr and weight decay: the update rule that
// compresses it and applies p -= lr (u + wd p) equals AdamW's own step.
TEST(FlatAdamW, TheUpdateRuleOfTheLocalDirectionEqualsAdamWsStep) {
  OptimizerOptions options;
  options.name = "adamw";
  options.adamw.weight_decay = 0.05;
  FlatAdamW adamw(options.adamw);
  UpdateRule rule(options, Compress::kUpdate);
  std::vector<float> p(9, -0.25f);
  std::vector<float> q = p;
  for (int t = 0; t < 8; ++t) {
    const double lr = 0.003 * (t + 1);
    adamw.step(p, gradient_at(t, 9), lr);
    std::vector<float> g = gradient_at(t, 9);
    rule.before_sync(g);  // one rank: the synchronized direction is its own
    rule.apply(q, g, lr);
    for (std::size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], q[i], 1e-6) << t << " " << i;
  }
}

TEST(FlatAdamW, AFrozenVarianceKeepsTheSecondMomentAndMakesTheUpdateLinear) {
  FlatAdamW adamw(AdamWOptions{.weight_decay = 0.0, .freeze_variance_after = 3});
  std::vector<float> p(5, 0.0f);
  for (int t = 0; t < 3; ++t) adamw.step(p, gradient_at(t, 5), 0.01);
  EXPECT_FALSE(adamw.variance_frozen());
  const std::vector<float> v(adamw.second_moment().begin(), adamw.second_moment().end());
  // From one state, steps with 0, g and 2g: the moves from the zero step are
  // b g and 2 b g (m is affine in g and v no longer depends on it).
  FlatAdamW with_g = adamw, with_2g = adamw;
  std::vector<float> p0 = p, p1 = p, p2 = p;
  const std::vector<float> g = gradient_at(3, 5);
  std::vector<float> g2 = g;
  for (float& x : g2) x *= 2.0f;
  adamw.step(p0, std::vector<float>(5, 0.0f), 0.01);
  with_g.step(p1, g, 0.01);
  with_2g.step(p2, g2, 0.01);
  EXPECT_TRUE(adamw.variance_frozen());
  EXPECT_EQ(std::vector<float>(adamw.second_moment().begin(), adamw.second_moment().end()), v);
  EXPECT_EQ(std::vector<float>(with_2g.second_moment().begin(), with_2g.second_moment().end()), v);
  for (std::size_t i = 0; i < p.size(); ++i) {
    EXPECT_NEAR(p2[i] - p0[i], 2.0f * (p1[i] - p0[i]), 1e-6) << i;
    EXPECT_NE(p1[i], p0[i]);
  }
}

TEST(FlatAdamW, AShareOfAStepMovesThatShareAsFar) {
  const AdamWOptions options{.weight_decay = 0.1};
  FlatAdamW whole(options), quarter(options);
  std::vector<float> p(6, 1.0f), q(6, 1.0f);
  whole.step(p, gradient_at(0, 6), 0.01);
  quarter.step(q, gradient_at(0, 6), 0.01, 0.25);
  for (std::size_t i = 0; i < p.size(); ++i) {
    EXPECT_NEAR(q[i] - 1.0f, 0.25f * (p[i] - 1.0f), 1e-6);
  }
  EXPECT_EQ(std::vector<float>(whole.first_moment().begin(), whole.first_moment().end()),
            std::vector<float>(quarter.first_moment().begin(), quarter.first_moment().end()));
}

TEST(FlatAdamW, BadOptionsAndInputsAreRefused) {
  EXPECT_THROW(FlatAdamW(AdamWOptions{.beta1 = 1.0}), InvalidArgument);
  EXPECT_THROW(FlatAdamW(AdamWOptions{.beta2 = -0.1}), InvalidArgument);
  EXPECT_THROW(FlatAdamW(AdamWOptions{.eps = 0.0}), InvalidArgument);
  EXPECT_THROW(FlatAdamW(AdamWOptions{.weight_decay = -1.0}), InvalidArgument);
  EXPECT_THROW(FlatAdamW(AdamWOptions{.freeze_variance_after = -1}), InvalidArgument);
  FlatAdamW adamw(AdamWOptions{});
  std::vector<float> p(3, 0.0f), g(4, 0.0f);
  EXPECT_THROW(adamw.step(p, g, 0.1), InvalidArgument);
  g.resize(3);
  EXPECT_THROW(adamw.step(p, g, 0.1, 0.0), InvalidArgument);
  adamw.step(p, g, 0.1);
  std::vector<float> longer(5, 0.0f), g5(5, 0.0f);
  EXPECT_THROW(adamw.step(longer, g5, 0.1), InvalidArgument);  // another length after a step
}

TEST(UpdateRule, CompressingTheUpdateNeedsAdamWAndAMovingVariance) {
  OptimizerOptions sgd;
  EXPECT_THROW(UpdateRule(sgd, Compress::kUpdate), InvalidArgument);
  OptimizerOptions frozen;
  frozen.name = "adamw";
  frozen.adamw.freeze_variance_after = 10;
  EXPECT_THROW(UpdateRule(frozen, Compress::kUpdate), InvalidArgument);
  EXPECT_THROW(parse_compress("momentum"), InvalidArgument);
  OptimizerOptions unknown;
  unknown.name = "lamb";
  EXPECT_THROW(make_flat_optimizer(unknown), InvalidArgument);
}

// A gradient with a NaN passes through untouched and leaves the moments as
// they were, so the method's non-finite policy decides.
TEST(UpdateRule, ANonFiniteGradientPassesThroughAndLeavesTheMoments) {
  OptimizerOptions options;
  options.name = "adamw";
  UpdateRule rule(options, Compress::kUpdate);
  UpdateRule reference(options, Compress::kUpdate);
  std::vector<float> g = gradient_at(0, 4), h = gradient_at(0, 4);
  rule.before_sync(g);
  reference.before_sync(h);
  std::vector<float> bad = gradient_at(1, 4);
  bad[2] = std::nanf("");
  const std::vector<float> bad_copy = bad;
  rule.before_sync(bad);
  EXPECT_EQ(bad[0], bad_copy[0]);
  EXPECT_TRUE(std::isnan(bad[2]));
  std::vector<float> next = gradient_at(2, 4), next_ref = gradient_at(2, 4);
  rule.before_sync(next);
  reference.before_sync(next_ref);
  EXPECT_EQ(next, next_ref);
}

}  // namespace
}  // namespace sparsecomm
