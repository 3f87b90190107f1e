#pragma once
// Binary state for checkpoints: what a component needs to resume bit-exactly
// (thresholds, layouts, RNG counters, memories). Little-endian fixed-size
// fields; every section starts with a tag so a reader fails loudly on a
// layout it does not expect.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

class StateWriter {
 public:
  void tag(std::string_view name) { string(name); }
  template <class T>
  void value(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <class T>
  void array(std::span<const T> values) {
    value<std::uint64_t>(values.size());
    const auto raw = std::as_bytes(values);
    bytes_.insert(bytes_.end(), raw.begin(), raw.end());
  }
  void string(std::string_view s) {
    value<std::uint64_t>(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes_.insert(bytes_.end(), p, p + s.size());
  }
  const std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

class StateReader {
 public:
  explicit StateReader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  // Throws Error unless the next field is the tag `name`.
  void expect_tag(std::string_view name) {
    const std::string found = string();
    if (found != name) {
      throw Error("[state] expected section '" + std::string(name) + "' but found '" + found +
                  "': the saved state comes from a different configuration or version");
    }
  }
  template <class T>
  T value() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
  // Reads an array saved with StateWriter::array into `out`, which must
  // already have the saved size (a mismatch is an Error).
  template <class T>
  void array_into(std::span<T> out) {
    const auto n = value<std::uint64_t>();
    if (n != out.size()) {
      throw Error("[state] saved array has " + std::to_string(n) + " elements, expected " +
                  std::to_string(out.size()));
    }
    const auto raw = take(n * sizeof(T));
    if (n > 0) std::memcpy(out.data(), raw.data(), raw.size());
  }
  template <class T>
  std::vector<T> array() {
    const auto n = value<std::uint64_t>();
    std::vector<T> out(n);
    const auto raw = take(n * sizeof(T));
    if (n > 0) std::memcpy(out.data(), raw.data(), raw.size());
    return out;
  }
  std::string string() {
    const auto n = value<std::uint64_t>();
    const auto raw = take(n);
    return std::string(reinterpret_cast<const char*>(raw.data()), raw.size());
  }
  bool at_end() const { return position_ == bytes_.size(); }

 private:
  std::span<const std::byte> take(std::size_t n) {
    if (n > bytes_.size() - position_) {
      throw Error("[state] saved state ends early: wanted " + std::to_string(n) +
                  " more bytes at " + std::to_string(position_) + " of " +
                  std::to_string(bytes_.size()));
    }
    const auto out = bytes_.subspan(position_, n);
    position_ += n;
    return out;
  }
  std::span<const std::byte> bytes_;
  std::size_t position_ = 0;
};

}  // namespace sparsecomm
