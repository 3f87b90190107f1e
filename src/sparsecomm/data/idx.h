#pragma once
// IDX files (the MNIST family's format), plain or gzip-compressed, read with
// zlib: a big-endian header (magic 0x0000TTDD: type TT, DD dimensions, then
// DD sizes) followed by the data. Only unsigned bytes (TT = 0x08), the type
// of every MNIST-style image and label file, are supported.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sparsecomm {

struct IdxArray {
  std::vector<std::uint32_t> shape;  // e.g. {60000, 28, 28} or {60000}
  std::vector<std::uint8_t> data;    // row-major, product(shape) bytes
};

// Parses one IDX file's (decompressed) bytes. `source` names them in
// messages. Throws InvalidArgument saying what is wrong: not IDX (bad
// magic), a type other than unsigned bytes, 0 or more than 4 dimensions, a
// size product that overflows, truncated or with trailing data. Never reads
// outside `bytes` and allocates no more than bytes.size().
IdxArray parse_idx(std::span<const std::byte> bytes, std::string_view source);

// At most this many data bytes per file (Fashion-MNIST's largest is 47 MB):
// a header that promises more is refused before anything is allocated.
inline constexpr std::size_t kMaxIdxBytes = std::size_t{1} << 31;

// Reads `path` (gzip or not: zlib detects it) and parses it, inflating no
// more than the header promises plus one byte (a gzip bomb cannot fill
// memory). Throws InvalidArgument naming the file and what is wrong:
// missing, unreadable, corrupt gzip, more than kMaxIdxBytes promised, or
// any parse_idx error.
IdxArray read_idx(const std::string& path);

// Writes `array` as a gzip-compressed IDX file (for tests and small tools).
void write_idx_gz(const std::string& path, const IdxArray& array);

}  // namespace sparsecomm
