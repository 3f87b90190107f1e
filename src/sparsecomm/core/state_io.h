#pragma once
// Binary state for checkpoints: what a component needs to resume bit-exactly
// (thresholds, layouts, RNG counters, memories). Little-endian fixed-size
// fields; every section starts with a tag so a reader fails loudly on a
// layout it does not expect. StateReader is the parser of untrusted state:
// it never reads past its span nor allocates more than the span could hold;
// every defect is an Error. A state file wraps one payload with its size
// and a CRC-32 (encode_state_file / decode_state_file).

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
    append(&v, sizeof(T));
  }
  template <class T>
  void array(std::span<const T> values) {
    value<std::uint64_t>(values.size());
    append(values.data(), values.size_bytes());
  }
  void string(std::string_view s) {
    value<std::uint64_t>(s.size());
    append(s.data(), s.size());
  }
  const std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  // Not inlined: where a caller's sizes are all constants, GCC 12 at -O3
  // folds the vector's growth and reports false out-of-bounds writes.
  // State is written once per checkpoint, so the call costs nothing.
  [[gnu::noinline]] void append(const void* data, std::size_t n) {
    if (n == 0) return;
    const std::size_t at = bytes_.size();
    bytes_.resize(at + n);
    std::memcpy(bytes_.data() + at, data, n);
  }
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
    if (n > remaining() / sizeof(T)) {
      throw Error("[state] saved array claims " + std::to_string(n) + " elements of " +
                  std::to_string(sizeof(T)) + " bytes, but only " + std::to_string(remaining()) +
                  " bytes remain: the state is corrupt");
    }
    const auto raw = take(n * sizeof(T));
    std::vector<T> out(n);
    if (n > 0) std::memcpy(out.data(), raw.data(), raw.size());
    return out;
  }
  // A count of records saved with value<std::uint64_t>(); Error when that
  // many records of at least `record_bytes` each cannot fit in what
  // remains (so a corrupt count allocates nothing).
  std::size_t count(std::size_t record_bytes) {
    const auto n = value<std::uint64_t>();
    if (record_bytes > 0 && n > remaining() / record_bytes) {
      throw Error("[state] saved count " + std::to_string(n) + " of records of " +
                  std::to_string(record_bytes) + " bytes, but only " + std::to_string(remaining()) +
                  " bytes remain: the state is corrupt");
    }
    return static_cast<std::size_t>(n);
  }
  std::string string() {
    const auto n = value<std::uint64_t>();
    const auto raw = take(n);
    return std::string(reinterpret_cast<const char*>(raw.data()), raw.size());
  }
  bool at_end() const { return position_ == bytes_.size(); }
  std::size_t remaining() const { return bytes_.size() - position_; }

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

// A state file's bytes: the payload's size (u64, little-endian), the
// payload, its CRC-32 (u32).
std::vector<std::byte> encode_state_file(std::span<const std::byte> payload);

// The payload of a state file's bytes. Throws Error naming `source` when the
// bytes are shorter than the framing, the size field disagrees with their
// length, or the checksum fails.
std::vector<std::byte> decode_state_file(std::span<const std::byte> file, std::string_view source);

}  // namespace sparsecomm
