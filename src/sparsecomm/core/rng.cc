#include "sparsecomm/core/rng.h"

namespace sparsecomm {
namespace {

constexpr std::uint32_t kMul0 = 0xD2511F53u;
constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;
constexpr int kRounds = 10;

inline void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

}  // namespace

Philox::Block Philox::block(std::uint64_t c0, std::uint64_t c1) const {
  Block x{static_cast<std::uint32_t>(c0), static_cast<std::uint32_t>(c0 >> 32),
          static_cast<std::uint32_t>(c1), static_cast<std::uint32_t>(c1 >> 32)};
  std::uint32_t k0 = key_[0];
  std::uint32_t k1 = key_[1];
  for (int round = 0; round < kRounds; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kMul0, x[0], hi0, lo0);
    mul_hi_lo(kMul1, x[2], hi1, lo1);
    x = {hi1 ^ x[1] ^ k0, lo1, hi0 ^ x[3] ^ k1, lo0};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return x;
}

std::uint64_t Philox::below(std::uint64_t bound, std::uint64_t c0, std::uint64_t c1) const {
  __extension__ using U128 = unsigned __int128;  // GCC/Clang extension, exact 64x64->128
  const U128 product = static_cast<U128>(u64(c0, c1)) * bound;
  return static_cast<std::uint64_t>(product >> 64);
}

}  // namespace sparsecomm
