// Fuzzes parse_idx (data/idx.h): any bytes parse or raise InvalidArgument;
// a parsed array's data is exactly the product of its shape.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span<const std::uint8_t>(data, size));
  try {
    const sparsecomm::IdxArray array = sparsecomm::parse_idx(bytes, "fuzz input");
    std::size_t count = 1;
    for (const std::uint32_t extent : array.shape) count *= extent;
    if (count != array.data.size()) std::abort();
  } catch (const sparsecomm::InvalidArgument&) {
  }
  return 0;
}
