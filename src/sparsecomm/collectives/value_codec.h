#pragma once
// Wire encodings of gradient values: fp32, the 16-bit floats and the
// block-quantized codecs (collectives/value_codec.cc gives their layouts).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sparsecomm {

// fp32, fp16 and bf16 send each value alone. The block-quantized codecs
// (intB: B = 8, 4 or 2 bits) cut the values into blocks of
// kQuantizationBlock and send each block as a float32 scale (its largest
// magnitude over 2^(B-1) - 1) followed by one B-bit code per value, so a
// value is q * scale with q an integer in [-(2^(B-1) - 1), 2^(B-1) - 1]:
// 127 levels each side for int8, 7 for int4, and {-1, 0, 1} for int2.
// The plain names round to nearest; "-sr" rounds stochastically (unbiased:
// the expected decoded value is the input). "sign" is the scaled sign of
// EF-signSGD: one bit per value, each block's scale its mean magnitude, a
// value decoded as +-scale (biased: meant for error feedback). "nat" is
// natural compression (Horvath et al., 2019): each value rounded
// stochastically to one of the two powers of two around it (unbiased), sent
// as 8 bits (its sign and its power's distance below the block's scale,
// the largest power sent); values more than 2^126 below the scale, and
// zeros, are sent as 0. "lloyd2" is for selected values, which are never
// zero: 2 bits per value, its sign and which of two magnitudes (each block's
// two-level Lloyd-Max fit of |a|, sent as a bf16 pair) it is nearer to, so
// all four codes carry a value where int2 spends one on 0 (biased: meant for
// error feedback; a zero is sent as +-the lower magnitude).
enum class ValueEncoding {
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt8,
  kInt4,
  kInt2,
  kInt8Stochastic,
  kInt4Stochastic,
  kInt2Stochastic,
  kSign,
  kNatural,
  kLloyd2,
};
inline constexpr ValueEncoding kLastValueEncoding = ValueEncoding::kLloyd2;
inline constexpr std::size_t kQuantizationBlock = 128;
// "fp32", "fp16", "bf16", "int8", "int4", "int2", "int8-sr", "int4-sr",
// "int2-sr", "sign", "nat", "lloyd2"; InvalidArgument listing them otherwise.
ValueEncoding parse_value_encoding(std::string_view name);
std::string_view value_encoding_name(ValueEncoding encoding);
// Every name parse_value_encoding accepts, in the enum's order.
const std::vector<std::string>& value_encoding_names();
bool is_block_quantized(ValueEncoding encoding);  // the intB codecs, sign, nat and lloyd2
bool is_stochastic(ValueEncoding encoding);       // the "-sr" codecs and nat
// a - decoded is exact in float for every finite a: fp32, fp16, bf16, the
// round-to-nearest intB codecs and nat (a power of two next to a); the
// others keep it within one rounding.
bool keeps_residual_exact(ValueEncoding encoding);
// Bytes of `count` values on the wire (for the intB codecs, every block's
// scale included).
std::size_t encoded_value_bytes(ValueEncoding encoding, std::size_t count);
// Bytes per value of the codecs that send each value alone: 4 for fp32, 2
// for fp16 and bf16. InvalidArgument for the block-quantized codecs, which
// have no width per value (what `what` names cannot use them).
std::size_t fixed_value_bytes(ValueEncoding encoding, std::string_view what = "this exchange");
// Bits per value on the wire for a long run of values: 32, 16, or B (1 for
// sign, 8 for nat, 2 for lloyd2) plus the block header's share (32 /
// kQuantizationBlock).
double wire_bits_per_value(ValueEncoding encoding);

// Round to nearest even; finite values saturate to the largest finite value
// (fp16 +-65504, bf16 +-3.39e38) instead of overflowing to inf (so the
// residual stays finite), NaN stays NaN (every 16-bit NaN pattern survives
// a round trip through float), inf stays inf.
std::uint16_t float_to_fp16(float value);
float fp16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);

// Encodes values[i] into out (encoded_value_bytes(encoding, values.size())
// bytes) and replaces values[i] by the decoded value, so the caller knows
// exactly what the receivers will see. For kFloat32 a plain copy. For every
// finite a the decoded d of fp16, bf16, nat and the round-to-nearest intB codecs
// satisfies: a - d is exact in float (so a residual a - d keeps exactly what
// was not sent). fp16 needs care only beyond 65504: there d is the largest
// fp16 magnitude with that property (65504 up to 2^29, coarser above, 0
// from 2^39 on). The stochastic codecs keep it within one rounding of the
// residual, and so do sign and lloyd2. A block holding a non-finite value decodes to
// NaN throughout. `nonce` keys the stochastic codecs' random draws (with the
// block and the position): equal inputs and nonces give equal bytes;
// the other codecs ignore it.
void encode_values(std::span<float> values, ValueEncoding encoding, std::span<std::byte> out,
                   std::uint64_t nonce = 0);
// Decodes `out.size()` values from `in`. CommError when `in` is not exactly
// encoded_value_bytes(encoding, out.size()) bytes, or an intB block is
// malformed: a scale that is negative or infinite (for nat also not a power
// of two or 0; for lloyd2 a lower magnitude above the upper, or one NaN
// without the other), a code beyond the levels (nat: a negative zero, or a
// value in a block whose scale is 0), or nonzero padding bits.
void decode_values(std::span<const std::byte> in, ValueEncoding encoding, std::span<float> out);

}  // namespace sparsecomm
