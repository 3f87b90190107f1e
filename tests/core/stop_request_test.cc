// A stop request: the first signal is recorded and the process goes on; a
// second one ends it with the signal's default action; a request by call
// names itself; a signal the process ignored stays ignored.

#include <csignal>

#include <gtest/gtest.h>

#include "sparsecomm/core/stop_request.h"

namespace sparsecomm {
namespace {

TEST(StopRequest, ARequestByCallIsRecordedUntilCleared) {
  clear_stop_request();
  EXPECT_FALSE(stop_requested());
  EXPECT_EQ(stop_reason(), "");
  request_stop();
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_reason(), "a request");
  request_stop(SIGTERM);  // the first request stands
  EXPECT_EQ(stop_reason(), "a request");
  clear_stop_request();
  EXPECT_FALSE(stop_requested());
}

// Death tests run the statement in a child process, so the handlers and the
// request stay there.
TEST(StopRequestDeathTest, TheFirstSignalIsRecordedTheSecondEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        clear_stop_request();
        install_stop_signal_handlers();
        std::raise(SIGTERM);
        if (!stop_requested() || stop_reason() != "SIGTERM") std::_Exit(2);
        std::raise(SIGTERM);
        std::_Exit(3);  // not reached: the second SIGTERM ends the process
      },
      ::testing::KilledBySignal(SIGTERM), "");
  EXPECT_EXIT(
      {
        clear_stop_request();
        install_stop_signal_handlers();
        std::raise(SIGUSR1);
        std::_Exit(stop_requested() && stop_reason() == "SIGUSR1" ? 0 : 2);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(StopRequestDeathTest, AnIgnoredSignalStaysIgnored) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        clear_stop_request();
        std::signal(SIGINT, SIG_IGN);  // as nohup leaves it for a background job
        install_stop_signal_handlers();
        std::raise(SIGINT);
        std::_Exit(stop_requested() ? 2 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace sparsecomm
