#pragma once
// The project's one non-cryptographic hash: checksums that ranks compare
// (PS push fingerprints, the exchange's debug check that "shared" indices
// agree) and positions every rank draws alike (the bench's conservation
// sample). Deterministic across platforms and runs; never for security.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace sparsecomm {

// SplitMix64's finalizer: a bijection of 64-bit words that spreads every
// input bit over the output.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Order-sensitive combination of a running hash with one more word.
constexpr std::uint64_t hash_combine(std::uint64_t seed, std::uint64_t value) {
  return mix64(seed ^ mix64(value + 0x9e3779b97f4a7c15ULL));
}

// Hash of a byte string, 8 bytes at a time (length included), from `seed`.
inline std::uint64_t hash_bytes(std::span<const std::byte> bytes, std::uint64_t seed = 0) {
  std::uint64_t h = mix64(seed ^ 0x632be59bd9b4e019ULL);
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = (h ^ word) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  for (; i < bytes.size(); ++i) h = (h ^ static_cast<std::uint64_t>(bytes[i])) * 0x100000001b3ULL;
  return mix64(h ^ bytes.size());
}

}  // namespace sparsecomm
