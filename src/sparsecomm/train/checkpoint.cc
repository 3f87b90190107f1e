#include "sparsecomm/train/checkpoint.h"

#include <charconv>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include "sparsecomm/core/atomic_file.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/json_numbers.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/report/run_files.h"

namespace sparsecomm {

std::filesystem::path checkpoint_dir(const std::filesystem::path& run_dir, std::int64_t step) {
  return run_dir / "checkpoints" / fmt::format("step-{}", step);
}

namespace {

namespace fs = std::filesystem;

fs::path rank_file(const fs::path& run_dir, std::int64_t step, int rank) {
  return checkpoint_dir(run_dir, step) / fmt::format("rank{}.state", rank);
}

// N of a directory named "step-N"; nullopt for any other name.
std::optional<std::int64_t> step_of_directory(const std::string& name) {
  constexpr std::string_view kPrefix = "step-";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) {
    return std::nullopt;
  }
  std::int64_t step = 0;
  const char* end = name.data() + name.size();
  const auto [stop, error] = std::from_chars(name.data() + kPrefix.size(), end, step);
  if (error != std::errc() || stop != end) return std::nullopt;
  return step;
}

constexpr std::uint32_t kCheckpointVersion = 1;

}  // namespace

void write_checkpoint_header(StateWriter& state, const nlohmann::json& fingerprint,
                             std::int64_t step, double wall_s) {
  state.tag("sparsecomm-checkpoint");
  state.value<std::uint32_t>(kCheckpointVersion);
  state.string(fingerprint.dump());
  state.value<std::int64_t>(step);
  state.value<double>(wall_s);
}

double read_checkpoint_header(StateReader& state, const nlohmann::json& fingerprint,
                              std::int64_t step, int rank) {
  state.expect_tag("sparsecomm-checkpoint");
  const auto version = state.value<std::uint32_t>();
  if (version != kCheckpointVersion) {
    throw Error(fmt::format("the checkpoint has format version {}, this build reads {}", version,
                            kCheckpointVersion));
  }
  const nlohmann::json saved = nlohmann::json::parse(state.string(), nullptr, false);
  if (saved.is_discarded()) throw Error("the checkpoint's fingerprint is not JSON: corrupt");
  check_fingerprint(saved, fingerprint);
  const auto saved_step = state.value<std::int64_t>();
  if (saved_step != step) {
    throw Error(fmt::format("the checkpoint file of rank {} is of step {}, latest.json says {}",
                            rank, saved_step, step));
  }
  return state.value<double>();
}

void check_fingerprint(const nlohmann::json& saved, const nlohmann::json& current) {
  std::string differences;
  for (const auto& [key, value] : current.items()) {
    if (!saved.contains(key) || saved[key] != value) {
      differences +=
          fmt::format("\n  {}: checkpoint {} vs this run {}", key,
                      saved.contains(key) ? saved[key].dump() : "(absent)", value.dump());
    }
  }
  for (const auto& [key, value] : saved.items()) {  // set then, not now (e.g. --min-numel)
    if (!current.contains(key)) {
      differences += fmt::format("\n  {}: checkpoint {} vs this run (absent)", key, value.dump());
    }
  }
  if (!differences.empty()) {
    throw InvalidArgument(
        "the checkpoint belongs to a different run; these settings differ:" + differences +
        "\nresume with the checkpoint's settings (they are in its run directory's config.json)");
  }
}

void write_rank_checkpoint(const fs::path& run_dir, std::int64_t step, int rank,
                           std::span<const std::byte> payload) {
  const fs::path path = rank_file(run_dir, step, rank);
  std::error_code error;
  fs::create_directories(path.parent_path(), error);
  if (error) {
    throw Error(fmt::format("cannot create {}: {}", path.parent_path().string(), error.message()));
  }
  // The new step directory's entry must be durable too, not only its files.
  fsync_directory(path.parent_path().parent_path());
  atomic_write(path, encode_state_file(payload));
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
  std::error_code error;
  const auto size = fs::file_size(path, error);
  std::vector<std::byte> file(error ? 0 : static_cast<std::size_t>(size));
  in.read(reinterpret_cast<char*>(file.data()), static_cast<std::streamsize>(file.size()));
  if (error || !in) {
    throw Error(fmt::format("cannot read the checkpoint file {}", path.string()));
  }
  try {
    return decode_state_file(file, fmt::format("the checkpoint file {}", path.string()));
  } catch (const Error& e) {
    throw Error(fmt::format(
        "{}; refusing to resume from it (resume from another run or start anew)", e.what()));
  }
}

namespace {
CheckpointFaultHook& fault_hook() {
  static CheckpointFaultHook hook;
  return hook;
}
}  // namespace

void set_checkpoint_fault_hook(CheckpointFaultHook hook) { fault_hook() = std::move(hook); }

void run_checkpoint_fault_hook(std::int64_t step, int rank) {
  if (fault_hook()) fault_hook()(step, rank);
}

void commit_checkpoint(const fs::path& run_dir, std::int64_t step, int world,
                       const nlohmann::json& fingerprint) {
  report::write_json_atomically(run_dir / "checkpoints" / "latest.json",
                                {{"step", step}, {"world", world}, {"fingerprint", fingerprint}});
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(run_dir / "checkpoints", error)) {
    const std::string name = entry.path().filename().string();
    const std::optional<std::int64_t> older = step_of_directory(name);
    if (entry.is_directory() && older && *older < step) fs::remove_all(entry.path(), error);
  }
}

std::optional<nlohmann::json> latest_checkpoint(const fs::path& run_dir) {
  const fs::path path = run_dir / "checkpoints" / "latest.json";
  if (!fs::exists(path)) return std::nullopt;
  std::ifstream in(path);
  const auto json = nlohmann::json::parse(in, nullptr, false);
  const auto whole_number = [&](const char* key, std::int64_t least) {
    const auto value = json.contains(key) ? json_integer<std::int64_t>(json[key]) : std::nullopt;
    return value && *value >= least;
  };
  if (json.is_discarded() || !json.is_object() || !whole_number("step", 0) ||
      !whole_number("world", 1)) {
    throw Error(fmt::format("{} is corrupt; delete it to start anew", path.string()));
  }
  return json;
}

}  // namespace sparsecomm
