#pragma once
// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11).
//
// A counter-based generator is a pure function of (key, counter): every rank
// that knows the key (a seed) and the counter (step, bucket, ...) draws the
// same numbers without communicating, and any draw can be recomputed
// directly, which makes runs resumable bit-exactly.

#include <array>
#include <cstdint>

namespace sparsecomm {

class Philox {
 public:
  using Block = std::array<std::uint32_t, 4>;

  explicit Philox(std::uint64_t seed)
      : key_{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)} {}

  // Four 32-bit random words for the 128-bit counter (c0, c1).
  Block block(std::uint64_t c0, std::uint64_t c1) const;

  // One 64-bit random word for the counter (c0, c1).
  std::uint64_t u64(std::uint64_t c0, std::uint64_t c1) const {
    const Block b = block(c0, c1);
    return (static_cast<std::uint64_t>(b[1]) << 32) | b[0];
  }

  // Uniform integer in [0, bound) for the counter (c0, c1); bound > 0.
  // Uses 64 random bits and a multiply-shift, so the bias is below 2^-32
  // for every bound that fits in 32 bits.
  std::uint64_t below(std::uint64_t bound, std::uint64_t c0, std::uint64_t c1) const;

 private:
  std::array<std::uint32_t, 2> key_;
};

}  // namespace sparsecomm
