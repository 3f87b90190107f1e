#include "sparsecomm/collectives/value_codec.h"

#include "sparsecomm/collectives/block_codecs.h"

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
//
// The block codecs (intB, sign, lloyd2, nat) are in block_codecs.h.

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
  return full * (sizeof(float) + value_blocks::code_bytes(bits, kQuantizationBlock)) +
         (rest > 0 ? sizeof(float) + value_blocks::code_bytes(bits, rest) : 0);
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
        value_blocks::store16(out.data() + 2 * i, bits);
        values[i] = fp16_to_float(bits);
      }
      return;
    case ValueEncoding::kBFloat16:
      for (std::size_t i = 0; i < values.size(); ++i) {
        const std::uint16_t bits = float_to_bf16(values[i]);
        value_blocks::store16(out.data() + 2 * i, bits);
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
      value_blocks::sign_block(values.subspan(first, count), at);
    } else if (encoding == ValueEncoding::kNatural) {
      value_blocks::natural_block(values.subspan(first, count), rng, block, at);
    } else if (encoding == ValueEncoding::kLloyd2) {
      value_blocks::lloyd2_block(values.subspan(first, count), at);
    } else {
      value_blocks::quantize_block(values.subspan(first, count), bits, is_stochastic(encoding),
                                   &rng, block, at);
    }
    at += sizeof(float) + value_blocks::code_bytes(bits, count);
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
        out[i] = fp16_to_float(value_blocks::load16(in.data() + 2 * i));
      return;
    case ValueEncoding::kBFloat16:
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = bf16_to_float(value_blocks::load16(in.data() + 2 * i));
      return;
    default:
      break;
  }
  const unsigned bits = code_bits(encoding);
  const std::byte* at = in.data();
  for (std::size_t first = 0; first < out.size(); first += kQuantizationBlock) {
    const std::size_t count = std::min(kQuantizationBlock, out.size() - first);
    if (encoding == ValueEncoding::kSign) {
      value_blocks::unsign_block(at, out.subspan(first, count));
    } else if (encoding == ValueEncoding::kNatural) {
      value_blocks::unnatural_block(at, out.subspan(first, count));
    } else if (encoding == ValueEncoding::kLloyd2) {
      value_blocks::unlloyd2_block(at, out.subspan(first, count));
    } else {
      value_blocks::dequantize_block(at, bits, out.subspan(first, count));
    }
    at += sizeof(float) + value_blocks::code_bytes(bits, count);
  }
}

}  // namespace sparsecomm
