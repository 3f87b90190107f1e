#include "process_group_communicator.h"

#include <chrono>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm::python {
namespace {

// A message as c10d takes it: one uint8 tensor over the caller's bytes
// (no copy), or over a one-byte placeholder for an empty message.
struct Message {
  std::unique_ptr<std::byte> placeholder;
  std::vector<at::Tensor> tensors;
};

Message message_of(std::byte* data, std::size_t size) {
  Message message;
  if (size == 0) {
    message.placeholder = std::make_unique<std::byte>(std::byte{0});
    data = message.placeholder.get();
    size = 1;
  }
  message.tensors.push_back(torch::from_blob(data, {static_cast<std::int64_t>(size)},
                                             torch::TensorOptions().dtype(torch::kUInt8)));
  return message;
}

// One pending send or recv: the c10d work and the message it reads or
// writes (kept alive until the work is done or withdrawn).
class WorkRequest final : public Request::Impl {
 public:
  WorkRequest(c10::intrusive_ptr<c10d::Work> work, Message message, std::string what)
      : work_(std::move(work)), message_(std::move(message)), what_(std::move(what)) {}

  // Withdraws a message still pending (an error is unwinding): gloo stops
  // waiting on the buffer, so nothing is written into it later.
  ~WorkRequest() override {
    if (done_) return;
    try {
      work_->abort();
    } catch (...) {  // nothing more can be done while unwinding
    }
  }

  // gloo's send and recv work reports completion only through wait(), so a
  // poll cannot see it: false until waited for. (sparsecomm polls only to
  // retire sends early; it always waits in the end.)
  bool test() override { return done_; }

  // c10d's wait(timeout) throws on a timeout as on a failure: the clock
  // tells them apart.
  bool wait_until(Clock::time_point deadline) override {
    if (done_) return true;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      work_->wait(std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      if (Clock::now() >= deadline) return false;
      throw CommError(fmt::format("{} failed: {}", what_, e.what()));
    }
    done_ = true;
    return true;
  }

  [[noreturn]] void fail_timeout(std::chrono::milliseconds waited) override {
    throw TimeoutError(fmt::format("{} did not complete in {} ms", what_, waited.count()));
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  Message message_;
  std::string what_;
  bool done_ = false;
};

}  // namespace

ProcessGroupCommunicator::ProcessGroupCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> group)
    : group_(std::move(group)) {
  if (!group_) throw InvalidArgument("[torch] the process group is None");
  rank_ = group_->getRank();
  size_ = group_->getSize();
}

Request ProcessGroupCommunicator::isend(std::span<const std::byte> data, int dst, int tag) {
  check_peer_and_tag(dst, tag, "isend");
  // c10d sends from a non-const tensor; the bytes are only read.
  Message message = message_of(const_cast<std::byte*>(data.data()), data.size());
  auto work = group_->send(message.tensors, dst, tag);
  return Request(std::make_unique<WorkRequest>(std::move(work), std::move(message),
                                               fmt::format("{}send of {} bytes to rank {} (tag {})",
                                                           where(), data.size(), dst, tag)),
                 timeout(), {.peer = dst, .bytes = data.size(), .send = true});
}

Request ProcessGroupCommunicator::irecv(std::span<std::byte> data, int src, int tag) {
  check_peer_and_tag(src, tag, "irecv");
  Message message = message_of(data.data(), data.size());
  auto work = group_->recv(message.tensors, src, tag);
  return Request(
      std::make_unique<WorkRequest>(
          std::move(work), std::move(message),
          fmt::format("{}recv of {} bytes from rank {} (tag {})", where(), data.size(), src, tag)),
      timeout(), {.peer = src, .bytes = data.size(), .send = false});
}

}  // namespace sparsecomm::python
