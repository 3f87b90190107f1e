// atomic_write (core/atomic_file.h): replaces whole files, leaves no
// temporary behind, and leaves the previous file untouched on failure.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "scratch_dir.h"
#include "sparsecomm/core/atomic_file.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::size_t entries_in(const fs::path& directory) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(directory)) ++n;
  return n;
}

TEST(AtomicWrite, ReplacesTheWholeFileAndLeavesNoTemporary) {
  const testing::ScratchDir scratch("atomic_write");
  const fs::path file = scratch.path() / "a.json";
  atomic_write(file, std::string_view("first, longer content\n"));
  EXPECT_EQ(read_text(file), "first, longer content\n");
  atomic_write(file, std::string_view("second\n"));
  EXPECT_EQ(read_text(file), "second\n");
  const std::byte raw[] = {std::byte{0}, std::byte{255}, std::byte{7}};
  atomic_write(file, raw);
  EXPECT_EQ(fs::file_size(file), 3u);
  atomic_write(file, std::string_view(""));
  EXPECT_EQ(fs::file_size(file), 0u);
  EXPECT_EQ(entries_in(scratch.path()), 1u) << "a temporary file was left behind";
  EXPECT_NO_THROW(fsync_directory(scratch.path()));
}

TEST(AtomicWrite, AFailureNamesTheFileAndKeepsThePreviousContent) {
  const testing::ScratchDir scratch("atomic_write_fail");
  const fs::path file = scratch.path() / "kept.json";
  atomic_write(file, std::string_view("previous\n"));
  // A directory in the way of the rename: the write fails at the rename.
  const fs::path blocked = scratch.path() / "blocked";
  fs::create_directories(blocked / "inside");
  try {
    atomic_write(blocked, std::string_view("new\n"));
    ADD_FAILURE() << "a rename over a non-empty directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocked"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_text(file), "previous\n");
  EXPECT_EQ(entries_in(scratch.path()), 2u) << "a temporary file was left behind";
  // A directory that does not exist.
  try {
    atomic_write(scratch.path() / "missing" / "x.json", std::string_view("x"));
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fsync_directory(scratch.path() / "missing"), Error);
}

}  // namespace
}  // namespace sparsecomm
