#pragma once
// Durable, atomic file replacement: the one way the project writes a file
// that must never be seen half-written (checkpoints, latest.json,
// config.json, summary.json, trace meta.json, rewritten metrics).

#include <filesystem>
#include <span>
#include <string_view>

namespace sparsecomm {

// Replaces `path` with `bytes` so that a reader, a crash or a power loss
// sees either the previous file or the complete new one: writes a
// temporary file in the same directory, fsyncs it, renames it over `path`
// and fsyncs the directory. Throws Error naming the file and the failing
// step (write, fsync, rename: e.g. a full disk); no temporary file is left
// behind, and the previous file is untouched on failure.
void atomic_write(const std::filesystem::path& path, std::span<const std::byte> bytes);
void atomic_write(const std::filesystem::path& path, std::string_view text);

// fsyncs a directory, so that entries created or renamed in it (e.g. a new
// subdirectory) survive a power loss. Throws Error naming it.
void fsync_directory(const std::filesystem::path& directory);

}  // namespace sparsecomm
