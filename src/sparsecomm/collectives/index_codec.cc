#include "sparsecomm/collectives/index_codec.h"

#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

// A strictly ascending list i_0 < i_1 < ... is written as the varints
// i_0, i_1 - i_0 - 1, i_2 - i_1 - 1, ... (LEB128: 7 bits per byte, low bits
// first, the high bit set on every byte but the last). At density c the
// gaps are about 1/c, so 0.1% density costs 2 bytes per index instead of 4,
// 1% costs 1-2 bytes. A 32-bit value takes at most 5 bytes; the decoder
// rejects longer or out-of-range encodings instead of wrapping.

namespace sparsecomm {
namespace {

std::size_t varint_size(std::uint32_t value) {
  std::size_t bytes = 1;
  while (value >= 0x80u) {
    value >>= 7;
    ++bytes;
  }
  return bytes;
}

std::byte* put_varint(std::byte* out, std::uint32_t value) {
  while (value >= 0x80u) {
    *out++ = static_cast<std::byte>((value & 0x7Fu) | 0x80u);
    value >>= 7;
  }
  *out++ = static_cast<std::byte>(value);
  return out;
}

[[noreturn]] void malformed(std::size_t decoded, std::size_t count, std::size_t offset,
                            std::string_view why) {
  throw CommError(fmt::format("[codec] malformed index encoding: index {} of {} at byte {}: {}",
                              decoded, count, offset, why));
}

}  // namespace

std::size_t encoded_index_bytes(std::span<const Index> indices) {
  if (indices.empty()) return 0;
  std::size_t bytes = varint_size(indices[0]);
  for (std::size_t i = 1; i < indices.size(); ++i) {
    bytes += varint_size(indices[i] - indices[i - 1] - 1);  // wraps (5 bytes) if not ascending
  }
  return bytes;
}

std::size_t encode_indices(std::span<const Index> indices, UninitVector<std::byte>& out) {
  const std::size_t start = out.size();
  out.resize(start + 5 * indices.size());  // the worst case; trimmed below
  std::byte* p = out.data() + start;
  Index previous = 0;
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const Index index = indices[i];
    if (i > 0 && index <= previous) {
      out.resize(start);
      throw InvalidArgument(fmt::format(
          "[codec] encode_indices: indices must be strictly ascending, but index {} is {} after {}",
          i, index, previous));
    }
    p = put_varint(p, i == 0 ? index : index - previous - 1);
    previous = index;
  }
  const auto written = static_cast<std::size_t>(p - (out.data() + start));
  out.resize(start + written);
  return written;
}

std::size_t decode_indices(std::span<const std::byte> in, std::span<Index> out) {
  const std::size_t count = out.size();
  std::size_t pos = 0;
  std::uint64_t previous = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t value = 0;
    for (int shift = 0;; shift += 7) {
      if (pos >= in.size()) malformed(i, count, pos, "the input ends inside the list");
      const auto byte = static_cast<std::uint32_t>(in[pos++]);
      if (shift == 28 && byte > 0x0Fu) malformed(i, count, pos - 1, "the value exceeds 32 bits");
      value |= static_cast<std::uint64_t>(byte & 0x7Fu) << shift;
      if ((byte & 0x80u) == 0) break;
    }
    const std::uint64_t index = i == 0 ? value : previous + value + 1;
    if (index > 0xFFFFFFFFull) malformed(i, count, pos, "the index exceeds 2^32 - 1");
    out[i] = static_cast<Index>(index);
    previous = index;
  }
  return pos;
}

std::size_t decode_indices(std::span<const std::byte> in, std::size_t count,
                           UninitVector<Index>& out) {
  out.resize(count);
  return decode_indices(in, std::span<Index>(out));
}

}  // namespace sparsecomm
