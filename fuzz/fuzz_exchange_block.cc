// Fuzzes the exchange's block decoder (collectives/exchange_message.h), the
// bytes a rank receives from a peer. The first input bytes choose the
// format (value encoding, any of codec.h's, varint or raw indices, the index range) and how
// many indices the header announced; the rest is the block. Any block
// decodes or raises CommError; decoded indices are strictly ascending
// inside the range.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "sparsecomm/collectives/exchange_message.h"
#include "sparsecomm/core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  sparsecomm::BlockFormat format;
  // Every value encoding (the block-quantized ones check scales, codes and
  // padding); up to 255 values, so quantized parts span two blocks.
  constexpr auto kEncodings = static_cast<unsigned>(sparsecomm::kLastValueEncoding) + 1;
  format.values = static_cast<sparsecomm::ValueEncoding>(data[0] % kEncodings);
  format.encoded_indices = (data[0] & 0x80) == 0;
  format.begin = data[1];
  format.end = format.begin + 1 + static_cast<std::size_t>(data[2]) * 64;
  const std::size_t count = data[3];
  const auto block = std::as_bytes(std::span<const std::uint8_t>(data + 4, size - 4));
  std::vector<sparsecomm::Index> indices(count);
  std::vector<float> values(count);
  try {
    sparsecomm::decode_block(block, format, indices, values);
    for (std::size_t i = 0; i < count; ++i) {
      if (indices[i] < format.begin || indices[i] >= format.end) std::abort();
      if (i > 0 && indices[i] <= indices[i - 1]) std::abort();
    }
  } catch (const sparsecomm::CommError&) {
  }
  return 0;
}
