#include "sparsecomm/core/rng.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace sparsecomm {
namespace {

// Known-answer vectors of Philox-4x32-10 (Random123's kat_vectors).
TEST(Philox, MatchesKnownAnswerVectors) {
  const Philox zero(0);
  EXPECT_EQ(zero.block(0, 0), (Philox::Block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  const Philox ones(~std::uint64_t{0});
  EXPECT_EQ(ones.block(~std::uint64_t{0}, ~std::uint64_t{0}),
            (Philox::Block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, IsAPureFunctionOfKeyAndCounter) {
  const Philox a(42);
  const Philox b(42);
  const Philox c(43);
  EXPECT_EQ(a.u64(7, 9), b.u64(7, 9));
  EXPECT_NE(a.u64(7, 9), c.u64(7, 9));
  EXPECT_NE(a.u64(7, 9), a.u64(8, 9));
  EXPECT_NE(a.u64(7, 9), a.u64(7, 10));
}

TEST(Philox, BelowIsInRangeAndRoughlyUniform) {
  const Philox rng(1234);
  constexpr int kBound = 7;
  constexpr int kDraws = 70000;
  std::vector<int> histogram(kBound, 0);
  for (int i = 0; i < kDraws; ++i) {
    const std::uint64_t v = rng.below(kBound, static_cast<std::uint64_t>(i), 0);
    ASSERT_LT(v, static_cast<std::uint64_t>(kBound));
    ++histogram[v];
  }
  // Each bin expects 10000 with standard deviation ~93; 6 sigma is ~560.
  for (int count : histogram) EXPECT_NEAR(count, kDraws / kBound, 560);
}

}  // namespace
}  // namespace sparsecomm
