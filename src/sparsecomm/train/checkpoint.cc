#include "sparsecomm/train/checkpoint.h"

#include <fstream>

#include <fmt/format.h>
#include <zlib.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/report/run_files.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

fs::path step_dir(const fs::path& run_dir, std::int64_t step) {
  return run_dir / "checkpoints" / fmt::format("step-{}", step);
}

fs::path rank_file(const fs::path& run_dir, std::int64_t step, int rank) {
  return step_dir(run_dir, step) / fmt::format("rank{}.state", rank);
}

std::uint32_t crc_of(std::span<const std::byte> bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t chunk = std::min<std::size_t>(bytes.size() - done, 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), static_cast<uInt>(chunk));
    done += chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

}  // namespace

void write_rank_checkpoint(const fs::path& run_dir, std::int64_t step, int rank,
                           std::span<const std::byte> payload) {
  const fs::path path = rank_file(run_dir, step, rank);
  std::error_code error;
  fs::create_directories(path.parent_path(), error);
  if (error) {
    throw Error(fmt::format("cannot create {}: {}", path.parent_path().string(), error.message()));
  }
  const fs::path temp = path.string() + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    const std::uint32_t crc = crc_of(payload);
    const std::uint64_t size = payload.size();
    out.write(reinterpret_cast<const char*>(&size), sizeof size);
    out.write(reinterpret_cast<const char*>(payload.data()), static_cast<std::streamsize>(size));
    out.write(reinterpret_cast<const char*>(&crc), sizeof crc);
    out.flush();
    if (!out)
      throw Error(fmt::format("writing the checkpoint {} failed (disk full?)", temp.string()));
  }
  fs::rename(temp, path);
}

std::vector<std::byte> read_rank_checkpoint(const fs::path& run_dir, std::int64_t step, int rank) {
  const fs::path path = rank_file(run_dir, step, rank);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(
        fmt::format("the checkpoint file {} is missing: the checkpoint of step {} is "
                    "incomplete or was written by fewer ranks",
                    path.string(), step));
  }
  std::uint64_t size = 0;
  in.read(reinterpret_cast<char*>(&size), sizeof size);
  const auto file_size = fs::file_size(path);
  if (!in || size != file_size - sizeof size - sizeof(std::uint32_t)) {
    throw Error(
        fmt::format("the checkpoint file {} is truncated or corrupt (its size field "
                    "does not match the file); resume from another run or start anew",
                    path.string()));
  }
  std::vector<std::byte> payload(size);
  std::uint32_t crc = 0;
  in.read(reinterpret_cast<char*>(payload.data()), static_cast<std::streamsize>(size));
  in.read(reinterpret_cast<char*>(&crc), sizeof crc);
  if (!in || crc != crc_of(payload)) {
    throw Error(
        fmt::format("the checkpoint file {} is corrupt (checksum mismatch); refusing to "
                    "resume from it",
                    path.string()));
  }
  return payload;
}

void commit_checkpoint(const fs::path& run_dir, std::int64_t step, int world,
                       const nlohmann::json& fingerprint) {
  report::write_json_atomically(run_dir / "checkpoints" / "latest.json",
                                {{"step", step}, {"world", world}, {"fingerprint", fingerprint}});
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(run_dir / "checkpoints", error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step-", 0) == 0 &&
        name != step_dir(run_dir, step).filename().string()) {
      fs::remove_all(entry.path(), error);
    }
  }
}

std::optional<nlohmann::json> latest_checkpoint(const fs::path& run_dir) {
  const fs::path path = run_dir / "checkpoints" / "latest.json";
  if (!fs::exists(path)) return std::nullopt;
  std::ifstream in(path);
  const auto json = nlohmann::json::parse(in, nullptr, false);
  if (json.is_discarded() || !json.contains("step") || !json.contains("world")) {
    throw Error(fmt::format("{} is corrupt; delete it to start anew", path.string()));
  }
  return json;
}

}  // namespace sparsecomm
