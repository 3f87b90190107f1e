// State files (state_io.h): size + payload + CRC-32, the framing of every
// checkpoint file.

#include "sparsecomm/core/state_io.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>
#include <zlib.h>

namespace sparsecomm {
namespace {

static_assert(std::endian::native == std::endian::little,
              "state files are little-endian; add byte swapping for this platform");

std::uint32_t crc_of(std::span<const std::byte> bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t chunk = std::min<std::size_t>(bytes.size() - done, std::size_t{1} << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), static_cast<uInt>(chunk));
    done += chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

constexpr std::size_t kFraming = sizeof(std::uint64_t) + sizeof(std::uint32_t);

}  // namespace

std::vector<std::byte> encode_state_file(std::span<const std::byte> payload) {
  const std::uint64_t size = payload.size();
  const std::uint32_t crc = crc_of(payload);
  std::vector<std::byte> out(payload.size() + kFraming);
  std::memcpy(out.data(), &size, sizeof size);
  if (!payload.empty()) std::memcpy(out.data() + sizeof size, payload.data(), payload.size());
  std::memcpy(out.data() + sizeof size + payload.size(), &crc, sizeof crc);
  return out;
}

std::vector<std::byte> decode_state_file(std::span<const std::byte> file, std::string_view source) {
  if (file.size() < kFraming) {
    throw Error(fmt::format(
        "{} is truncated or corrupt: {} bytes, less than the {}-byte size and checksum framing",
        source, file.size(), kFraming));
  }
  std::uint64_t size = 0;
  std::memcpy(&size, file.data(), sizeof size);
  if (size != file.size() - kFraming) {
    throw Error(fmt::format(
        "{} is truncated or corrupt: its size field says {} payload bytes, the file holds {}",
        source, size, file.size() - kFraming));
  }
  const auto payload = file.subspan(sizeof size, static_cast<std::size_t>(size));
  std::uint32_t crc = 0;
  std::memcpy(&crc, file.data() + sizeof size + size, sizeof crc);
  if (crc != crc_of(payload)) {
    throw Error(fmt::format("{} is corrupt (checksum mismatch)", source));
  }
  return {payload.begin(), payload.end()};
}

}  // namespace sparsecomm
