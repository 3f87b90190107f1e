#pragma once
// Internal to the ps layer: the wire format of parameter_server.h's
// protocol (tags, the request header, the grant reply) and the push
// fingerprint both sides compute.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

namespace sparsecomm::ps {

inline constexpr int kTagRequest = 29100;
inline constexpr int kTagPushPayload = 29101;
inline constexpr int kTagPullVersion = 29102;
inline constexpr int kTagPullPayload = 29103;
inline constexpr int kTagGrant = 29104;

enum class RequestKind : std::uint32_t { kPush = 1, kPull = 2, kBegin = 3, kDone = 4 };

struct RequestHeader {
  std::uint32_t kind = 0;           // RequestKind
  std::uint32_t sparse = 0;         // PUSH: 1 for a sparse payload
  std::int64_t clock = 0;           // PUSH: the step pushed; PULL/BEGIN/DONE: steps pushed
  std::uint64_t count = 0;          // PUSH: elements in the payload; PULL: the min
                                    // clock of the worker's last grant (0 if none)
  std::int64_t pulled_version = 0;  // PUSH: the shard version last pulled
  double learning_rate = 0.0;       // PUSH
};
static_assert(std::is_trivially_copyable_v<RequestHeader> && sizeof(RequestHeader) == 40);

struct GrantReply {
  std::int64_t min_clock = 0;
  std::int64_t blocked = 0;  // 1 when the BEGIN was held
  std::int64_t extra = 0;    // 1 when granted as a DSSP extra step
  std::int64_t dssp_r = -1;  // the DSSP grant decided on this request, or -1
};
static_assert(std::is_trivially_copyable_v<GrantReply> && sizeof(GrantReply) == 32);

template <class T>
std::span<const std::byte> bytes_of(const T& value) {
  return std::as_bytes(std::span<const T, 1>(&value, 1));
}
template <class T>
std::span<std::byte> writable_bytes_of(T& value) {
  return std::as_writable_bytes(std::span<T, 1>(&value, 1));
}

inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Fingerprint of one push to one server: the worker, its clock and every
// payload byte (dense: the floats; sparse: indices then values). Servers
// and workers sum these (wrapping), so the sums agree exactly iff every
// push arrived exactly once with the same content.
inline std::uint64_t push_fingerprint(int worker, std::int64_t clock,
                                      std::span<const std::byte> payload) {
  std::uint64_t h = mix64(0x9e3779b97f4a7c15ULL ^ static_cast<std::uint64_t>(worker)) ^
                    mix64(static_cast<std::uint64_t>(clock) + 0x632be59bd9b4e019ULL);
  std::size_t i = 0;
  for (; i + 8 <= payload.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, payload.data() + i, 8);
    h = (h ^ word) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  for (; i < payload.size(); ++i) {
    h = (h ^ static_cast<std::uint64_t>(payload[i])) * 0x100000001b3ULL;
  }
  return mix64(h ^ payload.size());
}

}  // namespace sparsecomm::ps
