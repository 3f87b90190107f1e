// launcher_rank(): the rank mpirun/mpiexec gave this process, read from the
// environment before MPI exists (comm_mpi_test checks it against MPI's rank
// under mpiexec).

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "sparsecomm/comm/launcher.h"

namespace sparsecomm {
namespace {

// Sets the launcher's variables for one test and restores the process's.
class LauncherEnvironment : public ::testing::Test {
 protected:
  static constexpr const char* kNames[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                           "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
  void SetUp() override {
    for (const char* name : kNames) {
      const char* value = std::getenv(name);
      saved_.push_back(value == nullptr ? std::nullopt : std::optional<std::string>(value));
      unsetenv(name);
    }
  }
  void TearDown() override {
    for (std::size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i]) {
        setenv(kNames[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kNames[i]);
      }
    }
  }

 private:
  std::vector<std::optional<std::string>> saved_;
};

TEST_F(LauncherEnvironment, NoLauncherMeansNoRank) {
  EXPECT_FALSE(launched_by_mpirun());
  EXPECT_EQ(launcher_rank(), std::nullopt);
}

TEST_F(LauncherEnvironment, ReadsOpenMpisRankThenPmixs) {
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  EXPECT_TRUE(launched_by_mpirun());
  EXPECT_EQ(launcher_rank(), 3);
  unsetenv("OMPI_COMM_WORLD_RANK");
  setenv("PMIX_RANK", "2", 1);
  EXPECT_EQ(launcher_rank(), 2);
}

TEST_F(LauncherEnvironment, ANonNumberIsNoRank) {
  for (const char* text : {"", "x", "-1", "3x", " 3"}) {
    setenv("OMPI_COMM_WORLD_RANK", text, 1);
    EXPECT_EQ(launcher_rank(), std::nullopt) << "'" << text << "'";
  }
}

}  // namespace
}  // namespace sparsecomm
