#pragma once
// A scratch directory for tests that write files.

#include <filesystem>
#include <string>
#include <system_error>

#include <gtest/gtest.h>
#include <unistd.h>

namespace sparsecomm::testing {

// The running test's name (for per-test scratch directories).
inline std::string current_test_name() {
  return ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

// A fresh directory under the system temp dir (named after `name` and the
// process id, so parallel test processes do not collide), removed
// afterwards.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("sparsecomm-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace sparsecomm::testing
