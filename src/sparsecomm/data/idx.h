#pragma once
// IDX files (the MNIST family's format), plain or gzip-compressed, read with
// zlib: a big-endian header (magic 0x0000TTDD: type TT, DD dimensions, then
// DD sizes) followed by the data. Only unsigned bytes (TT = 0x08), the type
// of every MNIST-style image and label file, are supported.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsecomm {

struct IdxArray {
  std::vector<std::uint32_t> shape;  // e.g. {60000, 28, 28} or {60000}
  std::vector<std::uint8_t> data;    // row-major, product(shape) bytes
};

// Reads `path` (gzip or not: zlib detects it). Throws InvalidArgument naming
// the file and what is wrong: missing, unreadable, not gzip/IDX (bad magic),
// a type other than unsigned bytes, truncated or with trailing data.
IdxArray read_idx(const std::string& path);

// Writes `array` as a gzip-compressed IDX file (for tests and small tools).
void write_idx_gz(const std::string& path, const IdxArray& array);

}  // namespace sparsecomm
