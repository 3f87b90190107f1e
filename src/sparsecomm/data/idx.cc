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

// Reads exactly n bytes; returns how many were read (fewer at end of file).
std::size_t read_some(gzFile file, void* out, std::size_t n, const std::string& path) {
  auto* bytes = static_cast<unsigned char*>(out);
  std::size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
    const int got = gzread(file, bytes + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      throw InvalidArgument(fmt::format("[idx] {}: corrupt gzip data ({})", path, message));
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    throw InvalidArgument(fmt::format("[idx] {} does not exist", path));
  }
  GzFile file(path, "rb");
  if (file.get() == nullptr) {
    throw InvalidArgument(fmt::format("[idx] cannot open {}: {}", path, std::strerror(errno)));
  }
  unsigned char magic[4];
  if (read_some(file.get(), magic, 4, path) != 4 || magic[0] != 0 || magic[1] != 0) {
    throw InvalidArgument(fmt::format(
        "[idx] {} is not an IDX file (bad magic number): expected 00 00 <type> <dims>", path));
  }
  if (magic[2] != kUnsignedByte) {
    throw InvalidArgument(fmt::format(
        "[idx] {} holds element type 0x{:02x}; only unsigned bytes (0x08) are supported", path,
        magic[2]));
  }
  const std::size_t dims = magic[3];
  if (dims < 1 || dims > kMaxDims) {
    throw InvalidArgument(
        fmt::format("[idx] {} declares {} dimensions (1..{} supported)", path, dims, kMaxDims));
  }
  IdxArray array;
  std::size_t count = 1;
  for (std::size_t d = 0; d < dims; ++d) {
    unsigned char size[4];
    if (read_some(file.get(), size, 4, path) != 4) {
      throw InvalidArgument(fmt::format("[idx] {} is truncated inside its header", path));
    }
    const std::uint32_t value = (std::uint32_t{size[0]} << 24) | (std::uint32_t{size[1]} << 16) |
                                (std::uint32_t{size[2]} << 8) | std::uint32_t{size[3]};
    array.shape.push_back(value);
    if (value != 0 && count > std::numeric_limits<std::size_t>::max() / value) {
      throw InvalidArgument(fmt::format("[idx] {} declares an impossibly large array", path));
    }
    count *= value;
  }
  array.data.resize(count);
  const std::size_t got = read_some(file.get(), array.data.data(), count, path);
  if (got != count) {
    throw InvalidArgument(
        fmt::format("[idx] {} is truncated: the header promises {} bytes of data, the file has {}",
                    path, count, got));
  }
  unsigned char extra = 0;
  if (read_some(file.get(), &extra, 1, path) != 0) {
    throw InvalidArgument(
        fmt::format("[idx] {} has data past the {} bytes its header describes", path, count));
  }
  return array;
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
