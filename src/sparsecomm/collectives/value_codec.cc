#include "sparsecomm/collectives/value_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"

// fp16 and bf16 are converted in plain scalar code (no F16C needed) with
// round-to-nearest-even. Out-of-range finite values saturate to the largest
// finite value of the format, so no finite gradient ever becomes inf. NaN
// stays NaN: the top mantissa bits are kept and the quiet bit is set only
// when the kept bits would be zero (so every 16-bit NaN pattern survives a
// round trip through float unchanged).
//
// The intB codecs write each block of up to kQuantizationBlock values as
// [scale: float32, little-endian][codes: B bits each, value j at bit B*j,
// low bits first, the last byte's unused bits zero]. A code c stands for
// q = c - L, L = 2^(B-1) - 1, so 2L + 1 of the 2^B codes are used and the
// decoder rejects the rest. scale = max|a| / L over the block (0 for an
// all-zero block, NaN for one holding a non-finite value). Round to
// nearest keeps a - q*scale exact: for q != 0 the decoded value lies within
// a factor of 2 of a (Sterbenz); the encoder checks the identity and sends
// 0 in the one case float rounding can break it (a just below scale/2,
// where 0 is as near). Stochastic rounding
// draws u in [0, 1) from Philox(nonce) at counter (block, position / 4) and
// rounds a/scale up with probability equal to its fraction. sign writes
// [scale = mean |a| over the block][one bit per value, set for a >= 0 (and
// +0)], decoded as +-scale. lloyd2 writes [lower, upper: bf16 each, the
// magnitudes][2 bits per value: bit 0 set for the upper magnitude, bit 1 for
// a negative value]; the magnitudes are Lloyd's iteration on |a| (start at
// the smallest and largest, split at their midpoint, each becomes its
// side's mean, until the split stops moving), rounded to bf16, each value
// then sent as the nearer of the two rounded magnitudes.

namespace sparsecomm {
namespace {

constexpr std::uint32_t kSignMask = 0x80000000u;
constexpr std::uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr std::uint32_t kFloatInf = 0x7F800000u;
// fp16: |x| >= 65520 (the midpoint between 65504 and 2^16) would round to inf.
constexpr std::uint32_t kFp16Overflow = 0x477FF000u;
// fp16: smallest normal 2^-14; everything <= 2^-25 rounds to zero.
constexpr std::uint32_t kFp16MinNormal = 0x38800000u;
constexpr std::uint32_t kFp16HalfMinSubnormal = 0x33000000u;
constexpr std::uint16_t kFp16Max = 0x7BFF;  // 65504
// bf16: |x| >= the midpoint between the largest bf16 and 2^128 rounds to inf.
constexpr std::uint32_t kBf16Overflow = 0x7F7F8000u;
constexpr std::uint16_t kBf16Max = 0x7F7F;

// The largest fp16 magnitude v <= 65504 such that |a| - v is exact in float,
// for a finite |a| that saturates: 65504 while ulp(a) <= 32, then
// 65536 - ulp(a) (a multiple of ulp(a)), and 0 once ulp(a) exceeds 2^15.
float exact_fp16_saturation(std::uint32_t abs_bits) {
  const int ulp_exponent = static_cast<int>(abs_bits >> 23) - 127 - 23;
  if (ulp_exponent <= 5) return 65504.0f;
  if (ulp_exponent <= 15) return 65536.0f - std::ldexp(1.0f, ulp_exponent);
  return 0.0f;
}

void store16(std::byte* out, std::uint16_t bits) { std::memcpy(out, &bits, sizeof bits); }
std::uint16_t load16(const std::byte* in) {
  std::uint16_t bits = 0;
  std::memcpy(&bits, in, sizeof bits);
  return bits;
}

}  // namespace

namespace {

struct EncodingName {
  ValueEncoding encoding;
  std::string_view name;
};
constexpr EncodingName kEncodingNames[] = {
    {ValueEncoding::kFloat32, "fp32"},
    {ValueEncoding::kFloat16, "fp16"},
    {ValueEncoding::kBFloat16, "bf16"},
    {ValueEncoding::kInt8, "int8"},
    {ValueEncoding::kInt4, "int4"},
    {ValueEncoding::kInt2, "int2"},
    {ValueEncoding::kInt8Stochastic, "int8-sr"},
    {ValueEncoding::kInt4Stochastic, "int4-sr"},
    {ValueEncoding::kInt2Stochastic, "int2-sr"},
    {ValueEncoding::kSign, "sign"},
    {ValueEncoding::kNatural, "nat"},
    {ValueEncoding::kLloyd2, "lloyd2"},
};

// Bits per code of an intB codec; 0 for the others.
unsigned code_bits(ValueEncoding encoding) {
  switch (encoding) {
    case ValueEncoding::kInt8:
    case ValueEncoding::kInt8Stochastic:
    case ValueEncoding::kNatural:
      return 8;
    case ValueEncoding::kInt4:
    case ValueEncoding::kInt4Stochastic:
      return 4;
    case ValueEncoding::kInt2:
    case ValueEncoding::kInt2Stochastic:
    case ValueEncoding::kLloyd2:
      return 2;
    case ValueEncoding::kSign:
      return 1;
    default:
      return 0;
  }
}

std::size_t code_bytes(unsigned bits, std::size_t count) { return (count * bits + 7) / 8; }

}  // namespace

ValueEncoding parse_value_encoding(std::string_view name) {
  for (const EncodingName& entry : kEncodingNames) {
    if (entry.name == name) return entry.encoding;
  }
  throw InvalidArgument(fmt::format("[codec] unknown value encoding '{}' (valid: {})", name,
                                    fmt::join(value_encoding_names(), ", ")));
}

std::string_view value_encoding_name(ValueEncoding encoding) {
  for (const EncodingName& entry : kEncodingNames) {
    if (entry.encoding == encoding) return entry.name;
  }
  return "unknown";
}

const std::vector<std::string>& value_encoding_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    for (const EncodingName& entry : kEncodingNames) list.emplace_back(entry.name);
    return list;
  }();
  return names;
}

bool is_block_quantized(ValueEncoding encoding) { return code_bits(encoding) != 0; }

bool keeps_residual_exact(ValueEncoding encoding) {
  return encoding == ValueEncoding::kNatural ||
         (!is_stochastic(encoding) && encoding != ValueEncoding::kSign &&
          encoding != ValueEncoding::kLloyd2);
}

bool is_stochastic(ValueEncoding encoding) {
  return encoding == ValueEncoding::kInt8Stochastic || encoding == ValueEncoding::kInt4Stochastic ||
         encoding == ValueEncoding::kInt2Stochastic || encoding == ValueEncoding::kNatural;
}

std::size_t encoded_value_bytes(ValueEncoding encoding, std::size_t count) {
  const unsigned bits = code_bits(encoding);
  if (bits == 0) return count * (encoding == ValueEncoding::kFloat32 ? 4 : 2);
  const std::size_t full = count / kQuantizationBlock;
  const std::size_t rest = count % kQuantizationBlock;
  return full * (sizeof(float) + code_bytes(bits, kQuantizationBlock)) +
         (rest > 0 ? sizeof(float) + code_bytes(bits, rest) : 0);
}

std::size_t fixed_value_bytes(ValueEncoding encoding, std::string_view what) {
  if (is_block_quantized(encoding)) {
    throw InvalidArgument(fmt::format(
        "[codec] {} sends fp32, fp16 or bf16 values, not {} (its values are encoded in blocks "
        "of {} with one scale each)",
        what, value_encoding_name(encoding), kQuantizationBlock));
  }
  return encoding == ValueEncoding::kFloat32 ? 4 : 2;
}

double wire_bits_per_value(ValueEncoding encoding) {
  const unsigned bits = code_bits(encoding);
  if (bits == 0) return encoding == ValueEncoding::kFloat32 ? 32.0 : 16.0;
  return bits + 32.0 / static_cast<double>(kQuantizationBlock);
}

std::uint16_t float_to_fp16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits & kSignMask) >> 16);
  const std::uint32_t abs = bits & kAbsMask;
  if (abs > kFloatInf) {  // NaN: keep the top payload bits, make sure it stays a NaN
    auto payload = static_cast<std::uint16_t>((abs >> 13) & 0x3FFu);
    if (payload == 0) payload = 0x200;
    return static_cast<std::uint16_t>(sign | 0x7C00u | payload);
  }
  if (abs == kFloatInf) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (abs >= kFp16Overflow) return static_cast<std::uint16_t>(sign | kFp16Max);
  if (abs >= kFp16MinNormal) {
    // Rebias the exponent, keep 10 mantissa bits, round the 13 dropped ones
    // to nearest even (a carry into the exponent is the right result).
    std::uint32_t half = ((abs >> 23) - 127 + 15) << 10 | ((abs >> 13) & 0x3FFu);
    const std::uint32_t rest = abs & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  if (abs <= kFp16HalfMinSubnormal) return sign;  // rounds to (signed) zero
  // Subnormal fp16: the value in units of 2^-24, rounded to nearest even.
  const std::uint32_t exponent = abs >> 23;  // 102..112 here
  const std::uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126 - exponent;  // 14..24
  std::uint32_t half = mantissa >> shift;
  const std::uint32_t rest = mantissa & ((1u << shift) - 1);
  const std::uint32_t midpoint = 1u << (shift - 1);
  if (rest > midpoint || (rest == midpoint && (half & 1u) != 0)) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

float fp16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | kFloatInf | (mantissa << 13));
  if (exponent != 0)
    return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
}

std::uint16_t float_to_bf16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t abs = bits & kAbsMask;
  const auto sign = static_cast<std::uint16_t>((bits & kSignMask) >> 16);
  if (abs > kFloatInf) {
    auto top = static_cast<std::uint16_t>(bits >> 16);
    if ((top & 0x7Fu) == 0) top = static_cast<std::uint16_t>(top | 0x40u);
    return top;
  }
  if (abs == kFloatInf) return static_cast<std::uint16_t>(bits >> 16);
  if (abs >= kBf16Overflow) return static_cast<std::uint16_t>(sign | kBf16Max);
  // Round to nearest even on the 16 dropped bits (carries propagate into the
  // exponent, subnormals included).
  const std::uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

namespace {

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

void check_value_bytes(std::size_t have, ValueEncoding encoding, std::size_t count, bool decoding) {
  const std::size_t need = encoded_value_bytes(encoding, count);
  if (have == need) return;
  const std::string message = fmt::format("[codec] {}: {} {} values need {} bytes, got {}",
                                          decoding ? "decode_values" : "encode_values", count,
                                          value_encoding_name(encoding), need, have);
  if (decoding) throw CommError(message);
  throw InvalidArgument(message);
}

}  // namespace

void encode_values(std::span<float> values, ValueEncoding encoding, std::span<std::byte> out,
                   std::uint64_t nonce) {
  check_value_bytes(out.size(), encoding, values.size(), /*decoding=*/false);
  switch (encoding) {
    case ValueEncoding::kFloat32:
      if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
      return;
    case ValueEncoding::kFloat16:
      for (std::size_t i = 0; i < values.size(); ++i) {
        const float a = values[i];
        std::uint16_t bits = float_to_fp16(a);
        if ((bits & 0x7FFFu) == kFp16Max && std::isfinite(a) && std::fabs(a) > 65504.0f) {
          // Saturated: send a value whose difference to a is exact, so the
          // residual a - decoded keeps exactly what was not sent.
          bits = float_to_fp16(
              std::copysign(exact_fp16_saturation(std::bit_cast<std::uint32_t>(a) & kAbsMask), a));
        }
        store16(out.data() + 2 * i, bits);
        values[i] = fp16_to_float(bits);
      }
      return;
    case ValueEncoding::kBFloat16:
      for (std::size_t i = 0; i < values.size(); ++i) {
        const std::uint16_t bits = float_to_bf16(values[i]);
        store16(out.data() + 2 * i, bits);
        values[i] = bf16_to_float(bits);
      }
      return;
    default:
      break;
  }
  const unsigned bits = code_bits(encoding);
  const Philox rng(nonce);
  std::byte* at = out.data();
  for (std::size_t first = 0, block = 0; first < values.size();
       first += kQuantizationBlock, ++block) {
    const std::size_t count = std::min(kQuantizationBlock, values.size() - first);
    if (encoding == ValueEncoding::kSign) {
      sign_block(values.subspan(first, count), at);
    } else if (encoding == ValueEncoding::kNatural) {
      natural_block(values.subspan(first, count), rng, block, at);
    } else if (encoding == ValueEncoding::kLloyd2) {
      lloyd2_block(values.subspan(first, count), at);
    } else {
      quantize_block(values.subspan(first, count), bits, is_stochastic(encoding), &rng, block, at);
    }
    at += sizeof(float) + code_bytes(bits, count);
  }
}

void decode_values(std::span<const std::byte> in, ValueEncoding encoding, std::span<float> out) {
  check_value_bytes(in.size(), encoding, out.size(), /*decoding=*/true);
  switch (encoding) {
    case ValueEncoding::kFloat32:
      if (!out.empty()) std::memcpy(out.data(), in.data(), in.size());
      return;
    case ValueEncoding::kFloat16:
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = fp16_to_float(load16(in.data() + 2 * i));
      return;
    case ValueEncoding::kBFloat16:
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = bf16_to_float(load16(in.data() + 2 * i));
      return;
    default:
      break;
  }
  const unsigned bits = code_bits(encoding);
  const std::byte* at = in.data();
  for (std::size_t first = 0; first < out.size(); first += kQuantizationBlock) {
    const std::size_t count = std::min(kQuantizationBlock, out.size() - first);
    if (encoding == ValueEncoding::kSign) {
      unsign_block(at, out.subspan(first, count));
    } else if (encoding == ValueEncoding::kNatural) {
      unnatural_block(at, out.subspan(first, count));
    } else if (encoding == ValueEncoding::kLloyd2) {
      unlloyd2_block(at, out.subspan(first, count));
    } else {
      dequantize_block(at, bits, out.subspan(first, count));
    }
    at += sizeof(float) + code_bytes(bits, count);
  }
}

}  // namespace sparsecomm
