// Fuzzes the state parsers (core/state_io.h): decode_state_file on the
// whole input, and a StateReader walking it as a checkpoint section would
// (tag, scalar, arrays, string); every defect must be an Error.

#include <cstddef>
#include <cstdint>
#include <span>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/state_io.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span<const std::uint8_t>(data, size));
  try {
    sparsecomm::decode_state_file(bytes, "fuzz input");
  } catch (const sparsecomm::Error&) {
  }
  try {
    sparsecomm::StateReader reader(bytes);
    while (!reader.at_end()) {
      reader.string();
      reader.value<std::int64_t>();
      reader.array<float>();
      reader.array<std::uint64_t>();
      float fixed[3];
      reader.array_into<float>(fixed);
    }
  } catch (const sparsecomm::Error&) {
  }
  return 0;
}
