#pragma once
// The block codecs of value_codec.h: intB (round to nearest or stochastic),
// sign, lloyd2 and nat. Each encodes one block of up to kQuantizationBlock
// values as a 4-byte scale and its codes, and replaces the values by what
// the decoder will compute from the bytes (so a residual is exact); each
// decoder rejects bytes no encoder writes (CommError).
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

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "sparsecomm/core/rng.h"

namespace sparsecomm::value_blocks {

// Bytes of `count` codes of `bits` bits, packed low bits first.
inline std::size_t code_bytes(unsigned bits, std::size_t count) { return (count * bits + 7) / 8; }

// A 16-bit word at an unaligned address.
inline void store16(std::byte* out, std::uint16_t bits) { std::memcpy(out, &bits, sizeof bits); }
inline std::uint16_t load16(const std::byte* in) {
  std::uint16_t bits = 0;
  std::memcpy(&bits, in, sizeof bits);
  return bits;
}

// intB: `out` holds 4 + code_bytes(bits, block.size()) bytes; `rng` (for
// stochastic rounding) draws at counter (block_number, position / 4).
void quantize_block(std::span<float> block, unsigned bits, bool stochastic, const Philox* rng,
                    std::uint64_t block_number, std::byte* out);
void dequantize_block(const std::byte* in, unsigned bits, std::span<float> out);

void sign_block(std::span<float> block, std::byte* out);
void unsign_block(const std::byte* in, std::span<float> out);

void lloyd2_block(std::span<float> block, std::byte* out);
void unlloyd2_block(const std::byte* in, std::span<float> out);

void natural_block(std::span<float> block, const Philox& rng, std::uint64_t block_number,
                   std::byte* out);
void unnatural_block(const std::byte* in, std::span<float> out);

}  // namespace sparsecomm::value_blocks
