#include "sparsecomm/collectives/block_codecs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::value_blocks {

// One block of an intB codec (see the top of this file): encodes `block`
// into `out` (4 + code_bytes(bits, block.size()) bytes) and replaces each
// value by its decoded value.
void quantize_block(std::span<float> block, unsigned bits, bool stochastic, const Philox* rng,
                    std::uint64_t block_number, std::byte* out) {
  const int levels = (1 << (bits - 1)) - 1;  // L
  float largest = 0.0f;
  bool finite = true;
  for (const float a : block) {
    finite = finite && std::isfinite(a);
    largest = std::max(largest, std::fabs(a));
  }
  const float scale =
      !finite ? std::numeric_limits<float>::quiet_NaN() : largest / static_cast<float>(levels);
  std::memcpy(out, &scale, sizeof scale);
  std::byte* codes = out + sizeof scale;
  std::memset(codes, 0, code_bytes(bits, block.size()));
  Philox::Block draws{};
  for (std::size_t j = 0; j < block.size(); ++j) {
    int q = 0;
    if (finite && scale > 0.0f) {
      const float a = block[j];
      const float x = a / scale;
      if (stochastic) {
        if (j % 4 == 0) draws = rng->block(block_number, j / 4);
        const float u = static_cast<float>(draws[j % 4] >> 8) * 0x1p-24f;  // [0, 1)
        const float below = std::floor(x);
        q = static_cast<int>(below) + (u < x - below ? 1 : 0);
      } else {
        q = static_cast<int>(std::nearbyint(x));
      }
      q = std::clamp(q, -levels, levels);
      // Round to nearest keeps the residual exact; where float rounding put
      // a just below scale/2 onto level 1 it may not be, and 0 is as near.
      const float decoded = static_cast<float>(q) * scale;
      if (!stochastic && (a - decoded) + decoded != a) q = 0;
    }
    const auto code = static_cast<unsigned>(q + levels);
    const std::size_t bit = j * bits;
    codes[bit / 8] |= static_cast<std::byte>((code << (bit % 8)) & 0xFFu);
    // What dequantize_block computes from the bytes (NaN for a NaN scale).
    block[j] = static_cast<float>(q) * scale;
  }
}

// Decodes one block (4 + code_bytes(bits, out.size()) bytes at `in`).
void dequantize_block(const std::byte* in, unsigned bits, std::span<float> out) {
  const int levels = (1 << (bits - 1)) - 1;
  float scale = 0.0f;
  std::memcpy(&scale, in, sizeof scale);
  if (std::signbit(scale) || std::isinf(scale)) {
    throw CommError(
        fmt::format("[codec] decode_values: an int{} block's scale {} is not a finite "
                    "non-negative number",
                    bits, scale));
  }
  const std::byte* codes = in + sizeof scale;
  const unsigned mask = (1u << bits) - 1u;
  for (std::size_t j = 0; j < out.size(); ++j) {
    const std::size_t bit = j * bits;
    const unsigned code = (std::to_integer<unsigned>(codes[bit / 8]) >> (bit % 8)) & mask;
    if (code > static_cast<unsigned>(2 * levels)) {
      throw CommError(fmt::format("[codec] decode_values: int{} code {} is beyond the {} levels",
                                  bits, code, 2 * levels + 1));
    }
    out[j] = static_cast<float>(static_cast<int>(code) - levels) * scale;
  }
  const std::size_t used_bits = out.size() * bits;
  if (used_bits % 8 != 0) {
    const unsigned padding = std::to_integer<unsigned>(codes[used_bits / 8]) >> (used_bits % 8);
    if (padding != 0) {
      throw CommError(
          fmt::format("[codec] decode_values: an int{} block's padding bits are not zero", bits));
    }
  }
}

// One block of sign: [scale = mean |a|][one bit per value, set for a >= 0].
void sign_block(std::span<float> block, std::byte* out) {
  double magnitude = 0.0;
  bool finite = true;
  for (const float a : block) {
    finite = finite && std::isfinite(a);
    magnitude += std::fabs(static_cast<double>(a));
  }
  const float scale = !finite ? std::numeric_limits<float>::quiet_NaN()
                              : static_cast<float>(magnitude / static_cast<double>(block.size()));
  std::memcpy(out, &scale, sizeof scale);
  std::byte* codes = out + sizeof scale;
  // A byte of eight signs at a time, built in a register.
  for (std::size_t first = 0; first < block.size(); first += 8) {
    const std::size_t count = std::min<std::size_t>(8, block.size() - first);
    unsigned byte = 0;
    for (std::size_t j = 0; j < count; ++j) {
      const bool positive = !std::signbit(block[first + j]);
      byte |= static_cast<unsigned>(positive) << j;
      block[first + j] = positive ? scale : -scale;
    }
    codes[first / 8] = static_cast<std::byte>(byte);
  }
}

void unsign_block(const std::byte* in, std::span<float> out) {
  float scale = 0.0f;
  std::memcpy(&scale, in, sizeof scale);
  if (std::signbit(scale) || std::isinf(scale)) {
    throw CommError(fmt::format(
        "[codec] decode_values: a sign block's scale {} is not a finite non-negative number",
        scale));
  }
  const std::byte* codes = in + sizeof scale;
  const float both[2] = {-scale, scale};
  for (std::size_t first = 0; first < out.size(); first += 8) {
    const std::size_t count = std::min<std::size_t>(8, out.size() - first);
    const auto byte = std::to_integer<unsigned>(codes[first / 8]);
    for (std::size_t j = 0; j < count; ++j) out[first + j] = both[(byte >> j) & 1u];
  }
  if (out.size() % 8 != 0 &&
      (std::to_integer<unsigned>(codes[out.size() / 8]) >> (out.size() % 8)) != 0) {
    throw CommError("[codec] decode_values: a sign block's padding bits are not zero");
  }
}

// One block of lloyd2 (see the top of this file).
void lloyd2_block(std::span<float> block, std::byte* out) {
  bool finite = true;
  float smallest = std::numeric_limits<float>::infinity();
  float largest = 0.0f;
  for (const float a : block) {
    finite = finite && std::isfinite(a);
    smallest = std::min(smallest, std::fabs(a));
    largest = std::max(largest, std::fabs(a));
  }
  float lower = smallest;
  float upper = largest;
  // Lloyd's iteration in one dimension: a split that stops moving is a
  // fixed point, reached in a few rounds (capped for safety).
  for (int round = 0; round < 32 && finite && lower < upper; ++round) {
    const float split = lower + 0.5f * (upper - lower);
    // Branch-free so that it vectorizes; float sums of at most 128 terms.
    float below_sum = 0.0f;
    float above_sum = 0.0f;
    float below_count = 0.0f;
    for (const float a : block) {
      const float m = std::fabs(a);
      const bool below = m < split;
      below_sum += below ? m : 0.0f;
      above_sum += below ? 0.0f : m;
      below_count += below ? 1.0f : 0.0f;
    }
    const float above_count = static_cast<float>(block.size()) - below_count;
    const float next_lower = below_count > 0.0f ? below_sum / below_count : lower;
    const float next_upper = above_count > 0.0f ? above_sum / above_count : upper;
    // Sums near the float limit overflow: keep the last finite pair.
    if (!std::isfinite(next_lower) || !std::isfinite(next_upper)) break;
    if (next_lower == lower && next_upper == upper) break;
    lower = next_lower;
    upper = next_upper;
  }
  const std::uint16_t lower_bits =
      finite ? float_to_bf16(lower) : float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  const std::uint16_t upper_bits = finite ? float_to_bf16(upper) : lower_bits;
  store16(out, lower_bits);
  store16(out + 2, upper_bits);
  const float magnitudes[2] = {bf16_to_float(lower_bits), bf16_to_float(upper_bits)};
  const float split = magnitudes[0] + 0.5f * (magnitudes[1] - magnitudes[0]);
  std::byte* codes = out + 4;
  std::memset(codes, 0, code_bytes(2, block.size()));
  for (std::size_t j = 0; j < block.size(); ++j) {
    const float a = block[j];
    const unsigned upper_level = std::fabs(a) >= split ? 1u : 0u;
    const unsigned negative = std::signbit(a) ? 1u : 0u;
    const unsigned code = upper_level | negative << 1;
    codes[j / 4] |= static_cast<std::byte>(code << (2 * (j % 4)));
    // What unlloyd2_block computes from the bytes (NaN for a NaN pair).
    block[j] = negative != 0 ? -magnitudes[upper_level] : magnitudes[upper_level];
  }
}

void unlloyd2_block(const std::byte* in, std::span<float> out) {
  const float lower = bf16_to_float(load16(in));
  const float upper = bf16_to_float(load16(in + 2));
  const bool nan_pair = std::isnan(lower) && std::isnan(upper);
  if (!nan_pair && (std::isnan(lower) || std::isnan(upper) || std::signbit(lower) ||
                    std::signbit(upper) || std::isinf(upper) || lower > upper)) {
    throw CommError(
        fmt::format("[codec] decode_values: a lloyd2 block's magnitudes {} and {} are not finite, "
                    "non-negative and ascending",
                    lower, upper));
  }
  const std::byte* codes = in + 4;
  const float levels[4] = {lower, upper, -lower, -upper};
  for (std::size_t j = 0; j < out.size(); ++j) {
    const unsigned code = (std::to_integer<unsigned>(codes[j / 4]) >> (2 * (j % 4))) & 3u;
    out[j] = levels[code];
  }
  if (out.size() % 4 != 0 &&
      (std::to_integer<unsigned>(codes[out.size() / 4]) >> (2 * (out.size() % 4))) != 0) {
    throw CommError("[codec] decode_values: a lloyd2 block's padding bits are not zero");
  }
}

// One block of nat: [scale: the largest power of two sent, 0 when none, NaN
// for a block holding a non-finite value][one byte per value: bit 7 its
// sign, bits 0-6 k, the value +-scale 2^-k; k = 127 is zero].
constexpr unsigned kNaturalZero = 127;

void natural_block(std::span<float> block, const Philox& rng, std::uint64_t block_number,
                   std::byte* out) {
  bool finite = true;
  for (const float a : block) finite = finite && std::isfinite(a);
  // Each |a| in [2^e, 2^(e+1)) goes up with probability (|a| - 2^e) / 2^e:
  // unbiased; a - (the power) is exact in float (Sterbenz).
  float scale = 0.0f;
  Philox::Block draws{};
  for (std::size_t j = 0; j < block.size() && finite; ++j) {
    if (j % 4 == 0) draws = rng.block(block_number, j / 4);
    const float magnitude = std::fabs(block[j]);
    if (magnitude == 0.0f) continue;
    int exponent = 0;
    std::frexp(magnitude, &exponent);
    const float below = std::ldexp(1.0f, exponent - 1);
    const float u = static_cast<float>(draws[j % 4] >> 8) * 0x1p-24f;  // [0, 1)
    const float above = 2.0f * below;
    const float power = u < (magnitude - below) / below && std::isfinite(above) ? above : below;
    block[j] = std::copysign(power, block[j]);
    scale = std::max(scale, power);
  }
  if (!finite) scale = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(out, &scale, sizeof scale);
  std::byte* codes = out + sizeof scale;
  int scale_exponent = 0;
  if (finite && scale > 0.0f) std::frexp(scale, &scale_exponent);
  for (std::size_t j = 0; j < block.size(); ++j) {
    unsigned code = kNaturalZero;
    if (finite && block[j] != 0.0f) {
      int exponent = 0;
      std::frexp(block[j], &exponent);
      const auto k = static_cast<unsigned>(scale_exponent - exponent);
      if (k < kNaturalZero) code = k | (std::signbit(block[j]) ? 0x80u : 0u);
    }
    codes[j] = static_cast<std::byte>(code);
    // What unnatural_block computes from the bytes.
    block[j] = !finite ? scale
               : code == kNaturalZero
                   ? 0.0f
                   : std::copysign(std::ldexp(scale, -static_cast<int>(code & 0x7Fu)),
                                   (code & 0x80u) != 0 ? -1.0f : 1.0f);
  }
}

void unnatural_block(const std::byte* in, std::span<float> out) {
  float scale = 0.0f;
  std::memcpy(&scale, in, sizeof scale);
  int exponent = 0;
  if (std::signbit(scale) || std::isinf(scale) ||
      (std::isfinite(scale) && scale != 0.0f && std::frexp(scale, &exponent) != 0.5f)) {
    throw CommError(fmt::format(
        "[codec] decode_values: a nat block's scale {} is not 0, a power of two or NaN", scale));
  }
  const std::byte* codes = in + sizeof scale;
  for (std::size_t j = 0; j < out.size(); ++j) {
    const auto code = std::to_integer<unsigned>(codes[j]);
    const unsigned k = code & 0x7Fu;
    if (code == (0x80u | kNaturalZero) || (scale == 0.0f && code != kNaturalZero)) {
      throw CommError(fmt::format(
          "[codec] decode_values: nat code {:#04x} is not a value of a block with scale {}", code,
          scale));
    }
    out[j] = std::isnan(scale)   ? scale
             : k == kNaturalZero ? 0.0f
                                 : std::copysign(std::ldexp(scale, -static_cast<int>(k)),
                                                 (code & 0x80u) != 0 ? -1.0f : 1.0f);
  }
}

}  // namespace sparsecomm::value_blocks
