// FlatSgd against the update rule written out by hand, and the learning-rate
// schedules' shapes.

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/lr_schedule.h"
#include "sparsecomm/optim/sgd.h"

namespace sparsecomm {
namespace {

// The reference: PyTorch's SGD rule in double precision, one element.
struct ReferenceSgd {
  double momentum, weight_decay;
  bool nesterov;
  double buffer = 0.0;
  bool started = false;
  double step(double p, double g, double lr) {
    double d = g + weight_decay * p;
    if (momentum > 0) {
      buffer = started ? momentum * buffer + d : d;
      started = true;
      d = nesterov ? d + momentum * buffer : buffer;
    }
    return p - lr * d;
  }
};

TEST(FlatSgd, MatchesTheUpdateRuleForEveryVariant) {
  for (const double momentum : {0.0, 0.9}) {
    for (const bool nesterov : {false, true}) {
      if (nesterov && momentum == 0.0) continue;
      SgdOptions options;
      options.momentum = momentum;
      options.nesterov = nesterov;
      options.weight_decay = 1e-3;
      FlatSgd sgd(options);
      std::vector<float> params = {1.0f, -2.0f, 0.5f};
      std::vector<ReferenceSgd> reference(3, ReferenceSgd{momentum, 1e-3, nesterov});
      std::vector<double> expected = {1.0, -2.0, 0.5};
      for (int t = 0; t < 5; ++t) {
        const std::vector<float> grad = {0.1f * static_cast<float>(t + 1), -0.3f, 0.0f};
        sgd.step(params, grad, 0.1);
        for (std::size_t i = 0; i < 3; ++i) {
          expected[i] = reference[i].step(expected[i], grad[i], 0.1);
          EXPECT_NEAR(params[i], expected[i], 1e-5)
              << "momentum " << momentum << " nesterov " << nesterov << " step " << t;
        }
      }
    }
  }
}

TEST(FlatSgd, SaveLoadContinuesBitExactly) {
  SgdOptions options;
  options.momentum = 0.9;
  FlatSgd a(options);
  std::vector<float> pa = {1.0f, 2.0f};
  a.step(pa, std::vector<float>{0.5f, -0.5f}, 0.1);
  StateWriter writer;
  a.save(writer);
  FlatSgd b(options);
  StateReader reader(writer.bytes());
  b.load(reader);
  std::vector<float> pb = pa;
  a.step(pa, std::vector<float>{0.25f, 0.75f}, 0.1);
  b.step(pb, std::vector<float>{0.25f, 0.75f}, 0.1);
  EXPECT_EQ(pa, pb);
}

TEST(FlatSgd, RejectsBadOptionsAndSizes) {
  EXPECT_THROW(FlatSgd(SgdOptions{1.0, false, 0.0}), InvalidArgument);
  EXPECT_THROW(FlatSgd(SgdOptions{0.9, false, -1.0}), InvalidArgument);
  EXPECT_THROW(FlatSgd(SgdOptions{0.0, true, 0.0}), InvalidArgument);
  FlatSgd sgd(SgdOptions{});
  std::vector<float> p(3), g(2);
  EXPECT_THROW(sgd.step(p, g, 0.1), InvalidArgument);
}

// A share of a step scales the whole direction, weight decay included: W
// updates of share 1/W (a parameter server's asynchronous pushes) decay the
// parameters as one synchronous step does, to first order in lr * wd.
TEST(FlatSgd, AShareOfAStepScalesGradientAndWeightDecay) {
  const double lr = 0.1, wd = 0.01;
  for (const double momentum : {0.0, 0.9}) {
    FlatSgd part(SgdOptions{momentum, momentum > 0, wd});
    FlatSgd whole(SgdOptions{momentum, momentum > 0, wd});
    std::vector<float> p_part = {1.0f, -2.0f}, p_whole = p_part;
    const std::vector<float> zero = {0.0f, 0.0f};
    part.step(p_part, zero, lr, 0.25);
    whole.step(p_whole, zero, lr);
    // One quarter of the decay of a whole step.
    EXPECT_NEAR(1.0 - p_part[0], 0.25 * (1.0 - p_whole[0]), 1e-6) << momentum;
    for (int i = 0; i < 3; ++i) part.step(p_part, zero, lr, 0.25);
    // Four quarters: the decay of one step (momentum compounds within the
    // four, so only to first order then).
    EXPECT_NEAR(p_part[1], p_whole[1], momentum > 0 ? 2e-2 : 1e-4) << momentum;
  }
  FlatSgd sgd(SgdOptions{});
  std::vector<float> p(2), g(2);
  EXPECT_THROW(sgd.step(p, g, 0.1, 0.0), InvalidArgument);
  EXPECT_THROW(sgd.step(p, g, 0.1, 1.5), InvalidArgument);
}

TEST(LrSchedule, WarmupThenStepDecay) {
  LrScheduleOptions o;
  o.base = 1.0;
  o.warmup_steps = 4;
  o.decay = LrDecay::kStep;
  o.milestones = {10, 20};
  o.gamma = 0.5;
  const LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 0.5);
  EXPECT_DOUBLE_EQ(s.at(25), 0.25);
}

TEST(LrSchedule, CosineFallsFromBaseToTheFloor) {
  LrScheduleOptions o;
  o.base = 2.0;
  o.decay = LrDecay::kCosine;
  o.total_steps = 100;
  o.min_factor = 0.1;
  const LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.at(0), 2.0);
  EXPECT_NEAR(s.at(50), 2.0 * (0.1 + 0.9 * 0.5), 1e-12);
  EXPECT_NEAR(s.at(100), 0.2, 1e-12);
  for (int t = 1; t <= 100; ++t) EXPECT_LE(s.at(t), s.at(t - 1));
}

TEST(LrSchedule, RejectsBadOptions) {
  LrScheduleOptions o;
  o.base = 0.0;
  EXPECT_THROW(LrSchedule{o}, InvalidArgument);
  o.base = 1.0;
  o.decay = LrDecay::kCosine;
  EXPECT_THROW(LrSchedule{o}, InvalidArgument);  // no total steps
  EXPECT_THROW(parse_lr_decay("linear"), InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm
