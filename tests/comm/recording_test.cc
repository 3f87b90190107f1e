// The record/replay communicator (comm/recording.h): what a rank received in
// a real world, served back on that rank alone, bit for bit; and a replay
// that diverges from its recording is a clear ReplayMismatch.

#include "sparsecomm/comm/recording.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_checks.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

using checks::garbage;
using checks::pattern;
using checks::same_bytes;

constexpr auto kTestTimeout = std::chrono::seconds(20);

// Every buffer one session ended with, in call order.
using Outputs = std::vector<std::vector<std::byte>>;

template <class T>
std::vector<std::byte> bytes_copy(const std::vector<T>& values) {
  const auto bytes = bytes_of(std::span<const T>(values));
  return {bytes.begin(), bytes.end()};
}

// The same calls on any communicator of the world (the real one wrapped in a
// recording, or a replay): the ring all-reduce of collectives/ (segmented
// isend/irecv), the Communicator's default collectives and point-to-point.
Outputs session(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  Outputs out;

  // Sums that are not exact in float: a different order of the additions
  // would show in the bits.
  std::vector<float> sum(1000);
  for (std::size_t i = 0; i < sum.size(); ++i) {
    sum[i] = 0.1f * static_cast<float>(r + 1) * static_cast<float>(i % 17) + 1e-3f;
  }
  AllreduceOptions ring;
  ring.segment_bytes = 256;  // several segments in flight
  allreduce(comm, std::span<float>(sum), ring);
  out.push_back(bytes_copy(sum));

  std::vector<std::byte> broadcast = r == n - 1 ? pattern(n - 1, 0, 37) : garbage(37);
  comm.broadcast(broadcast, n - 1);
  out.push_back(broadcast);

  std::vector<std::byte> all = garbage(24 * static_cast<std::size_t>(n));
  comm.allgather(pattern(r, 1, 24), all);
  out.push_back(all);

  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  std::iota(counts.begin(), counts.end(), std::size_t{1});
  std::vector<std::byte> gathered =
      garbage(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  comm.allgatherv(pattern(r, 2, counts[static_cast<std::size_t>(r)]), gathered, counts);
  out.push_back(gathered);

  std::vector<std::byte> send, received;
  std::vector<std::size_t> send_counts, recv_counts;
  for (int q = 0; q < n; ++q) {
    const auto to_q = static_cast<std::size_t>(r + q + 1);
    const std::vector<std::byte> part = pattern(r, q, to_q);
    send.insert(send.end(), part.begin(), part.end());
    send_counts.push_back(to_q);
    recv_counts.push_back(static_cast<std::size_t>(q + r + 1));
  }
  received = garbage(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
  comm.alltoallv(send, send_counts, received, recv_counts);
  out.push_back(received);

  // Point-to-point: a ring, one receive completed by polling, one by wait.
  const std::vector<std::byte> message = pattern(r, next, 70000);
  std::vector<std::byte> polled = garbage(70000), waited = garbage(5);
  Request incoming = comm.irecv(polled, prev, 7);
  Request outgoing = comm.isend(message, next, 7);
  while (!incoming.test()) {
  }
  outgoing.wait();
  comm.send(pattern(r, next, 5), next, 8);
  comm.recv(waited, prev, 8);
  out.push_back(polled);
  out.push_back(waited);

  comm.barrier();
  return out;
}

// Records one session on every rank of a thread world of n.
std::vector<CommLog> record_sessions(int n, std::vector<Outputs>& outputs) {
  std::vector<CommLog> logs(static_cast<std::size_t>(n));
  outputs.assign(static_cast<std::size_t>(n), {});
  run_thread_world(
      n,
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        RecordingCommunicator recording(comm, logs[r]);
        EXPECT_EQ(recording.rank(), comm.rank());
        EXPECT_EQ(recording.size(), comm.size());
        outputs[r] = session(recording);
      },
      kTestTimeout);
  return logs;
}

void expect_same_outputs(const Outputs& got, const Outputs& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(same_bytes(got[i], want[i])) << what << ", buffer " << i;
  }
}

class RecordingTest : public ::testing::TestWithParam<int> {};

TEST_P(RecordingTest, ReplayOnOneRankIsBitIdentical) {
  const int n = GetParam();
  std::vector<Outputs> recorded;
  const std::vector<CommLog> logs = record_sessions(n, recorded);
  for (int r = 0; r < n; ++r) {
    const CommLog& log = logs[static_cast<std::size_t>(r)];
    ReplayCommunicator replay(r, n, false, log, fmt::format("[test] rank {}", r));
    EXPECT_EQ(replay.backend(), "replay");
    for (const int pass : {1, 2}) {  // a rewound replay serves the same again
      replay.rewind();
      const Outputs again = session(replay);
      EXPECT_EQ(replay.position(), log.size());
      EXPECT_NO_THROW(replay.expect_consumed());
      expect_same_outputs(again, recorded[static_cast<std::size_t>(r)],
                          fmt::format("rank {} of {}, replay {}", r, n, pass));
    }
  }
}

TEST_P(RecordingTest, LogHasOneRecordPerCall) {
  const int n = GetParam();
  std::vector<Outputs> recorded;
  const std::vector<CommLog> logs = record_sessions(n, recorded);
  for (const CommLog& log : logs) {
    std::size_t collectives = 0;
    for (const CommRecord& record : log) {
      EXPECT_TRUE(record.complete) << comm_op_name(record.op);
      switch (record.op) {
        case CommOp::kSend:
        case CommOp::kBarrier:
          EXPECT_TRUE(record.data.empty()) << comm_op_name(record.op) << ": nothing is received";
          break;
        default:
          EXPECT_EQ(record.data.size(), record.bytes) << comm_op_name(record.op);
          break;
      }
      if (record.op != CommOp::kSend && record.op != CommOp::kRecv) ++collectives;
    }
    // Each collective called on the recording is one record, however the
    // world implements it; the ring all-reduce is its sends and receives.
    EXPECT_EQ(collectives, 5u);
    ASSERT_GE(log.size(), 9u);
    EXPECT_EQ(log.back().op, CommOp::kBarrier);
    EXPECT_EQ(log[log.size() - 5].op, CommOp::kRecv);  // the polled receive
    EXPECT_EQ(log[log.size() - 5].bytes, 70000u);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RecordingTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& world) {
                           return fmt::format("n{}", world.param);
                         });

// Runs `fn` and expects a ReplayMismatch whose message contains every needle.
void expect_mismatch(const std::function<void()>& fn,
                     std::initializer_list<std::string_view> needles) {
  try {
    fn();
    ADD_FAILURE() << "no exception, expected ReplayMismatch";
  } catch (const ReplayMismatch& e) {
    for (const std::string_view needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message '" << e.what() << "' does not mention '" << needle << "'";
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ReplayMismatch, got: " << e.what();
  }
}

// Rank 0's log of a broadcast of 8 bytes, then an allgather of 4 per rank,
// on a world of 2.
CommLog broadcast_then_allgather() {
  std::vector<CommLog> logs(2);
  run_thread_world(
      2,
      [&](Communicator& comm) {
        RecordingCommunicator recording(comm, logs[static_cast<std::size_t>(comm.rank())]);
        std::vector<std::byte> data = garbage(8), all = garbage(8);
        recording.broadcast(data, 1);
        recording.allgather(pattern(comm.rank(), 0, 4), all);
      },
      kTestTimeout);
  return logs[0];
}

TEST(Replay, ADifferentOrderOrSizeIsAClearError) {
  const CommLog log = broadcast_then_allgather();
  ASSERT_EQ(log.size(), 2u);
  std::vector<std::byte> eight = garbage(8), sixteen = garbage(16);
  const std::vector<std::byte> four = garbage(4);

  ReplayCommunicator replay(0, 2, false, log, "[test] bench topk");
  expect_mismatch([&] { replay.allgather(four, eight); },
                  {"[test] bench topk", "call #0", "allgather of 8 bytes",
                   "the recording has broadcast of 8 bytes there"});
  EXPECT_EQ(replay.position(), 0u) << "a mismatched call takes no record";

  expect_mismatch([&] { replay.broadcast(sixteen, 1); },
                  {"call #0", "broadcast of 16 bytes", "broadcast of 8 bytes there"});

  replay.broadcast(eight, 1);
  expect_mismatch([&] { replay.expect_consumed(); },
                  {"[test] bench topk", "made 1 communication calls, the recording 2"});
  replay.allgather(four, eight);
  EXPECT_NO_THROW(replay.expect_consumed());
  expect_mismatch([&] { replay.barrier(); },
                  {"call #2", "barrier of 0 bytes", "the recording has only 2 calls"});
  expect_mismatch([&] { replay.isend(four, 1, 0); }, {"call #2", "send of 4 bytes"});
}

TEST(Replay, MismatchIsACommError) {
  const CommLog log = broadcast_then_allgather();
  ReplayCommunicator replay(0, 2, false, log, "");
  std::vector<std::byte> buffer = garbage(3);
  EXPECT_THROW(replay.broadcast(buffer, 0), CommError);
  EXPECT_THROW(replay.recv(buffer, 1, 0), ReplayMismatch);
}

TEST(Replay, AReceiveThatNeverCompletedIsAnError) {
  CommLog log;
  run_thread_world(
      1,
      [&](Communicator& comm) {
        RecordingCommunicator recording(comm, log);
        std::vector<std::byte> buffer = garbage(16);
        Request never = recording.irecv(buffer, 0, 9);  // no matching send; withdrawn below
      },
      kTestTimeout);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].op, CommOp::kRecv);
  EXPECT_FALSE(log[0].complete);
  ReplayCommunicator replay(0, 1, false, log, "[test]");
  std::vector<std::byte> buffer = garbage(16);
  expect_mismatch([&] { replay.irecv(buffer, 0, 9); },
                  {"call #0", "recv of 16 bytes", "never completed"});
}

TEST(Replay, ALogWithTheWrongNumberOfBytesIsAnError) {
  // Not what a RecordingCommunicator writes, but never a read past the data.
  const CommLog log = {{CommOp::kBroadcast, 8, std::vector<std::byte>(4), true}};
  ReplayCommunicator replay(0, 1, false, log, "[test]");
  std::vector<std::byte> buffer = garbage(8);
  expect_mismatch([&] { replay.broadcast(buffer, 0); }, {"holds 4 received bytes"});
  EXPECT_EQ(replay.position(), 0u);
}

TEST(Replay, NativeAllreduceIsServedAsRecorded) {
  CommLog log;
  std::vector<float> sum = {1.5f, -2.0f};
  std::vector<std::int64_t> count = {7};
  log.push_back({CommOp::kAllreduceFloat, 8, bytes_copy(sum), true});
  log.push_back({CommOp::kAllreduceInt, 8, bytes_copy(count), true});
  ReplayCommunicator replay(0, 3, true, log, "[test]");
  EXPECT_TRUE(replay.has_native_allreduce());
  std::vector<float> floats(2, 0.0f);
  std::vector<std::int64_t> ints(1, 0);
  replay.native_allreduce(std::span<float>(floats));
  replay.native_allreduce(std::span<std::int64_t>(ints));
  EXPECT_EQ(floats, sum);
  EXPECT_EQ(ints, count);
  replay.expect_consumed();
}

}  // namespace
}  // namespace sparsecomm
