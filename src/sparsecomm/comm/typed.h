#pragma once
// Typed views and small typed collectives over the byte-level Communicator.

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm {

template <class T>
std::span<const std::byte> bytes_of(std::span<const T> values) {
  static_assert(std::is_trivially_copyable_v<T>);
  return std::as_bytes(values);
}
template <class T>
std::span<std::byte> writable_bytes_of(std::span<T> values) {
  static_assert(std::is_trivially_copyable_v<T> && !std::is_const_v<T>);
  return std::as_writable_bytes(values);
}

// Every rank's `value`, indexed by rank.
template <class T>
std::vector<T> allgather_value(Communicator& comm, const T& value) {
  std::vector<T> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(bytes_of(std::span<const T>(&value, 1)), writable_bytes_of(std::span<T>(all)));
  return all;
}

// Root's `value` on every rank.
template <class T>
T broadcast_value(Communicator& comm, T value, int root) {
  comm.broadcast(writable_bytes_of(std::span<T>(&value, 1)), root);
  return value;
}

}  // namespace sparsecomm
