#pragma once
// Recording what one rank receives, and replaying it on that rank alone.
//
// RecordingCommunicator wraps a real communicator: every call goes through
// to it, and each call appends one CommRecord to a CommLog, in call order:
// the operation, the size of the caller's buffer and, for the operations
// that receive (irecv, broadcast, allgather, allgatherv, alltoallv,
// native_allreduce), the bytes received. What is sent is not recorded;
// sends and barriers record no bytes. An irecv takes its slot when it is
// posted and its bytes when its Request completes (test() or wait()); one
// never completed stays marked incomplete. Collectives are recorded as one
// call each, however the wrapped communicator implements them.
//
// ReplayCommunicator serves such a log back to the same sequence of calls,
// without any peer: each call takes the next record; a receiving call gets
// the recorded bytes copied into its buffer at once (an irecv returns an
// already complete Request), a send goes nowhere, a barrier returns. So a
// computation that depends only on its inputs and what it receives runs
// again on one rank and makes the same choices, bit for bit, without
// waiting for other ranks. Peers, tags, roots and counts are not checked;
// the operation and the buffer size are.
//
// A replay that diverges from the recording is a ReplayMismatch (a
// CommError), never undefined behaviour: a call whose operation or buffer
// size differs from the next record, a call past the end of the log, a
// receive that never completed in the recording, or a record holding another
// number of bytes than its size, each naming the call's number, what was
// called and what was recorded (the failed call takes no record);
// expect_consumed() throws it when fewer calls were made than recorded.
//
// Lifetimes: the log is the caller's and must outlive the communicator (and,
// for a recording, every Request its irecv returned). One thread at a time.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {

enum class CommOp {
  kSend,
  kRecv,
  kBarrier,
  kBroadcast,
  kAllgather,
  kAllgatherv,
  kAlltoallv,
  kAllreduceFloat,
  kAllreduceInt,
};

// "send", "recv", ..., "native_allreduce(float)".
std::string_view comm_op_name(CommOp op);

// One call: what was received (the only thing a replay must reproduce).
struct CommRecord {
  CommOp op = CommOp::kBarrier;
  std::size_t bytes = 0;        // size of the caller's buffer
  std::vector<std::byte> data;  // received bytes (receiving operations)
  bool complete = true;         // false: a receive that has not completed (yet)
};
using CommLog = std::vector<CommRecord>;

// A replay diverged from its recording (see above).
class ReplayMismatch : public CommError {
 public:
  using CommError::CommError;
};

// Forwards everything to `inner` and appends what each call received to `log`.
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(Communicator& inner, CommLog& log);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string_view backend() const override { return inner_.backend(); }

  Request isend(std::span<const std::byte> data, int dst, int tag) override;
  Request irecv(std::span<std::byte> data, int src, int tag) override;
  void barrier() override;
  void broadcast(std::span<std::byte> data, int root) override;
  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) override;
  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override;
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override;
  bool has_native_allreduce() const override { return inner_.has_native_allreduce(); }
  void native_allreduce(std::span<float> data) override;
  void native_allreduce(std::span<std::int64_t> data) override;

 private:
  void record(CommOp op, std::span<const std::byte> received);
  Communicator& inner_;
  CommLog& log_;
};

// Serves `log` back in order as rank `rank` of a world of `size`, with no
// peer. `native_allreduce` is what the recorded communicator's
// has_native_allreduce() said; `label` opens every error message (what is
// being replayed, e.g. "[bench] topk: the re-run of select()").
class ReplayCommunicator final : public Communicator {
 public:
  ReplayCommunicator(int rank, int size, bool native_allreduce, const CommLog& log,
                     std::string label);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "replay"; }

  // Starts again from the first record.
  void rewind() { position_ = 0; }
  // Calls replayed so far.
  std::size_t position() const { return position_; }
  // Throws ReplayMismatch unless every record has been replayed.
  void expect_consumed() const;

  Request isend(std::span<const std::byte> data, int dst, int tag) override;
  Request irecv(std::span<std::byte> data, int src, int tag) override;
  void barrier() override;
  void broadcast(std::span<std::byte> data, int root) override;
  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) override;
  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override;
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override;
  bool has_native_allreduce() const override { return native_; }
  void native_allreduce(std::span<float> data) override;
  void native_allreduce(std::span<std::int64_t> data) override;

 private:
  // The error for call #position_ (`op` of `bytes`), saying `what` differs.
  ReplayMismatch mismatch(CommOp op, std::size_t bytes, std::string_view what) const;
  // The next record, checked against this call; throws ReplayMismatch.
  const CommRecord& next(CommOp op, std::size_t bytes);
  // next(), then its bytes copied into `to`.
  void receive(CommOp op, std::span<std::byte> to);

  int rank_, size_;
  bool native_;
  const CommLog& log_;
  std::string label_;
  std::size_t position_ = 0;
};

}  // namespace sparsecomm
