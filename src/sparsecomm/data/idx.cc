#include "sparsecomm/data/idx.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <zlib.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

constexpr std::uint8_t kUnsignedByte = 0x08;
constexpr std::size_t kMaxDims = 4;

// Owns a gzFile.
class GzFile {
 public:
  GzFile(const std::string& path, const char* mode) : file_(gzopen(path.c_str(), mode)) {}
  ~GzFile() {
    if (file_ != nullptr) gzclose(file_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  gzFile get() const { return file_; }

 private:
  gzFile file_;
};

std::uint32_t big_endian_u32(std::span<const std::byte> four) {
  return (std::to_integer<std::uint32_t>(four[0]) << 24) |
         (std::to_integer<std::uint32_t>(four[1]) << 16) |
         (std::to_integer<std::uint32_t>(four[2]) << 8) | std::to_integer<std::uint32_t>(four[3]);
}

// Appends up to n more decompressed bytes of `file` to `out`; fewer only at
// the end of the stream. Grows `out` a chunk at a time, so a header that
// promises more than the stream holds costs no more memory than the stream.
void read_more(gzFile file, const std::string& path, std::size_t n, std::vector<std::byte>& out) {
  constexpr std::size_t kChunk = std::size_t{1} << 22;
  while (n > 0) {
    const std::size_t start = out.size();
    const std::size_t want = std::min(n, kChunk);
    out.resize(start + want);
    const int got = gzread(file, out.data() + start, static_cast<unsigned>(want));
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      throw InvalidArgument(fmt::format("[idx] {}: corrupt gzip data ({})", path, message));
    }
    out.resize(start + static_cast<std::size_t>(got));
    if (got == 0) return;
    n -= static_cast<std::size_t>(got);
  }
}

struct IdxHeader {
  std::vector<std::uint32_t> shape;
  std::size_t count = 0;  // data bytes the shape promises
  std::size_t size = 0;   // header bytes
};

// Validates the header at the start of `bytes` (which must hold all of it).
IdxHeader parse_header(std::span<const std::byte> bytes, std::string_view source) {
  if (bytes.size() < 4 || bytes[0] != std::byte{0} || bytes[1] != std::byte{0}) {
    throw InvalidArgument(fmt::format(
        "[idx] {} is not an IDX file (bad magic number): expected 00 00 <type> <dims>", source));
  }
  const auto type = std::to_integer<unsigned>(bytes[2]);
  if (type != kUnsignedByte) {
    throw InvalidArgument(fmt::format(
        "[idx] {} holds element type 0x{:02x}; only unsigned bytes (0x08) are supported", source,
        type));
  }
  const auto dims = std::to_integer<std::size_t>(bytes[3]);
  if (dims < 1 || dims > kMaxDims) {
    throw InvalidArgument(
        fmt::format("[idx] {} declares {} dimensions (1..{} supported)", source, dims, kMaxDims));
  }
  IdxHeader header;
  header.size = 4 + 4 * dims;
  if (bytes.size() < header.size) {
    throw InvalidArgument(fmt::format("[idx] {} is truncated inside its header", source));
  }
  header.count = 1;
  for (std::size_t d = 0; d < dims; ++d) {
    const std::uint32_t value = big_endian_u32(bytes.subspan(4 + 4 * d, 4));
    header.shape.push_back(value);
    if (value != 0 && header.count > std::numeric_limits<std::size_t>::max() / value) {
      throw InvalidArgument(fmt::format("[idx] {} declares an impossibly large array", source));
    }
    header.count *= value;
  }
  return header;
}

}  // namespace

IdxArray parse_idx(std::span<const std::byte> bytes, std::string_view source) {
  const IdxHeader header = parse_header(bytes, source);
  const std::size_t data = bytes.size() - header.size;
  if (data < header.count) {
    throw InvalidArgument(
        fmt::format("[idx] {} is truncated: the header promises {} bytes of data, the file has {}",
                    source, header.count, data));
  }
  if (data > header.count) {
    throw InvalidArgument(fmt::format("[idx] {} has data past the {} bytes its header describes",
                                      source, header.count));
  }
  IdxArray array;
  array.shape = header.shape;
  array.data.resize(header.count);
  if (header.count > 0) std::memcpy(array.data.data(), bytes.data() + header.size, header.count);
  return array;
}

IdxArray read_idx(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    throw InvalidArgument(fmt::format("[idx] {} does not exist", path));
  }
  GzFile file(path, "rb");
  if (file.get() == nullptr) {
    throw InvalidArgument(fmt::format("[idx] cannot open {}: {}", path, std::strerror(errno)));
  }
  // Streamed, and never more than the header promises (plus one byte, to
  // detect trailing data): a gzip file's size does not bound what it
  // inflates to.
  std::vector<std::byte> bytes;
  read_more(file.get(), path, 4, bytes);
  if (bytes.size() == 4) {
    const auto dims = std::to_integer<std::size_t>(bytes[3]);
    if (dims >= 1 && dims <= kMaxDims) read_more(file.get(), path, 4 * dims, bytes);
  }
  const IdxHeader header = parse_header(bytes, path);
  if (header.count > kMaxIdxBytes) {
    throw InvalidArgument(fmt::format(
        "[idx] {} declares {} bytes of data, more than the {} this reader accepts: not an "
        "MNIST-style file",
        path, header.count, kMaxIdxBytes));
  }
  read_more(file.get(), path, header.count + 1, bytes);
  return parse_idx(bytes, path);
}

void write_idx_gz(const std::string& path, const IdxArray& array) {
  GzFile file(path, "wb");
  if (file.get() == nullptr) {
    throw InvalidArgument(fmt::format("[idx] cannot create {}: {}", path, std::strerror(errno)));
  }
  std::vector<unsigned char> header = {0, 0, kUnsignedByte,
                                       static_cast<unsigned char>(array.shape.size())};
  for (std::uint32_t size : array.shape) {
    for (int shift = 24; shift >= 0; shift -= 8)
      header.push_back(static_cast<unsigned char>(size >> shift));
  }
  const auto write = [&](const void* data, std::size_t n) {
    if (n > 0 && gzwrite(file.get(), data, static_cast<unsigned>(n)) != static_cast<int>(n)) {
      throw Error(fmt::format("[idx] writing {} failed", path));
    }
  };
  write(header.data(), header.size());
  write(array.data.data(), array.data.size());
}

}  // namespace sparsecomm
