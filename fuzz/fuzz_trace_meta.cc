// Fuzzes parse_trace_meta (traces/gradient_stream.h): any text parses or
// raises InvalidArgument; a parsed description's layers tile [0, numel).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/traces/gradient_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const sparsecomm::TraceMeta meta = sparsecomm::parse_trace_meta(text, "fuzz input");
    std::size_t covered = 0;
    for (const sparsecomm::LayerSpan& layer : meta.layers) {
      if (layer.offset != covered) std::abort();
      covered += layer.size;
    }
    if (covered != meta.numel || meta.world < 1 || meta.steps < 1) std::abort();
  } catch (const sparsecomm::InvalidArgument&) {
  }
  return 0;
}
