// The wire codecs: varint delta indices and fp16/bf16 values, each checked
// against a short, obviously correct reference (exhaustively where the
// domain is 16 bits).

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sparsecomm/collectives/exchange_message.h"
#include "sparsecomm/collectives/index_codec.h"
#include "sparsecomm/collectives/value_codec.h"
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
  // The round-to-nearest codecs and nat (a power of two next to a); the
  // other stochastic ones are within one rounding
  // (BlockQuantized.StochasticResidualIsWithinOneRounding).
  for (const ValueEncoding encoding :
       {ValueEncoding::kFloat32, ValueEncoding::kFloat16, ValueEncoding::kBFloat16,
        ValueEncoding::kInt8, ValueEncoding::kInt4, ValueEncoding::kInt2,
        ValueEncoding::kNatural}) {
    std::vector<float> values = inputs;
    std::vector<std::byte> bytes(encoded_value_bytes(encoding, values.size()));
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
      if ((encoding == ValueEncoding::kFloat16 || encoding == ValueEncoding::kBFloat16) &&
          std::fabs(a) <= 1.0f) {
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
  ASSERT_EQ(value_encoding_names().size(), static_cast<std::size_t>(kLastValueEncoding) + 1);
  for (const std::string& name : value_encoding_names()) {
    EXPECT_EQ(value_encoding_name(parse_value_encoding(name)), name);
  }
  EXPECT_EQ(fixed_value_bytes(ValueEncoding::kFloat32), 4u);
  EXPECT_EQ(fixed_value_bytes(ValueEncoding::kFloat16), 2u);
  EXPECT_EQ(fixed_value_bytes(ValueEncoding::kBFloat16), 2u);
  EXPECT_THROW(fixed_value_bytes(ValueEncoding::kInt4), InvalidArgument);
  EXPECT_EQ(encoded_value_bytes(ValueEncoding::kBFloat16, 7), 14u);
  // intB: one 4-byte scale per block of 128, then ceil(count * B / 8) bytes.
  EXPECT_EQ(encoded_value_bytes(ValueEncoding::kInt8, 0), 0u);
  EXPECT_EQ(encoded_value_bytes(ValueEncoding::kInt8, 1), 5u);
  EXPECT_EQ(encoded_value_bytes(ValueEncoding::kInt4, 128), 68u);
  EXPECT_EQ(encoded_value_bytes(ValueEncoding::kInt2Stochastic, 129), 36u + 5u);
  EXPECT_EQ(encoded_value_bytes(ValueEncoding::kInt2, 300), 36u + 36u + 4u + 11u);
  EXPECT_DOUBLE_EQ(wire_bits_per_value(ValueEncoding::kInt2), 2.25);
  EXPECT_DOUBLE_EQ(wire_bits_per_value(ValueEncoding::kBFloat16), 16.0);
  EXPECT_DOUBLE_EQ(wire_bits_per_value(ValueEncoding::kNatural), 8.25);
  EXPECT_DOUBLE_EQ(wire_bits_per_value(ValueEncoding::kLloyd2), 2.25);
  EXPECT_FALSE(keeps_residual_exact(ValueEncoding::kLloyd2));
  EXPECT_EQ(encoded_value_bytes(ValueEncoding::kNatural, 130), 4u + 128u + 4u + 2u);
  try {
    parse_value_encoding("fp8");
    ADD_FAILURE() << "fp8 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fp32, fp16, bf16, int8"), std::string::npos) << e.what();
  }
}

// --- block-quantized values ---

std::vector<float> gradient_like(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng) * std::exp2(normal(rng) * 3.0f);
  return values;
}

float block_scale(std::span<const float> block, ValueEncoding encoding) {
  const int bits =
      encoding == ValueEncoding::kInt8 || encoding == ValueEncoding::kInt8Stochastic   ? 8
      : encoding == ValueEncoding::kInt4 || encoding == ValueEncoding::kInt4Stochastic ? 4
                                                                                       : 2;
  float largest = 0.0f;
  for (const float a : block) largest = std::max(largest, std::fabs(a));
  return largest / static_cast<float>((1 << (bits - 1)) - 1);
}

constexpr ValueEncoding kQuantized[] = {
    ValueEncoding::kInt8,           ValueEncoding::kInt4,           ValueEncoding::kInt2,
    ValueEncoding::kInt8Stochastic, ValueEncoding::kInt4Stochastic, ValueEncoding::kInt2Stochastic};

TEST(BlockQuantized, DecodesToLevelsOfTheBlockScaleWithinHalfAStepWhenRoundingToNearest) {
  const std::vector<float> inputs = gradient_like(1000, 7);  // 7 full blocks and 104
  for (const ValueEncoding encoding : kQuantized) {
    std::vector<float> values = inputs;
    std::vector<std::byte> bytes(encoded_value_bytes(encoding, values.size()));
    encode_values(values, encoding, bytes, 99);
    std::vector<float> decoded(values.size());
    decode_values(bytes, encoding, decoded);
    for (std::size_t first = 0; first < inputs.size(); first += kQuantizationBlock) {
      const std::size_t count = std::min(kQuantizationBlock, inputs.size() - first);
      const float scale =
          block_scale(std::span<const float>(inputs).subspan(first, count), encoding);
      const float step = is_stochastic(encoding) ? 1.0f : 0.5f;
      for (std::size_t j = first; j < first + count; ++j) {
        ASSERT_EQ(bits_of(decoded[j]), bits_of(values[j])) << value_encoding_name(encoding);
        const float level = values[j] / scale;
        EXPECT_NEAR(level, std::nearbyint(level), 1e-4)
            << value_encoding_name(encoding) << " " << j;
        EXPECT_LE(std::fabs(values[j] - inputs[j]), step * scale * 1.0001f)
            << value_encoding_name(encoding) << " " << j;
      }
    }
  }
}

TEST(BlockQuantized, StochasticRoundingIsUnbiased) {
  const std::vector<float> inputs = gradient_like(kQuantizationBlock, 3);
  for (const ValueEncoding encoding :
       {ValueEncoding::kInt8Stochastic, ValueEncoding::kInt4Stochastic,
        ValueEncoding::kInt2Stochastic}) {
    const float scale = block_scale(inputs, encoding);
    constexpr int kDraws = 4000;
    std::vector<double> mean(inputs.size(), 0.0);
    std::vector<std::byte> bytes(encoded_value_bytes(encoding, inputs.size()));
    for (int draw = 0; draw < kDraws; ++draw) {
      std::vector<float> values = inputs;
      encode_values(values, encoding, bytes, static_cast<std::uint64_t>(draw));
      for (std::size_t j = 0; j < values.size(); ++j) mean[j] += values[j] / double{kDraws};
    }
    // One draw is off by less than a step (scale), so the mean of 4000 has a
    // standard deviation below scale / (2 sqrt(4000)) = scale / 126: allow 5.
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      EXPECT_NEAR(mean[j], inputs[j], 5.0 * scale / 126.0)
          << value_encoding_name(encoding) << " value " << j;
    }
  }
}

TEST(BlockQuantized, StochasticResidualIsWithinOneRounding) {
  const std::vector<float> inputs = gradient_like(5000, 11);
  for (const ValueEncoding encoding :
       {ValueEncoding::kInt8Stochastic, ValueEncoding::kInt4Stochastic,
        ValueEncoding::kInt2Stochastic}) {
    std::vector<float> values = inputs;
    std::vector<std::byte> bytes(encoded_value_bytes(encoding, values.size()));
    encode_values(values, encoding, bytes, 5);
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      const float residual = inputs[j] - values[j];
      const double exact = static_cast<double>(inputs[j]) - values[j];
      EXPECT_LE(std::fabs(exact - residual),
                0.5 * std::fabs(std::nextafter(residual, INFINITY) - residual))
          << value_encoding_name(encoding) << " " << j;
    }
  }
}

TEST(BlockQuantized, TheNonceKeysTheDrawsAndNothingElse) {
  const std::vector<float> inputs = gradient_like(300, 5);
  auto encode = [&](ValueEncoding encoding, std::uint64_t nonce) {
    std::vector<float> values = inputs;
    std::vector<std::byte> bytes(encoded_value_bytes(encoding, values.size()));
    encode_values(values, encoding, bytes, nonce);
    return bytes;
  };
  EXPECT_EQ(encode(ValueEncoding::kInt4Stochastic, 1), encode(ValueEncoding::kInt4Stochastic, 1));
  EXPECT_NE(encode(ValueEncoding::kInt4Stochastic, 1), encode(ValueEncoding::kInt4Stochastic, 2));
  EXPECT_EQ(encode(ValueEncoding::kInt4, 1), encode(ValueEncoding::kInt4, 2));
}

TEST(BlockQuantized, ABlockWithANonFiniteValueDecodesToNanAndTheOthersAreUntouched) {
  std::vector<float> values = gradient_like(256, 9);
  const std::vector<float> inputs = values;
  values[200] = std::numeric_limits<float>::infinity();
  std::vector<std::byte> bytes(encoded_value_bytes(ValueEncoding::kInt8, values.size()));
  encode_values(values, ValueEncoding::kInt8, bytes);
  std::vector<float> decoded(values.size());
  decode_values(bytes, ValueEncoding::kInt8, decoded);
  const float half_step =
      0.5001f * block_scale(std::span<const float>(inputs).first(128), ValueEncoding::kInt8);
  for (std::size_t j = 0; j < 128; ++j) EXPECT_NEAR(decoded[j], inputs[j], half_step) << j;
  for (std::size_t j = 128; j < 256; ++j) EXPECT_TRUE(std::isnan(decoded[j])) << j;
}

TEST(BlockQuantized, SignSendsTheSignsAndEachBlocksMeanMagnitude) {
  const std::vector<float> inputs = gradient_like(300, 13);  // blocks of 128, 128, 44
  std::vector<float> values = inputs;
  std::vector<std::byte> bytes(encoded_value_bytes(ValueEncoding::kSign, values.size()));
  EXPECT_EQ(bytes.size(), 2u * (4u + 16u) + 4u + 6u);
  encode_values(values, ValueEncoding::kSign, bytes);
  std::vector<float> decoded(values.size());
  decode_values(bytes, ValueEncoding::kSign, decoded);
  for (std::size_t first = 0; first < inputs.size(); first += kQuantizationBlock) {
    const std::size_t count = std::min(kQuantizationBlock, inputs.size() - first);
    double mean = 0.0;
    for (std::size_t j = first; j < first + count; ++j) mean += std::fabs(inputs[j]);
    mean /= static_cast<double>(count);
    for (std::size_t j = first; j < first + count; ++j) {
      EXPECT_EQ(bits_of(decoded[j]), bits_of(values[j]));
      EXPECT_FLOAT_EQ(decoded[j], std::copysign(static_cast<float>(mean), inputs[j])) << j;
    }
  }
  std::vector<std::byte> padding = bytes;
  padding.back() |= std::byte{0x80};  // 44 values: bits 4-7 of the last byte are padding
  EXPECT_THROW(decode_values(padding, ValueEncoding::kSign, decoded), CommError);
}

// A block of sign values under 1/4 byte per value (one bit each, a scale per
// 128) holding every coordinate, as signsgd's allgather sends it: the block
// decoder's size guard must let it through.
TEST(BlockQuantized, ABlockOfSignValuesForEveryCoordinateDecodes) {
  const std::vector<float> inputs = gradient_like(4096, 17);
  std::vector<float> values = inputs;
  std::vector<std::byte> block(encoded_value_bytes(ValueEncoding::kSign, values.size()));
  ASSERT_LT(block.size(), values.size() / 4);
  encode_values(values, ValueEncoding::kSign, block);
  std::vector<float> decoded(values.size());
  const BlockFormat format{.values = ValueEncoding::kSign, .begin = 0, .end = values.size()};
  decode_block(block, format, std::span<Index>(), decoded);
  for (std::size_t j = 0; j < values.size(); ++j)
    EXPECT_EQ(bits_of(decoded[j]), bits_of(values[j]));
  block.pop_back();
  EXPECT_THROW(decode_block(block, format, std::span<Index>(), decoded), CommError);
}

// The values a sparsifier selects: the largest tenth of a gradient-like
// stream by magnitude, in index order.
std::vector<float> selected_like(std::size_t count, std::uint32_t seed) {
  std::vector<float> stream = gradient_like(10 * count, seed);
  std::vector<float> magnitudes(stream.size());
  std::transform(stream.begin(), stream.end(), magnitudes.begin(),
                 [](float a) { return std::fabs(a); });
  std::nth_element(magnitudes.begin(), magnitudes.begin() + static_cast<std::ptrdiff_t>(count),
                   magnitudes.end(), std::greater<>());
  const float threshold = magnitudes[count];
  std::vector<float> selected;
  for (const float a : stream) {
    if (std::fabs(a) > threshold) selected.push_back(a);
  }
  return selected;
}

// lloyd2: each value is sent as its sign and the nearer of its block's two
// magnitudes, which are a Lloyd fixed point (each within bf16 rounding of
// the mean |a| of the values sent with it); the residual is within one
// rounding; on selected values the squared error is below int2's,
// which sends the smaller half of them as 0.
TEST(BlockQuantized, Lloyd2SendsEachValueAsTheNearerOfItsBlocksTwoMagnitudes) {
  const std::vector<float> inputs = selected_like(300, 17);  // blocks of 128, 128, 44
  std::vector<float> values = inputs;
  std::vector<std::byte> bytes(encoded_value_bytes(ValueEncoding::kLloyd2, values.size()));
  EXPECT_EQ(bytes.size(), encoded_value_bytes(ValueEncoding::kInt2, values.size()));
  encode_values(values, ValueEncoding::kLloyd2, bytes);
  std::vector<float> decoded(values.size());
  decode_values(bytes, ValueEncoding::kLloyd2, decoded);
  for (std::size_t first = 0, block = 0; first < inputs.size();
       first += kQuantizationBlock, ++block) {
    const std::size_t count = std::min(kQuantizationBlock, inputs.size() - first);
    const std::byte* header = bytes.data() + block * (4 + kQuantizationBlock / 4);
    std::uint16_t pair[2];
    std::memcpy(pair, header, sizeof pair);
    const float lower = bf16_to_float(pair[0]);
    const float upper = bf16_to_float(pair[1]);
    ASSERT_LT(0.0f, lower);
    ASSERT_LT(lower, upper);
    double sums[2] = {0.0, 0.0};
    std::size_t counts[2] = {0, 0};
    for (std::size_t j = first; j < first + count; ++j) {
      const float a = inputs[j];
      EXPECT_EQ(bits_of(decoded[j]), bits_of(values[j]));
      EXPECT_EQ(std::signbit(decoded[j]), std::signbit(a)) << j;
      const float m = std::fabs(decoded[j]);
      ASSERT_TRUE(m == lower || m == upper) << j;
      const float other = m == lower ? upper : lower;
      EXPECT_LE(std::fabs(std::fabs(a) - m), std::fabs(std::fabs(a) - other) * 1.0001f) << j;
      sums[m == upper] += std::fabs(a);
      ++counts[m == upper];
      const float residual = a - values[j];
      const double exact = static_cast<double>(a) - values[j];
      EXPECT_LE(std::fabs(exact - residual),
                0.5 * std::fabs(std::nextafter(residual, INFINITY) - residual))
          << j;
    }
    ASSERT_GT(counts[0], 0u);
    ASSERT_GT(counts[1], 0u);
    EXPECT_NEAR(lower, sums[0] / static_cast<double>(counts[0]), lower * 0x1p-7) << block;
    EXPECT_NEAR(upper, sums[1] / static_cast<double>(counts[1]), upper * 0x1p-7) << block;
  }
  auto squared_error = [&](ValueEncoding encoding) {
    std::vector<float> sent = inputs;
    std::vector<std::byte> wire(encoded_value_bytes(encoding, sent.size()));
    encode_values(sent, encoding, wire);
    double error = 0.0;
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      error += (static_cast<double>(inputs[j]) - sent[j]) * (inputs[j] - sent[j]);
    }
    return error;
  };
  EXPECT_LT(squared_error(ValueEncoding::kLloyd2), 0.8 * squared_error(ValueEncoding::kInt2));
}

TEST(BlockQuantized, Lloyd2HandlesEqualZeroAndNonFiniteBlocks) {
  auto round_trip = [](std::vector<float> values) {
    std::vector<std::byte> bytes(encoded_value_bytes(ValueEncoding::kLloyd2, values.size()));
    encode_values(values, ValueEncoding::kLloyd2, bytes);
    std::vector<float> decoded(values.size());
    decode_values(bytes, ValueEncoding::kLloyd2, decoded);
    for (std::size_t j = 0; j < values.size(); ++j) {
      EXPECT_EQ(bits_of(decoded[j]), bits_of(values[j])) << j;
    }
    return decoded;
  };
  EXPECT_EQ(round_trip({2.0f, -2.0f, 2.0f}), (std::vector<float>{2.0f, -2.0f, 2.0f}));
  EXPECT_EQ(round_trip({0.0f, 0.0f}), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(round_trip({0.5f}), (std::vector<float>{0.5f}));
  // Magnitude sums past the float limit: the pair stays finite.
  const std::vector<float> huge = round_trip({3e38f, -3.3e38f, 3.2e38f, 1.0f});
  for (const float d : huge) EXPECT_TRUE(std::isfinite(d));
  const std::vector<float> with_nan = round_trip({1.0f, NAN, -3.0f});
  for (const float d : with_nan) EXPECT_TRUE(std::isnan(d));
  const std::vector<float> with_inf = round_trip({1.0f, -INFINITY, -3.0f});
  for (const float d : with_inf) EXPECT_TRUE(std::isnan(d));
}

TEST(BlockQuantized, Lloyd2DecoderRejectsMalformedBlocks) {
  std::vector<float> values = {1.0f, -4.0f, 0.5f};
  // 3 values: [lower, upper: bf16][one byte: codes at bits 0-1, 2-3, 4-5].
  std::vector<std::byte> good(encoded_value_bytes(ValueEncoding::kLloyd2, 3));
  ASSERT_EQ(good.size(), 5u);
  encode_values(values, ValueEncoding::kLloyd2, good);
  std::vector<float> out(3);
  decode_values(good, ValueEncoding::kLloyd2, out);  // accepted
  auto with_pair = [&](float lower, float upper) {
    std::vector<std::byte> bytes = good;
    const std::uint16_t pair[2] = {float_to_bf16(lower), float_to_bf16(upper)};
    std::memcpy(bytes.data(), pair, sizeof pair);
    return bytes;
  };
  auto rejects = [&](const std::vector<std::byte>& bytes, const char* what) {
    try {
      decode_values(bytes, ValueEncoding::kLloyd2, out);
      ADD_FAILURE() << what << " accepted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("lloyd2"), std::string::npos) << e.what();
    }
  };
  decode_values(with_pair(NAN, NAN), ValueEncoding::kLloyd2, out);  // a non-finite block
  decode_values(with_pair(2.0f, 2.0f), ValueEncoding::kLloyd2, out);
  rejects(with_pair(-1.0f, 2.0f), "a negative lower magnitude");
  rejects(with_pair(-0.0f, 2.0f), "a negative zero");
  rejects(with_pair(3.0f, 2.0f), "a lower magnitude above the upper");
  rejects(with_pair(1.0f, INFINITY), "an infinite upper magnitude");
  rejects(with_pair(NAN, 2.0f), "one NaN without the other");
  std::vector<std::byte> padding = good;
  padding[4] |= std::byte{0x40};
  rejects(padding, "nonzero padding");
}

TEST(BlockQuantized, DecoderRejectsMalformedBlocks) {
  std::vector<float> values = gradient_like(3, 1);
  // int2, 3 values: [scale][one byte: codes at bits 0-1, 2-3, 4-5; 6-7 padding].
  std::vector<std::byte> good(encoded_value_bytes(ValueEncoding::kInt2, 3));
  ASSERT_EQ(good.size(), 5u);
  encode_values(values, ValueEncoding::kInt2, good);
  std::vector<float> out(3);
  decode_values(good, ValueEncoding::kInt2, out);  // accepted
  auto rejects = [&](std::vector<std::byte> bytes, ValueEncoding encoding, const char* what) {
    std::vector<float> decoded(3);
    try {
      decode_values(bytes, encoding, decoded);
      ADD_FAILURE() << what << " accepted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("decode_values"), std::string::npos) << e.what();
    }
  };
  auto with_scale = [&](float scale) {
    std::vector<std::byte> bytes = good;
    std::memcpy(bytes.data(), &scale, sizeof scale);
    return bytes;
  };
  rejects(with_scale(-1.0f), ValueEncoding::kInt2, "a negative scale");
  rejects(with_scale(-0.0f), ValueEncoding::kInt2, "a negative zero scale");
  rejects(with_scale(INFINITY), ValueEncoding::kInt2, "an infinite scale");
  std::vector<std::byte> code3 = good;
  code3[4] |= std::byte{0x03};  // code 3: beyond {-1, 0, 1}
  rejects(code3, ValueEncoding::kInt2, "int2 code 3");
  std::vector<std::byte> padding = good;
  padding[4] |= std::byte{0x40};
  rejects(padding, ValueEncoding::kInt2, "nonzero padding");
  std::vector<std::byte> int8(encoded_value_bytes(ValueEncoding::kInt8, 3));
  int8[5] = std::byte{0xFF};  // code 255: beyond the 255 levels 0..254
  rejects(int8, ValueEncoding::kInt8, "int8 code 255");
  rejects(std::vector<std::byte>(6), ValueEncoding::kInt2, "a wrong size");
}

// nat: every decoded value is 0 or +-a power of two next to its input (the
// one below or above), the mean over many draws is the input (unbiased),
// and the block's scale is the largest power sent.
TEST(BlockQuantized, NaturalCompressionRoundsToAPowerOfTwoNextToEachValueUnbiased) {
  std::vector<float> inputs = gradient_like(kQuantizationBlock, 17);
  inputs[5] = 0.0f;
  inputs[6] = 0x1p-3f;     // a power of two is sent as itself
  inputs[7] = -0x1p-140f;  // more than 2^126 below the block's largest: sent as 0
  inputs[8] = 1000.0f;
  constexpr int kDraws = 4000;
  std::vector<double> mean(inputs.size(), 0.0);
  std::vector<std::byte> bytes(encoded_value_bytes(ValueEncoding::kNatural, inputs.size()));
  std::vector<float> decoded(inputs.size());
  for (int draw = 0; draw < kDraws; ++draw) {
    std::vector<float> values = inputs;
    encode_values(values, ValueEncoding::kNatural, bytes, static_cast<std::uint64_t>(draw));
    decode_values(bytes, ValueEncoding::kNatural, decoded);
    float scale = 0.0f;
    std::memcpy(&scale, bytes.data(), sizeof scale);
    float largest = 0.0f;
    for (std::size_t j = 0; j < values.size(); ++j) {
      ASSERT_EQ(bits_of(decoded[j]), bits_of(values[j])) << j;
      largest = std::max(largest, std::fabs(values[j]));
      mean[j] += values[j] / double{kDraws};
      const float a = inputs[j];
      if (a == 0.0f || j == 7) {
        ASSERT_EQ(values[j], 0.0f) << j;
        continue;
      }
      int exponent = 0;
      std::frexp(a, &exponent);
      const float below = std::copysign(std::ldexp(1.0f, exponent - 1), a);
      ASSERT_TRUE(values[j] == below || values[j] == 2.0f * below) << a << " -> " << values[j];
    }
    ASSERT_EQ(scale, largest);
    ASSERT_EQ(decoded[6], 0x1p-3f);
  }
  // A draw is off by less than |a| (the distance between the two powers), so
  // the mean of 4000 has a standard deviation below |a| / (2 sqrt(4000)):
  // allow 5 of them.
  for (std::size_t j = 0; j < inputs.size(); ++j) {
    if (j == 7) continue;
    EXPECT_NEAR(mean[j], inputs[j], 5.0 * std::fabs(inputs[j]) / 126.0) << j;
  }
}

TEST(BlockQuantized, NaturalCompressionDecoderRejectsMalformedBlocks) {
  std::vector<float> values = {0.75f, -3.0f, 0.0f};
  std::vector<std::byte> good(encoded_value_bytes(ValueEncoding::kNatural, 3));
  ASSERT_EQ(good.size(), 7u);
  encode_values(values, ValueEncoding::kNatural, good, 1);
  std::vector<float> out(3);
  decode_values(good, ValueEncoding::kNatural, out);  // accepted
  EXPECT_EQ(out[2], 0.0f);
  auto rejected = [&](std::vector<std::byte> bytes) {
    try {
      decode_values(bytes, ValueEncoding::kNatural, out);
    } catch (const CommError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto with_scale = [&](float scale) {
    std::vector<std::byte> bytes = good;
    std::memcpy(bytes.data(), &scale, sizeof scale);
    return bytes;
  };
  EXPECT_NE(rejected(with_scale(3.0f)).find("not 0, a power of two or NaN"), std::string::npos);
  EXPECT_NE(rejected(with_scale(-4.0f)).find("not 0, a power of two"), std::string::npos);
  EXPECT_NE(rejected(with_scale(INFINITY)).find("not 0, a power of two"), std::string::npos);
  std::vector<std::byte> negative_zero = good;
  negative_zero[6] = std::byte{0xFF};  // the zero code with the sign bit
  EXPECT_NE(rejected(negative_zero).find("nat code 0xff"), std::string::npos);
  std::vector<std::byte> zero_block = with_scale(0.0f);  // codes of values in an empty block
  EXPECT_NE(rejected(zero_block).find("is not a value of a block with scale 0"), std::string::npos);
  // NaN scale: the block held a non-finite value and decodes to NaN.
  values = {1.0f, NAN, 2.0f};
  encode_values(values, ValueEncoding::kNatural, good, 1);
  decode_values(good, ValueEncoding::kNatural, out);
  for (const float v : out) EXPECT_TRUE(std::isnan(v));
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
