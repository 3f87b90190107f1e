// OuterLoop (optim/outer_loop.h): the outer step of local-step training.

#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/outer_loop.h"

namespace sparsecomm {
namespace {

// Two rounds by hand: v = mu v + D (v starts at D), x -= lr (D + mu v).
TEST(OuterLoop, NesterovOuterStepsMoveTheAnchorAndRestartTheParameters) {
  OuterLoop loop({.local_steps = 4, .lr = 0.5, .momentum = 0.5, .nesterov = true},
                 std::vector<float>{1.0f, 2.0f});
  EXPECT_FALSE(loop.ends_round(2));
  EXPECT_TRUE(loop.ends_round(3));
  EXPECT_TRUE(loop.ends_round(7));
  std::vector<float> p = {0.0f, 2.5f};  // after the round's local steps
  std::vector<float> d(2);
  loop.pseudo_gradient(p, d);
  EXPECT_EQ(d, (std::vector<float>{1.0f, -0.5f}));
  loop.finish_round(p, d, /*skipped=*/false);  // v = D; x -= 0.5 (D + 0.5 D)
  EXPECT_EQ(p, (std::vector<float>{0.25f, 2.375f}));
  EXPECT_EQ(std::vector<float>(loop.anchor().begin(), loop.anchor().end()), p);
  loop.finish_round(p, std::vector<float>{1.0f, 0.0f}, false);  // v = (1.5, -0.25)
  EXPECT_FLOAT_EQ(p[0], 0.25f - 0.5f * (1.0f + 0.75f));
  EXPECT_FLOAT_EQ(p[1], 2.375f - 0.5f * (0.0f - 0.125f));
}

// A dropped round (the method's non-finite policy skipped it) leaves the
// anchor and restarts every parameter from it; a non-finite local step marks
// the pseudo-gradient so that every rank's method sees it.
TEST(OuterLoop, ANonFiniteRoundIsMarkedAndADroppedRoundRestartsFromTheAnchor) {
  OuterLoop loop({.local_steps = 2}, std::vector<float>{1.0f, 1.0f});
  std::vector<float> p = {0.0f, 0.0f}, d(2);
  loop.mark_nonfinite();
  loop.pseudo_gradient(p, d);
  EXPECT_TRUE(std::isnan(d[0]));
  loop.finish_round(p, d, /*skipped=*/true);
  EXPECT_EQ(p, (std::vector<float>{1.0f, 1.0f}));
  loop.pseudo_gradient(p, d);  // the mark lasts one round
  EXPECT_EQ(d, (std::vector<float>{0.0f, 0.0f}));
}

TEST(OuterLoop, SaveLoadContinuesBitExactly) {
  const OuterOptions options{.local_steps = 3, .lr = 0.7, .momentum = 0.9};
  OuterLoop a(options, std::vector<float>{1.0f, -1.0f, 0.5f});
  std::vector<float> p = {0.9f, -0.8f, 0.4f}, d(3);
  a.pseudo_gradient(p, d);
  a.finish_round(p, d, false);
  a.mark_nonfinite();
  StateWriter writer;
  a.save(writer);
  OuterLoop b(options, std::vector<float>(3, 0.0f));
  StateReader reader(writer.bytes());
  b.load(reader);
  EXPECT_TRUE(reader.at_end());
  std::vector<float> da(3), db(3), pa = {0.1f, 0.2f, 0.3f}, pb = pa;
  a.pseudo_gradient(pa, da);
  b.pseudo_gradient(pb, db);
  EXPECT_TRUE(std::isnan(db[0]));
  da[0] = db[0] = 0.25f;
  a.finish_round(pa, da, false);
  b.finish_round(pb, db, false);
  EXPECT_EQ(pa, pb);
}

TEST(OuterLoop, RejectsBadOptions) {
  const std::vector<float> x(2);
  EXPECT_THROW(OuterLoop({.local_steps = 0}, x), InvalidArgument);
  EXPECT_THROW(OuterLoop({.local_steps = 2, .lr = 0.0}, x), InvalidArgument);
  EXPECT_THROW(OuterLoop({.local_steps = 2, .lr = std::numeric_limits<double>::infinity()}, x),
               InvalidArgument);
  EXPECT_THROW(OuterLoop({.local_steps = 2, .momentum = 1.0}, x), InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm
