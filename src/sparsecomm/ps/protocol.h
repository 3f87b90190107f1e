#pragma once
// Internal to the ps layer: the wire format of parameter_server.h's
// protocol (tags, the request header, the grant reply) and the push
// fingerprint both sides compute.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/hash.h"

namespace sparsecomm::ps {

// The protocol's tags, in the library's reserved range (comm/communicator.h).
inline constexpr int kTagRequest = tags::kPsRequest;
inline constexpr int kTagPushPayload = tags::kPsPushPayload;
inline constexpr int kTagPullVersion = tags::kPsPullVersion;
inline constexpr int kTagPullPayload = tags::kPsPullPayload;
inline constexpr int kTagGrant = tags::kPsGrant;

enum class RequestKind : std::uint32_t { kPush = 1, kPull = 2, kBegin = 3, kDone = 4, kPause = 5 };

struct RequestHeader {
  std::uint32_t kind = 0;           // RequestKind
  std::uint32_t sparse = 0;         // PUSH: 1 for a sparse payload
  std::int64_t clock = 0;           // PUSH: the step pushed; PULL/BEGIN/DONE/PAUSE: steps pushed
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

// The bytes of one trivially copyable object (a header, a reply); for
// spans of values see comm/typed.h's bytes_of.
template <class T>
std::span<const std::byte> object_bytes(const T& value) {
  return std::as_bytes(std::span<const T, 1>(&value, 1));
}
template <class T>
std::span<std::byte> writable_object_bytes(T& value) {
  return std::as_writable_bytes(std::span<T, 1>(&value, 1));
}

// Fingerprint of one push to one server: the worker, its clock and every
// payload byte (dense: the floats; sparse: indices then values). Servers
// and workers sum these (wrapping), so the sums agree exactly iff every
// push arrived exactly once with the same content.
inline std::uint64_t push_fingerprint(int worker, std::int64_t clock,
                                      std::span<const std::byte> payload) {
  const std::uint64_t header =
      hash_combine(static_cast<std::uint64_t>(worker), static_cast<std::uint64_t>(clock));
  return hash_bytes(payload, header);
}

}  // namespace sparsecomm::ps
