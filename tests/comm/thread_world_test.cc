// Failure behaviour of the thread backend: a rank that throws or never
// arrives must end in a clear error on every rank within the timeout.

#include "sparsecomm/comm/thread/thread_world.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"

namespace sparsecomm {
namespace {

using std::chrono::milliseconds;

// Runs the world and returns the message of the exception it rethrows.
template <class Fn>
std::string failure_of(int ranks, Fn fn, milliseconds timeout) {
  try {
    run_thread_world(ranks, fn, timeout);
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "the world was expected to fail";
  return {};
}

TEST(ThreadWorld, RejectsAnEmptyWorld) {
  EXPECT_THROW(run_thread_world(0, [](Communicator&) {}), InvalidArgument);
}

TEST(ThreadWorld, EveryRankSeesItsRankAndTheSize) {
  std::vector<std::atomic<int>> seen(5);
  run_thread_world(5, [&](Communicator& comm) {
    EXPECT_EQ(comm.size(), 5);
    EXPECT_EQ(comm.backend(), "thread");
    seen[static_cast<std::size_t>(comm.rank())]++;
  });
  for (auto& count : seen) EXPECT_EQ(count.load(), 1);
}

// A rank that throws: every other rank blocked in a receive from a rank that
// will never send fails promptly (long before its own timeout) with a
// PeerFailure naming the failed rank, and the original error is rethrown.
TEST(ThreadWorld, AThrowingRankFailsEveryPendingCallPromptly) {
  std::vector<std::string> messages(4);
  Stopwatch clock;
  const std::string rethrown = failure_of(
      4,
      [&](Communicator& comm) {
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(milliseconds(50));
          throw std::runtime_error("injected failure");
        }
        std::byte byte{};
        try {
          comm.recv({&byte, 1}, 2, 7);
        } catch (const PeerFailure& e) {
          messages[static_cast<std::size_t>(comm.rank())] = e.what();
          throw;
        }
      },
      milliseconds(20000));
  EXPECT_LT(clock.seconds(), 5.0) << "peers must not wait for their own timeout";
  EXPECT_EQ(rethrown, "injected failure");
  for (int rank : {0, 1, 3}) {
    const std::string& m = messages[static_cast<std::size_t>(rank)];
    EXPECT_NE(m.find("rank 2 failed: injected failure"), std::string::npos) << m;
    EXPECT_NE(m.find("rank " + std::to_string(rank)), std::string::npos) << m;
  }
}

// The same for a rank that polls with Request::test() instead of waiting
// (a server loop): the poll reports the failure instead of spinning forever.
TEST(ThreadWorld, PollingAPendingRequestReportsAFailedPeer) {
  std::string polled;
  const std::string rethrown = failure_of(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(milliseconds(20));
          throw std::runtime_error("injected failure");
        }
        std::byte byte{};
        Request pending = comm.irecv({&byte, 1}, 1, 7);
        try {
          while (!pending.test()) std::this_thread::sleep_for(milliseconds(1));
        } catch (const PeerFailure& e) {
          polled = e.what();
          throw;
        }
      },
      milliseconds(20000));
  EXPECT_EQ(rethrown, "injected failure");
  EXPECT_NE(polled.find("rank 1 failed: injected failure"), std::string::npos) << polled;
}

// A rank that never arrives: the waiting rank's timeout names the operation
// and the missing peer.
TEST(ThreadWorld, ARankThatNeverArrivesIsATimeoutNamingIt) {
  Stopwatch clock;
  const std::string message = failure_of(
      3,
      [](Communicator& comm) {
        if (comm.rank() == 1) return;  // never sends
        if (comm.rank() == 0) {
          std::vector<std::byte> buffer(100);
          comm.recv(buffer, 1, 11);
        }
        // Rank 2 waits at a barrier that rank 1 never joins.
        if (comm.rank() == 2) comm.barrier();
      },
      milliseconds(300));
  EXPECT_LT(clock.seconds(), 5.0);
  EXPECT_NE(message.find("timed out after 300 ms"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
}

TEST(ThreadWorld, TimeoutErrorIsATypedCommError) {
  EXPECT_THROW(run_thread_world(
                   2,
                   [](Communicator& comm) {
                     if (comm.rank() == 0) {
                       std::byte byte{};
                       comm.recv({&byte, 1}, 1, 3);
                     }
                   },
                   milliseconds(100)),
               TimeoutError);
}

// A large (rendezvous) send whose receiver never posts times out on the
// sender, and the world stays memory-safe: the pending send is withdrawn
// before the sender's buffer goes away.
TEST(ThreadWorld, AnUnmatchedLargeSendTimesOutAndIsWithdrawn) {
  const std::string message = failure_of(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 0) {
          std::vector<std::byte> big(1 << 20);
          comm.send(big, 1, 5);
        }
      },
      milliseconds(200));
  EXPECT_NE(message.find("send to rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("did not post a matching receive"), std::string::npos) << message;
}

// Mismatched sizes across ranks are reported, not hung on.
TEST(ThreadWorld, ASizeMismatchNamesBothRanks) {
  for (std::size_t sent : {std::size_t{8}, std::size_t{1} << 20}) {
    const std::string message = failure_of(
        2,
        [&](Communicator& comm) {
          std::vector<std::byte> buffer(comm.rank() == 0 ? sent : 4);
          if (comm.rank() == 0)
            comm.send(buffer, 1, 9);
          else
            comm.recv(buffer, 0, 9);
        },
        milliseconds(2000));
    EXPECT_NE(message.find("size mismatch"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 0 sent " + std::to_string(sent) + " bytes"), std::string::npos)
        << message;
    EXPECT_NE(message.find("rank 1 expected 4 bytes"), std::string::npos) << message;
  }
}

TEST(ThreadWorld, RequestWaitForHonoursItsOwnTimeout) {
  run_thread_world(2, [](Communicator& comm) {
    if (comm.rank() != 0) return;
    std::byte byte{};
    Request pending = comm.irecv({&byte, 1}, 1, 4);
    EXPECT_FALSE(pending.test());
    Stopwatch clock;
    EXPECT_THROW(pending.wait_for(milliseconds(50)), TimeoutError);
    EXPECT_LT(clock.seconds(), 2.0);
  });
}

}  // namespace
}  // namespace sparsecomm
