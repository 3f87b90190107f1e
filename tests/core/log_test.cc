// The "sparsecomm" logger (core/log.h): line format, rank tags per thread
// and per process, levels.

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "sparsecomm/core/log.h"

namespace sparsecomm {
namespace {

std::string logged(auto&& write) {
  ::testing::internal::CaptureStderr();
  write();
  return ::testing::internal::GetCapturedStderr();
}

TEST(Log, LinesNameTheLevelAndTheRank) {
  set_process_log_rank(-1);
  set_thread_log_rank(-1);
  EXPECT_EQ(logged([] { logger().warn("disk {} full", 90); }),
            "sparsecomm: warning: disk 90 full\n");
  EXPECT_EQ(logged([] { logger().error("bad"); }), "sparsecomm: error: bad\n");

  set_process_log_rank(2);  // MPI: one rank per process
  EXPECT_EQ(logged([] { logger().info("up"); }), "sparsecomm [rank 2]: info: up\n");
  set_thread_log_rank(5);  // the thread backend's rank thread wins
  EXPECT_EQ(logged([] { logger().info("up"); }), "sparsecomm [rank 5]: info: up\n");
  set_thread_log_rank(-1);
  set_process_log_rank(-1);

  // Each rank thread tags its own lines.
  const std::string both = logged([] {
    std::thread a([] {
      set_thread_log_rank(0);
      logger().warn("a");
    });
    a.join();
    std::thread b([] {
      set_thread_log_rank(1);
      logger().warn("b");
    });
    b.join();
  });
  EXPECT_EQ(both, "sparsecomm [rank 0]: warning: a\nsparsecomm [rank 1]: warning: b\n");
}

TEST(Log, TheLevelFiltersLines) {
  const auto saved = logger().level();
  logger().set_level(spdlog::level::err);
  EXPECT_EQ(logged([] { logger().warn("hidden"); }), "");
  EXPECT_EQ(logged([] { logger().error("shown"); }), "sparsecomm: error: shown\n");
  logger().set_level(saved);
}

TEST(Log, ParsesTheLevelNamesOfSparsecommLogLevel) {
  EXPECT_EQ(parse_log_level("trace"), spdlog::level::trace);
  EXPECT_EQ(parse_log_level("debug"), spdlog::level::debug);
  EXPECT_EQ(parse_log_level("info"), spdlog::level::info);
  EXPECT_EQ(parse_log_level("warn"), spdlog::level::warn);
  EXPECT_EQ(parse_log_level("warning"), spdlog::level::warn);
  EXPECT_EQ(parse_log_level("error"), spdlog::level::err);
  EXPECT_EQ(parse_log_level("off"), spdlog::level::off);
  EXPECT_EQ(parse_log_level("loud"), std::nullopt);
  EXPECT_EQ(parse_log_level(""), std::nullopt);
}

}  // namespace
}  // namespace sparsecomm
