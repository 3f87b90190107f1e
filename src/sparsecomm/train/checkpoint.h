#pragma once
// Checkpoint files (no LibTorch). Layout inside a run directory:
//   checkpoints/step-<N>/rank<r>.state   one per rank: payload + CRC-32
//   checkpoints/latest.json              {"step": N, "world": n, "fingerprint": ...}
// A checkpoint becomes the latest only when every rank's file is complete
// (written to a temporary name, then renamed) and rank 0 has rewritten
// latest.json atomically; older step directories are removed after that.
// A crash at any point leaves the previous checkpoint usable.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sparsecomm {

// The directory of checkpoint `step`: run_dir/checkpoints/step-<step>.
std::filesystem::path checkpoint_dir(const std::filesystem::path& run_dir, std::int64_t step);

// Writes rank `rank`'s state for step `step` (creating the directories).
void write_rank_checkpoint(const std::filesystem::path& run_dir, std::int64_t step, int rank,
                           std::span<const std::byte> payload);

// Reads it back; Error when it is missing, truncated or fails its checksum
// (naming the file).
std::vector<std::byte> read_rank_checkpoint(const std::filesystem::path& run_dir, std::int64_t step,
                                            int rank);

// Test hook: called on every rank after it wrote its file of checkpoint
// `step` and before the checkpoint is committed; a hook that throws
// simulates a crash between writing and committing. Empty: none (the
// default). Set it only while no run is in progress.
using CheckpointFaultHook = std::function<void(std::int64_t step, int rank)>;
void set_checkpoint_fault_hook(CheckpointFaultHook hook);
void run_checkpoint_fault_hook(std::int64_t step, int rank);

class StateReader;
class StateWriter;

// Every rank file's payload starts alike: a tag, the format version, the
// run's fingerprint (JSON), the step and the run's wall time; the trainer's
// own state follows, its first field a float array (the rank's
// parameters, or a server's shard).
void write_checkpoint_header(StateWriter& state, const nlohmann::json& fingerprint,
                             std::int64_t step, double wall_s);
// Reads that header of rank `rank`'s file of checkpoint `step`: Error for
// another format version or step, InvalidArgument (check_fingerprint) for
// another run's fingerprint. Returns the wall time.
double read_checkpoint_header(StateReader& state, const nlohmann::json& fingerprint,
                              std::int64_t step, int rank);
// InvalidArgument listing every setting that differs between the saved
// fingerprint and this run's, and saying how to resume.
void check_fingerprint(const nlohmann::json& saved, const nlohmann::json& current);

// Rank 0, after every rank has written: makes `step` the latest checkpoint
// and removes the older ones. A newer step directory is left alone: once
// the barrier before the commit is past, a rank that does not wait for rank
// 0 (a parameter server's worker) may already be writing the next one.
void commit_checkpoint(const std::filesystem::path& run_dir, std::int64_t step, int world,
                       const nlohmann::json& fingerprint);

// latest.json of `run_dir`, or nullopt when it has no checkpoint.
std::optional<nlohmann::json> latest_checkpoint(const std::filesystem::path& run_dir);

}  // namespace sparsecomm
