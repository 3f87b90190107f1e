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
  const OuterOptions options{.local_steps = 3, .lr = 0.7, .momentum = 0.9, .nesterov = true};
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

// The overlapped rounds on two ranks by hand. Each rank's local steps
// move its parameters by a fixed progress per round (not depending on where
// they start), so a round's drift is that progress whatever corrections
// land: every outer step then sees the same means in the same order as
// synchronous rounds, one round later, and after the last round's exchange
// the anchor must be the synchronous loop's, each mean applied exactly once.
struct TwoRanks {
  std::vector<OuterLoop> loops;
  std::vector<std::vector<float>> p;
};

std::vector<float> progress(int rank, int round) {
  // Multiples of 1/8: exact in float through every sum below.
  return {0.125f * static_cast<float>(rank + 1 + round),
          -0.25f * static_cast<float>((rank + 2 * round) % 3)};
}

std::vector<float> mean_of(const std::vector<std::vector<float>>& d) {
  return {(d[0][0] + d[1][0]) / 2, (d[0][1] + d[1][1]) / 2};
}

void check_overlapped_rounds_apply_each_mean_once(const OuterOptions& synchronous_options) {
  constexpr int kRounds = 5;
  const std::vector<float> start = {1.0f, -2.0f};
  OuterOptions overlapped_options = synchronous_options;
  overlapped_options.overlap = true;

  // Synchronous rounds: the reference.
  OuterLoop reference(synchronous_options, start);
  std::vector<std::vector<float>> q(2, start);
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::vector<float>> drift(2, std::vector<float>(2));
    for (int r = 0; r < 2; ++r) {
      const std::vector<float> g = progress(r, round);
      for (int i = 0; i < 2; ++i) q[r][i] -= g[i];
      reference.pseudo_gradient(q[r], drift[r]);
    }
    const std::vector<float> mean = mean_of(drift);
    for (int r = 0; r < 2; ++r) {
      OuterLoop copy = reference;  // every rank's loop takes the same step
      copy.finish_round(q[r], mean, false);
      if (r == 1) reference = copy;
    }
  }

  // Overlapped: the mean of round k lands at the end of round k + 1; the
  // last round exchanges its own at once.
  std::vector<OuterLoop> loops(2, OuterLoop(overlapped_options, start));
  std::vector<std::vector<float>> p(2, start);
  std::vector<float> in_flight;  // the mean of the previous round
  int applied = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::vector<float>> drift(2, std::vector<float>(2));
    for (int r = 0; r < 2; ++r) {
      const std::vector<float> g = progress(r, round);
      for (int i = 0; i < 2; ++i) p[r][i] -= g[i];
      if (!in_flight.empty()) loops[r].apply_delayed(p[r], in_flight, false);
      loops[r].begin_overlapped(p[r], drift[r]);
      for (int i = 0; i < 2; ++i) {  // exact while the anchor stays on multiples of 1/8
        EXPECT_NEAR(drift[r][i], g[i], 1e-6f)
            << "a round's drift is its own progress, round " << round;
      }
    }
    applied += in_flight.empty() ? 0 : 1;
    in_flight = mean_of(drift);
  }
  for (int r = 0; r < 2; ++r) loops[r].finish_round(p[r], in_flight, false);
  ++applied;
  EXPECT_EQ(applied, kRounds);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(p[r][i], reference.anchor()[i], 1e-6f) << "rank " << r << " element " << i;
      EXPECT_EQ(p[r][i], loops[r].anchor()[i]) << "the run ends on the anchor";
    }
  }
}

TEST(OuterLoop, OverlappedRoundsApplyEachMeanExactlyOnce) {
  check_overlapped_rounds_apply_each_mean_once(
      {.local_steps = 4, .lr = 1.0, .momentum = 0.0, .nesterov = false});
  check_overlapped_rounds_apply_each_mean_once(
      {.local_steps = 4, .lr = 0.7, .momentum = 0.9, .nesterov = true});
}

TEST(OuterLoop, OverlappedStateSavesTheRoundStart) {
  const OuterOptions options{
      .local_steps = 2, .lr = 1.0, .momentum = 0.0, .nesterov = false, .overlap = true};
  OuterLoop a(options, std::vector<float>{1.0f, 1.0f});
  std::vector<float> p = {0.5f, 0.75f}, d(2);
  EXPECT_THROW(a.apply_delayed(p, d, false), InvalidArgument);  // no exchange begun
  a.begin_overlapped(p, d);
  StateWriter writer;
  a.save(writer);
  OuterLoop b(options, std::vector<float>(2, 0.0f));
  StateReader reader(writer.bytes());
  b.load(reader);
  EXPECT_TRUE(reader.at_end());
  std::vector<float> pa = {0.25f, 0.5f}, pb = pa;
  a.apply_delayed(pa, std::vector<float>{0.5f, 0.25f}, false);
  b.apply_delayed(pb, std::vector<float>{0.5f, 0.25f}, false);
  EXPECT_EQ(pa, pb);
  // x' = (0.5, 0.75); p += x' - s = 0: the round reads as started from x'.
  EXPECT_EQ(pa, (std::vector<float>{0.25f, 0.5f}));
}

}  // namespace
}  // namespace sparsecomm
