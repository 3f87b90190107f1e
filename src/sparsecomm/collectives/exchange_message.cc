#include "sparsecomm/collectives/exchange_message.h"

#include <cstring>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

// Varint-encoded indices are strictly ascending by construction (each gap
// is stored minus one, and decode_indices rejects anything beyond 32
// bits), so only the first and last index need the range check; raw
// uint32 indices are checked one by one. Value parts need only their size:
// every bit pattern decodes to some float.

namespace sparsecomm {

std::span<const std::byte> decode_block_indices(std::span<const std::byte> block,
                                                std::size_t value_count, const BlockFormat& format,
                                                std::span<Index> indices) {
  const std::size_t count = indices.size();
  // Each value takes at least one bit (sign), so a count beyond 8x the
  // block's bytes is refused before its size is computed (no overflow).
  const std::size_t value_part = value_count / 8 > block.size()
                                     ? block.size() + 1
                                     : encoded_value_bytes(format.values, value_count);
  if (value_part > block.size()) {
    throw CommError(fmt::format("[exchange] a block of {} bytes is too small for {} values",
                                block.size(), value_count));
  }
  const std::span<const std::byte> index_part = block.first(block.size() - value_part);
  std::size_t used = indices.size_bytes();
  if (format.encoded_indices) {
    used = decode_indices(index_part, indices);
  } else if (used == index_part.size() && used > 0) {
    std::memcpy(indices.data(), index_part.data(), used);
  }
  if (used != index_part.size()) {
    throw CommError(fmt::format("[exchange] an index part of {} bytes does not hold exactly {} {}",
                                index_part.size(), count,
                                format.encoded_indices ? "varint indices" : "raw indices"));
  }
  if (count > 0) {
    bool ok = indices.front() >= format.begin && indices.back() < format.end;
    if (!format.encoded_indices) {
      for (std::size_t j = 1; ok && j < count; ++j) ok = indices[j - 1] < indices[j];
    }
    if (!ok) {
      throw CommError(fmt::format(
          "[exchange] a block's {} indices (first {}, last {}) are not strictly ascending "
          "inside [{}, {})",
          count, indices.front(), indices.back(), format.begin, format.end));
    }
  }
  return block.last(value_part);
}

void decode_block(std::span<const std::byte> block, const BlockFormat& format,
                  std::span<Index> indices, std::span<float> values) {
  const std::span<const std::byte> value_part =
      decode_block_indices(block, values.size(), format, indices);
  decode_values(value_part, format.values, values);
}

}  // namespace sparsecomm
