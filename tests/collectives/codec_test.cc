// The wire codecs: varint delta indices and fp16/bf16 values, each checked
// against a short, obviously correct reference (exhaustively where the
// domain is 16 bits).

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sparsecomm/collectives/codec.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

// --- references ---

// The value of a finite fp16 pattern (0..0x7BFF), from the format's
// definition; 0x7C00 stands for 2^16, the overflow neighbour of 65504.
double fp16_value(std::uint32_t bits) {
  const std::uint32_t e = bits >> 10;
  const std::uint32_t m = bits & 0x3FF;
  if (e == 0) return std::ldexp(static_cast<double>(m), -24);
  return std::ldexp(static_cast<double>(1024 + m), static_cast<int>(e) - 25);
}
// bf16 pattern 0..0x7F7F; 0x7F80 stands for 2^128.
double bf16_value(std::uint32_t bits) {
  if (bits == 0x7F80) return std::ldexp(1.0, 128);
  return static_cast<double>(std::bit_cast<float>(bits << 16));
}

// Nearest of the monotone table value(0..top), ties to the even pattern,
// the top (overflow) entry replaced by top - 1 (saturation).
template <class Value>
std::uint16_t nearest_pattern(double x, std::uint32_t top, Value value) {
  std::uint32_t lo = 0, hi = top;  // value(lo) <= x
  if (x >= value(top)) return static_cast<std::uint16_t>(top - 1);
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    (value(mid) <= x ? lo : hi) = mid;
  }
  const double below = x - value(lo);
  const double above = value(hi) - x;
  std::uint32_t pick = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  if (pick == top) pick = top - 1;
  return static_cast<std::uint16_t>(pick);
}

std::uint16_t reference_fp16(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isinf(f)) return static_cast<std::uint16_t>(sign | 0x7C00);
  return static_cast<std::uint16_t>(
      sign | nearest_pattern(std::fabs(static_cast<double>(f)), 0x7C00, fp16_value));
}
std::uint16_t reference_bf16(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isinf(f)) return static_cast<std::uint16_t>(sign | 0x7F80);
  return static_cast<std::uint16_t>(
      sign | nearest_pattern(std::fabs(static_cast<double>(f)), 0x7F80, bf16_value));
}

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// Edge cases around every boundary of both formats, with their neighbours.
std::vector<float> edge_floats() {
  std::vector<float> base = {0.0f,
                             1.0f,
                             65504.0f,
                             65519.0f,
                             65520.0f,
                             65536.0f,
                             0x1p-14f,
                             0x1p-24f,
                             0x1p-25f,
                             0x1.8p-25f,
                             0x1.8p-24f,
                             0x1p-26f,
                             3.0f * 0x1p-26f,
                             std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::min(),
                             std::numeric_limits<float>::denorm_min(),
                             std::bit_cast<float>(0x7F7F8000u),
                             std::bit_cast<float>(0x7F7F7FFFu),
                             std::bit_cast<float>(0x00008000u),
                             std::bit_cast<float>(0x007FFFFFu),
                             1.0f + 0x1p-11f,
                             1.0f + 0x1p-10f + 0x1p-11f,
                             1.0f + 0x1p-8f,
                             1.0f + 0x1p-7f + 0x1p-8f};
  std::vector<float> all;
  for (const float f : base) {
    for (const float g : {f, std::nextafter(f, 0.0f), std::nextafter(f, INFINITY)}) {
      all.push_back(g);
      all.push_back(-g);
    }
  }
  // Midpoints of neighbouring fp16 and bf16 values (ties), exact in float.
  for (std::uint32_t b = 0; b < 0x7BFF; b += 97)
    all.push_back(static_cast<float>((fp16_value(b) + fp16_value(b + 1)) / 2));
  for (std::uint32_t b = 0; b < 0x7F7F; b += 89)
    all.push_back(static_cast<float>((bf16_value(b) + bf16_value(b + 1)) / 2));
  return all;
}

// Random bit patterns (every exponent) and random values in the fp16 range.
std::vector<float> random_floats(std::size_t count) {
  std::mt19937_64 rng(12345);
  std::vector<float> all;
  for (std::size_t i = 0; i < count; ++i) {
    float f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (std::isnan(f)) f = 1.0f;
    all.push_back(f);
    const auto mantissa = static_cast<std::uint32_t>(rng() & 0x7FFFFF);
    const auto exponent = static_cast<std::uint32_t>(127 - 27 + rng() % 45);  // 2^-27 .. 2^17
    const auto sign = static_cast<std::uint32_t>(rng() & 1) << 31;
    all.push_back(std::bit_cast<float>(sign | exponent << 23 | mantissa));
  }
  return all;
}

// --- values ---

TEST(Fp16, EveryPatternDecodesExactlyAndRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = fp16_to_float(bits);
    const std::uint32_t magnitude = h & 0x7FFF;
    if (magnitude > 0x7C00) {
      ASSERT_TRUE(std::isnan(f)) << h;
    } else if (magnitude == 0x7C00) {
      ASSERT_TRUE(std::isinf(f)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(std::fabs(f)), fp16_value(magnitude)) << h;
    }
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    ASSERT_EQ(float_to_fp16(f), bits) << "pattern " << h << " did not survive float and back";
  }
}

TEST(Bf16, EveryPatternDecodesExactlyAndRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = bf16_to_float(bits);
    const std::uint32_t magnitude = h & 0x7FFF;
    if (magnitude > 0x7F80) {
      ASSERT_TRUE(std::isnan(f)) << h;
    } else if (magnitude == 0x7F80) {
      ASSERT_TRUE(std::isinf(f)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(std::fabs(f)), bf16_value(magnitude)) << h;
    }
    ASSERT_EQ(float_to_bf16(f), bits) << "pattern " << h << " did not survive float and back";
  }
}

TEST(Fp16, RoundsToNearestEvenLikeTheReference) {
  std::vector<float> inputs = edge_floats();
  for (const float f : random_floats(200000)) inputs.push_back(f);
  std::size_t bad = 0;
  for (const float f : inputs) {
    if (float_to_fp16(f) != reference_fp16(f) && bad++ < 5) {
      ADD_FAILURE() << "float " << f << " (bits " << std::hex << bits_of(f) << "): got "
                    << float_to_fp16(f) << ", want " << reference_fp16(f);
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Bf16, RoundsToNearestEvenLikeTheReference) {
  std::vector<float> inputs = edge_floats();
  for (const float f : random_floats(200000)) inputs.push_back(f);
  std::size_t bad = 0;
  for (const float f : inputs) {
    if (float_to_bf16(f) != reference_bf16(f) && bad++ < 5) {
      ADD_FAILURE() << "float " << f << " (bits " << std::hex << bits_of(f) << "): got "
                    << float_to_bf16(f) << ", want " << reference_bf16(f);
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Fp16, SaturatesFiniteValuesAndKeepsInfAndNan) {
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7BFF);  // would round to inf
  EXPECT_EQ(float_to_fp16(1e9f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::max()), 0xFBFF);
  EXPECT_EQ(float_to_fp16(INFINITY), 0x7C00);
  EXPECT_EQ(float_to_fp16(-INFINITY), 0xFC00);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);    // tie: to even (zero)
  EXPECT_EQ(float_to_fp16(0x1.8p-24f), 0x0002);  // 1.5 units: tie to even (2)
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(NAN))));
  // A float NaN whose payload sits only in the low bits is still a NaN.
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::bit_cast<float>(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0xFF800001u)))));
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F7F);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::max()), 0xFF7F);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7F80);
}

// encode_values: the decoded value d of every finite a leaves an exact
// residual a - d, so "sent + residual == a" holds exactly.
TEST(ValueCodec, ResidualOfEveryEncodedValueIsExact) {
  std::vector<float> inputs;
  for (const float f : edge_floats()) {
    if (std::isfinite(f)) inputs.push_back(f);  // the promise is for finite values
  }
  for (const float f : random_floats(100000)) {
    if (std::isfinite(f)) inputs.push_back(f);
  }
  for (const float f : {0x1p29f, 0x1p29f + 64.0f, 0x1p29f + 192.0f, 0x1p35f + 0x1p12f, 0x1p39f,
                        0x1p39f + 0x1p16f, 3e38f}) {
    inputs.push_back(f);
    inputs.push_back(-f);
  }
  for (const ValueEncoding encoding :
       {ValueEncoding::kFloat32, ValueEncoding::kFloat16, ValueEncoding::kBFloat16}) {
    std::vector<float> values = inputs;
    std::vector<std::byte> bytes(values.size() * value_bytes(encoding));
    encode_values(values, encoding, bytes);
    std::vector<float> decoded(values.size());
    decode_values(bytes, encoding, decoded);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const float a = inputs[i];
      const float d = values[i];
      const float residual = a - d;
      const bool exact =
          static_cast<double>(a) - static_cast<double>(d) == static_cast<double>(residual);
      const bool same = bits_of(decoded[i]) == bits_of(d);
      const bool finite =
          std::isfinite(d) && (encoding != ValueEncoding::kFloat16 || std::fabs(d) <= 65504.0f);
      if ((!exact || !same || !finite) && bad++ < 5) {
        ADD_FAILURE() << value_encoding_name(encoding) << ": a=" << a << " decoded=" << d
                      << " exact=" << exact << " same=" << same << " finite=" << finite;
      }
      if (encoding == ValueEncoding::kFloat16 && std::fabs(a) > 65504.0f &&
          std::fabs(a) < 0x1p29f) {
        EXPECT_EQ(std::fabs(d), 65504.0f) << a;
      }
      if (encoding != ValueEncoding::kFloat32 && std::fabs(a) <= 1.0f) {
        EXPECT_EQ(bits_of(d),
                  bits_of(encoding == ValueEncoding::kFloat16 ? fp16_to_float(float_to_fp16(a))
                                                              : bf16_to_float(float_to_bf16(a))));
      }
    }
    EXPECT_EQ(bad, 0u) << value_encoding_name(encoding);
  }
  // Beyond 2^39 an fp16 sends 0: 65504 would not leave an exact residual.
  float huge = 0x1p40f + 0x1p17f;
  std::vector<std::byte> two(2);
  encode_values(std::span<float>(&huge, 1), ValueEncoding::kFloat16, two);
  EXPECT_EQ(huge, 0.0f);
  // Just above 2^29 the largest exact choice is 65536 - 64.
  float big = 0x1p29f + 64.0f;
  encode_values(std::span<float>(&big, 1), ValueEncoding::kFloat16, two);
  EXPECT_EQ(big, 65472.0f);
}

TEST(ValueCodec, RejectsMismatchedSizes) {
  std::vector<float> values(3, 1.0f);
  std::vector<std::byte> bytes(5);
  EXPECT_THROW(encode_values(values, ValueEncoding::kFloat16, bytes), InvalidArgument);
  EXPECT_THROW(decode_values(bytes, ValueEncoding::kFloat16, values), CommError);
}

TEST(ValueCodec, ParsesAndNames) {
  for (const ValueEncoding e :
       {ValueEncoding::kFloat32, ValueEncoding::kFloat16, ValueEncoding::kBFloat16}) {
    EXPECT_EQ(parse_value_encoding(value_encoding_name(e)), e);
  }
  EXPECT_EQ(value_bytes(ValueEncoding::kFloat32), 4u);
  EXPECT_EQ(value_bytes(ValueEncoding::kFloat16), 2u);
  EXPECT_EQ(value_bytes(ValueEncoding::kBFloat16), 2u);
  try {
    parse_value_encoding("fp8");
    ADD_FAILURE() << "fp8 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fp32, fp16, bf16"), std::string::npos) << e.what();
  }
}

// --- indices ---

std::vector<std::byte> encoded(const std::vector<Index>& indices) {
  UninitVector<std::byte> out;
  encode_indices(indices, out);
  return {out.begin(), out.end()};
}

TEST(IndexCodec, WritesTheFirstIndexThenGapsMinusOne) {
  EXPECT_EQ(encoded({}), std::vector<std::byte>{});
  EXPECT_EQ(encoded({0, 1, 2}), (std::vector<std::byte>{std::byte{0}, std::byte{0}, std::byte{0}}));
  EXPECT_EQ(encoded({127}), std::vector<std::byte>{std::byte{0x7F}});
  EXPECT_EQ(encoded({128}), (std::vector<std::byte>{std::byte{0x80}, std::byte{0x01}}));
  // 5, then 6-5-1 = 0, then 300-6-1 = 293 = 0b10'0100101
  EXPECT_EQ(encoded({5, 6, 300}),
            (std::vector<std::byte>{std::byte{5}, std::byte{0}, std::byte{0xA5}, std::byte{0x02}}));
  EXPECT_EQ(encoded({0xFFFFFFFFu}),
            (std::vector<std::byte>{std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF},
                                    std::byte{0xFF}, std::byte{0x0F}}));
}

TEST(IndexCodec, RoundTripsAndCountsBytes) {
  std::mt19937_64 rng(7);
  for (const double density : {0.0, 1e-4, 1e-3, 0.05, 0.5, 1.0}) {
    for (const std::uint64_t span :
         {std::uint64_t{10}, std::uint64_t{100000}, std::uint64_t{1} << 32}) {
      std::set<Index> chosen;
      const auto target =
          static_cast<std::size_t>(std::min(20000.0, density * static_cast<double>(span)));
      while (chosen.size() < target) chosen.insert(static_cast<Index>(rng() % span));
      if (span == (std::uint64_t{1} << 32) && density > 0) chosen.insert(0xFFFFFFFFu);
      const std::vector<Index> indices(chosen.begin(), chosen.end());
      UninitVector<std::byte> out;
      out.push_back(std::byte{42});  // encode appends
      const std::size_t written = encode_indices(indices, out);
      EXPECT_EQ(written, encoded_index_bytes(indices));
      EXPECT_EQ(out.size(), written + 1);
      UninitVector<Index> back;
      const std::size_t used =
          decode_indices(std::span<const std::byte>(out).subspan(1), indices.size(), back);
      EXPECT_EQ(used, written);
      EXPECT_TRUE(std::equal(back.begin(), back.end(), indices.begin(), indices.end()))
          << density << " " << span;
    }
  }
}

TEST(IndexCodec, SavesAtLeastFortyPercentAtDensityOneInAThousand) {
  std::mt19937_64 rng(2024);
  std::set<Index> chosen;
  while (chosen.size() < 1000) chosen.insert(static_cast<Index>(rng() % 1000000));
  const std::vector<Index> indices(chosen.begin(), chosen.end());
  const std::size_t raw = sizeof(Index) * indices.size();
  const std::size_t bytes = encoded_index_bytes(indices);
  EXPECT_LE(static_cast<double>(bytes), 0.6 * static_cast<double>(raw))
      << bytes << " encoded bytes for " << raw << " raw";
}

TEST(IndexCodec, RejectsUnsortedInputAndMalformedEncodings) {
  UninitVector<std::byte> out;
  EXPECT_THROW(encode_indices(std::vector<Index>{3, 3}, out), InvalidArgument);
  EXPECT_THROW(encode_indices(std::vector<Index>{3, 1}, out), InvalidArgument);
  EXPECT_TRUE(out.empty());  // nothing appended on error
  UninitVector<Index> back;
  const auto bytes = [](std::initializer_list<int> list) {
    std::vector<std::byte> v;
    for (const int b : list) v.push_back(static_cast<std::byte>(b));
    return v;
  };
  // Truncated: a continuation byte at the end, or too few values.
  EXPECT_THROW(decode_indices(bytes({0x80}), 1, back), CommError);
  EXPECT_THROW(decode_indices(bytes({1, 2}), 3, back), CommError);
  // Over 32 bits: a fifth byte above 0x0F, or a sixth byte.
  EXPECT_THROW(decode_indices(bytes({0xFF, 0xFF, 0xFF, 0xFF, 0x10}), 1, back), CommError);
  EXPECT_THROW(decode_indices(bytes({0x80, 0x80, 0x80, 0x80, 0x80, 0x00}), 1, back), CommError);
  // Index past 2^32 - 1 through the gaps.
  EXPECT_THROW(decode_indices(bytes({0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0x00}), 2, back), CommError);
  // Decoding stops after `count` values and reports the bytes used.
  EXPECT_EQ(decode_indices(bytes({1, 2, 3}), 2, back), 2u);
  EXPECT_EQ(back, (UninitVector<Index>{1, 4}));
}

}  // namespace
}  // namespace sparsecomm
