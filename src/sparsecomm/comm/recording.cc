#include "sparsecomm/comm/recording.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <utility>

#include <fmt/format.h>

namespace sparsecomm {
namespace {

void copy_bytes(std::span<std::byte> to, std::span<const std::byte> from) {
  if (!from.empty()) std::memcpy(to.data(), from.data(), from.size());
}

// A receive of the recording communicator: completes with the inner request
// and then copies what arrived into its slot of the log (an index: the log
// may grow, and move, while the receive is pending).
class RecordedReceive final : public Request::Impl {
 public:
  RecordedReceive(Request inner, std::span<std::byte> data, CommLog& log, std::size_t slot)
      : inner_(std::move(inner)), data_(data), log_(log), slot_(slot) {}

  bool test() override {
    if (!inner_.test()) return false;
    capture();
    return true;
  }
  bool wait_until(Clock::time_point deadline) override {
    const auto now = Clock::now();
    const auto left = deadline > now ? std::chrono::ceil<std::chrono::milliseconds>(deadline - now)
                                     : std::chrono::milliseconds(0);
    inner_.wait_for(left);  // throws the backend's TimeoutError when it expires
    capture();
    return true;
  }
  [[noreturn]] void fail_timeout(std::chrono::milliseconds waited) override {
    throw TimeoutError(
        fmt::format("[recording] recorded receive timed out after {} ms", waited.count()));
  }

 private:
  void capture() {
    CommRecord& record = log_[slot_];
    if (record.complete) return;
    record.data.assign(data_.begin(), data_.end());
    record.complete = true;
  }
  Request inner_;
  std::span<std::byte> data_;
  CommLog& log_;
  std::size_t slot_;
};

}  // namespace

std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kSend:
      return "send";
    case CommOp::kRecv:
      return "recv";
    case CommOp::kBarrier:
      return "barrier";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kAllgather:
      return "allgather";
    case CommOp::kAllgatherv:
      return "allgatherv";
    case CommOp::kAlltoallv:
      return "alltoallv";
    case CommOp::kAllreduceFloat:
      return "native_allreduce(float)";
    case CommOp::kAllreduceInt:
      return "native_allreduce(int64)";
  }
  return "?";
}

// --- RecordingCommunicator ---

RecordingCommunicator::RecordingCommunicator(Communicator& inner, CommLog& log)
    : inner_(inner), log_(log) {
  set_timeout(inner.timeout());
}

Request RecordingCommunicator::isend(std::span<const std::byte> data, int dst, int tag) {
  log_.push_back({CommOp::kSend, data.size(), {}, true});
  return inner_.isend(data, dst, tag);
}

Request RecordingCommunicator::irecv(std::span<std::byte> data, int src, int tag) {
  const std::size_t slot = log_.size();
  log_.push_back({CommOp::kRecv, data.size(), {}, false});
  Request request = inner_.irecv(data, src, tag);
  return Request(std::make_unique<RecordedReceive>(std::move(request), data, log_, slot),
                 timeout());
}

void RecordingCommunicator::barrier() {
  inner_.barrier();
  log_.push_back({CommOp::kBarrier, 0, {}, true});
}

void RecordingCommunicator::broadcast(std::span<std::byte> data, int root) {
  inner_.broadcast(data, root);
  record(CommOp::kBroadcast, data);
}

void RecordingCommunicator::allgather(std::span<const std::byte> mine, std::span<std::byte> all) {
  inner_.allgather(mine, all);
  record(CommOp::kAllgather, all);
}

void RecordingCommunicator::allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                                       std::span<const std::size_t> counts) {
  inner_.allgatherv(mine, all, counts);
  record(CommOp::kAllgatherv, all);
}

void RecordingCommunicator::alltoallv(std::span<const std::byte> send,
                                      std::span<const std::size_t> send_counts,
                                      std::span<std::byte> recv,
                                      std::span<const std::size_t> recv_counts) {
  inner_.alltoallv(send, send_counts, recv, recv_counts);
  record(CommOp::kAlltoallv, recv);
}

void RecordingCommunicator::native_allreduce(std::span<float> data) {
  inner_.native_allreduce(data);
  record(CommOp::kAllreduceFloat, std::as_writable_bytes(data));
}

void RecordingCommunicator::native_allreduce(std::span<std::int64_t> data) {
  inner_.native_allreduce(data);
  record(CommOp::kAllreduceInt, std::as_writable_bytes(data));
}

void RecordingCommunicator::record(CommOp op, std::span<const std::byte> received) {
  log_.push_back({op, received.size(), {received.begin(), received.end()}, true});
}

// --- ReplayCommunicator ---

ReplayCommunicator::ReplayCommunicator(int rank, int size, bool native_allreduce,
                                       const CommLog& log, std::string label)
    : rank_(rank),
      size_(size),
      native_(native_allreduce),
      log_(log),
      label_(label.empty() ? std::string("[replay]") : std::move(label)) {}

void ReplayCommunicator::expect_consumed() const {
  if (position_ != log_.size()) {
    throw ReplayMismatch(fmt::format("{}: the replay made {} communication calls, the recording {}",
                                     label_, position_, log_.size()));
  }
}

ReplayMismatch ReplayCommunicator::mismatch(CommOp op, std::size_t bytes,
                                            std::string_view what) const {
  return ReplayMismatch(
      fmt::format("{}: communication call #{} ({} of {} bytes) diverges from the recording: {}",
                  label_, position_, comm_op_name(op), bytes, what));
}

const CommRecord& ReplayCommunicator::next(CommOp op, std::size_t bytes) {
  if (position_ >= log_.size()) {
    throw mismatch(op, bytes, fmt::format("the recording has only {} calls", log_.size()));
  }
  const CommRecord& record = log_[position_];
  if (record.op != op || record.bytes != bytes) {
    throw mismatch(op, bytes,
                   fmt::format("the recording has {} of {} bytes there", comm_op_name(record.op),
                               record.bytes));
  }
  if (!record.complete) throw mismatch(op, bytes, "the recorded receive never completed");
  ++position_;
  return record;
}

void ReplayCommunicator::receive(CommOp op, std::span<std::byte> to) {
  const CommRecord& record = next(op, to.size());
  if (record.data.size() != to.size()) {  // a log not written by a RecordingCommunicator
    --position_;
    throw mismatch(op, to.size(),
                   fmt::format("the record holds {} received bytes", record.data.size()));
  }
  copy_bytes(to, record.data);
}

Request ReplayCommunicator::isend(std::span<const std::byte> data, int, int) {
  next(CommOp::kSend, data.size());
  return Request();
}

Request ReplayCommunicator::irecv(std::span<std::byte> data, int, int) {
  receive(CommOp::kRecv, data);
  return Request();
}

void ReplayCommunicator::barrier() { next(CommOp::kBarrier, 0); }

void ReplayCommunicator::broadcast(std::span<std::byte> data, int) {
  receive(CommOp::kBroadcast, data);
}

void ReplayCommunicator::allgather(std::span<const std::byte>, std::span<std::byte> all) {
  receive(CommOp::kAllgather, all);
}

void ReplayCommunicator::allgatherv(std::span<const std::byte>, std::span<std::byte> all,
                                    std::span<const std::size_t>) {
  receive(CommOp::kAllgatherv, all);
}

void ReplayCommunicator::alltoallv(std::span<const std::byte>, std::span<const std::size_t>,
                                   std::span<std::byte> recv, std::span<const std::size_t>) {
  receive(CommOp::kAlltoallv, recv);
}

void ReplayCommunicator::native_allreduce(std::span<float> data) {
  receive(CommOp::kAllreduceFloat, std::as_writable_bytes(data));
}

void ReplayCommunicator::native_allreduce(std::span<std::int64_t> data) {
  receive(CommOp::kAllreduceInt, std::as_writable_bytes(data));
}

}  // namespace sparsecomm
