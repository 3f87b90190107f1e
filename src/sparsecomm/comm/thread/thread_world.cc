#include "sparsecomm/comm/thread/thread_world.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"

namespace sparsecomm {
namespace {

// Messages up to this size are copied into the mailbox when no receive is
// posted yet, so the send completes at once; larger ones wait for the
// receiver, which copies straight from the sender's buffer (one copy).
constexpr std::size_t kEagerBytes = 64 * 1024;

// How often a blocked call wakes to check whether the world was aborted.
constexpr auto kAbortPollInterval = std::chrono::milliseconds(5);

// Completion state of one operation, shared between the Request that waits
// on it and whichever rank completes it.
struct OpState {
  enum Status { kPending, kDone, kFailed };
  std::mutex mutex;
  std::condition_variable cv;
  Status status = kPending;
  std::exception_ptr error;

  void finish(std::exception_ptr failure = nullptr) {
    {
      std::lock_guard lock(mutex);
      error = std::move(failure);
      status = error ? kFailed : kDone;
    }
    cv.notify_all();
  }
};

struct PendingSend {
  int src;
  int tag;
  std::span<const std::byte> data;  // rendezvous: the sender's buffer
  std::vector<std::byte> eager;     // eager: a copy, and state == nullptr
  std::shared_ptr<OpState> state;
  std::size_t size() const { return state ? data.size() : eager.size(); }
  const std::byte* bytes() const { return state ? data.data() : eager.data(); }
};

struct PendingRecv {
  int src;
  int tag;
  std::span<std::byte> buffer;
  std::shared_ptr<OpState> state;
};

// Unmatched sends and receives addressed to one rank.
struct Mailbox {
  std::mutex mutex;
  std::deque<PendingSend> sends;
  std::deque<PendingRecv> recvs;
};

class ThreadWorld {
 public:
  explicit ThreadWorld(int ranks) : mailboxes_(static_cast<std::size_t>(ranks)) {}

  int size() const { return static_cast<int>(mailboxes_.size()); }
  Mailbox& mailbox(int rank) { return mailboxes_[static_cast<std::size_t>(rank)]; }

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // The first failure wins; later calls are ignored.
  void abort(int rank, const std::string& what) {
    std::lock_guard lock(abort_mutex_);
    if (aborted()) return;
    abort_reason_ = fmt::format("rank {} failed: {}", rank, what);
    aborted_.store(true, std::memory_order_release);
  }
  std::string abort_reason() const {
    std::lock_guard lock(abort_mutex_);
    return abort_reason_;
  }

 private:
  std::vector<Mailbox> mailboxes_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mutex_;
  std::string abort_reason_;
};

class ThreadCommunicator;

// A pending isend or irecv on the thread backend.
class ThreadRequest final : public Request::Impl {
 public:
  ThreadRequest(ThreadCommunicator& comm, std::shared_ptr<OpState> state, bool is_send, int peer,
                int tag, std::size_t bytes)
      : comm_(comm),
        state_(std::move(state)),
        is_send_(is_send),
        peer_(peer),
        tag_(tag),
        bytes_(bytes) {}
  ~ThreadRequest() override { cancel(); }

  bool test() override;
  bool wait_until(Clock::time_point deadline) override;
  [[noreturn]] void fail_timeout(std::chrono::milliseconds waited) override;

 private:
  std::string describe() const;
  // Withdraws the operation if no peer has matched it yet, else waits for the
  // matching peer to finish copying, so the buffer is free on return.
  void cancel();
  bool finished_locked() const;

  ThreadCommunicator& comm_;
  std::shared_ptr<OpState> state_;
  bool is_send_;
  int peer_;
  int tag_;
  std::size_t bytes_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadWorld& world, int rank, std::chrono::milliseconds timeout)
      : world_(world), rank_(rank) {
    set_timeout(timeout);
  }

  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  std::string_view backend() const override { return "thread"; }

  Request isend(std::span<const std::byte> data, int dst, int tag) override {
    check_peer_and_tag(dst, tag, "send");
    throw_if_aborted(fmt::format("send to rank {} (tag {})", dst, tag));
    Mailbox& box = world_.mailbox(dst);
    std::unique_lock lock(box.mutex);
    auto match = std::find_if(box.recvs.begin(), box.recvs.end(),
                              [&](const PendingRecv& r) { return r.src == rank_ && r.tag == tag; });
    if (match != box.recvs.end()) {
      PendingRecv recv = std::move(*match);
      box.recvs.erase(match);
      lock.unlock();
      if (recv.buffer.size() != data.size()) {
        const std::string message = size_mismatch(rank_, dst, tag, data.size(), recv.buffer.size());
        recv.state->finish(std::make_exception_ptr(CommError(
            fmt::format("[thread] rank {}: recv from rank {}: {}", dst, rank_, message))));
        throw CommError(where() + fmt::format("send to rank {}: {}", dst, message));
      }
      if (!data.empty()) std::memcpy(recv.buffer.data(), data.data(), data.size());
      recv.state->finish();
      return {};
    }
    if (data.size() <= kEagerBytes) {
      box.sends.push_back(
          {rank_, tag, {}, std::vector<std::byte>(data.begin(), data.end()), nullptr});
      return {};
    }
    auto state = std::make_shared<OpState>();
    box.sends.push_back({rank_, tag, data, {}, state});
    return Request(std::make_unique<ThreadRequest>(*this, state, true, dst, tag, data.size()),
                   timeout(), {.peer = dst, .bytes = data.size(), .send = true});
  }

  Request irecv(std::span<std::byte> buffer, int src, int tag) override {
    check_peer_and_tag(src, tag, "recv");
    throw_if_aborted(fmt::format("recv from rank {} (tag {})", src, tag));
    Mailbox& box = world_.mailbox(rank_);
    std::unique_lock lock(box.mutex);
    auto match = std::find_if(box.sends.begin(), box.sends.end(),
                              [&](const PendingSend& s) { return s.src == src && s.tag == tag; });
    if (match != box.sends.end()) {
      PendingSend send = std::move(*match);
      box.sends.erase(match);
      lock.unlock();
      if (send.size() != buffer.size()) {
        const std::string message = size_mismatch(src, rank_, tag, send.size(), buffer.size());
        if (send.state) {
          send.state->finish(std::make_exception_ptr(CommError(
              fmt::format("[thread] rank {}: send to rank {}: {}", src, rank_, message))));
        }
        throw CommError(where() + fmt::format("recv from rank {}: {}", src, message));
      }
      if (!buffer.empty()) std::memcpy(buffer.data(), send.bytes(), buffer.size());
      if (send.state) send.state->finish();
      return {};
    }
    auto state = std::make_shared<OpState>();
    box.recvs.push_back({src, tag, buffer, state});
    return Request(std::make_unique<ThreadRequest>(*this, state, false, src, tag, buffer.size()),
                   timeout(), {.peer = src, .bytes = buffer.size(), .send = false});
  }

  ThreadWorld& world() { return world_; }

  void throw_if_aborted(const std::string& operation) const {
    if (world_.aborted()) {
      throw PeerFailure(where() +
                        fmt::format("{} cancelled: {}", operation, world_.abort_reason()));
    }
  }

 private:
  static std::string size_mismatch(int src, int dst, int tag, std::size_t sent,
                                   std::size_t expected) {
    return fmt::format(
        "message size mismatch on tag {}: rank {} sent {} bytes, rank {} expected {} bytes "
        "(do all ranks pass the same sizes?)",
        tag, src, sent, dst, expected);
  }

  ThreadWorld& world_;
  int rank_;
};

bool ThreadRequest::finished_locked() const { return state_->status != OpState::kPending; }

std::string ThreadRequest::describe() const {
  return fmt::format("{} rank {} (tag {}, {} bytes)", is_send_ ? "send to" : "recv from", peer_,
                     tag_, bytes_);
}

bool ThreadRequest::test() {
  {
    std::lock_guard lock(state_->mutex);
    if (state_->status == OpState::kFailed) std::rethrow_exception(state_->error);
    if (state_->status == OpState::kDone) return true;
  }
  // Like wait_until: a request that can no longer complete because another
  // rank failed reports that failure, so a polling loop cannot spin forever.
  if (comm_.world().aborted()) {
    cancel();
    comm_.throw_if_aborted(describe());
  }
  return false;
}

bool ThreadRequest::wait_until(Clock::time_point deadline) {
  std::unique_lock lock(state_->mutex);
  for (;;) {
    if (state_->status == OpState::kDone) return true;
    if (state_->status == OpState::kFailed) std::rethrow_exception(state_->error);
    if (comm_.world().aborted()) {
      lock.unlock();
      cancel();
      comm_.throw_if_aborted(describe());
    }
    const auto now = Clock::now();
    if (now >= deadline) return false;
    state_->cv.wait_until(lock, std::min(deadline, now + kAbortPollInterval));
  }
}

void ThreadRequest::fail_timeout(std::chrono::milliseconds waited) {
  cancel();
  throw TimeoutError(comm_.where() +
                     fmt::format("{} timed out after {} ms: rank {} did not {}", describe(),
                                 waited.count(), peer_,
                                 is_send_ ? "post a matching receive" : "send a matching message"));
}

void ThreadRequest::cancel() {
  {
    std::lock_guard lock(state_->mutex);
    if (finished_locked()) return;
  }
  Mailbox& box = comm_.world().mailbox(is_send_ ? peer_ : comm_.rank());
  bool withdrawn = false;
  {
    std::lock_guard lock(box.mutex);
    if (is_send_) {
      auto it = std::find_if(box.sends.begin(), box.sends.end(),
                             [&](const PendingSend& s) { return s.state == state_; });
      if (it != box.sends.end()) {
        box.sends.erase(it);
        withdrawn = true;
      }
    } else {
      auto it = std::find_if(box.recvs.begin(), box.recvs.end(),
                             [&](const PendingRecv& r) { return r.state == state_; });
      if (it != box.recvs.end()) {
        box.recvs.erase(it);
        withdrawn = true;
      }
    }
  }
  if (withdrawn) {
    // No peer will ever complete it now; mark it so later waits end at once.
    state_->finish(
        std::make_exception_ptr(CommError(comm_.where() + describe() + " was cancelled")));
    return;
  }
  // A peer took it out of the mailbox and is copying now: wait until it is done.
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return finished_locked(); });
}

}  // namespace

void run_thread_world(int ranks, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout) {
  if (ranks < 1) {
    throw InvalidArgument(fmt::format("[thread] a world needs at least 1 rank, got {}", ranks));
  }
  ThreadWorld world(ranks);
  std::mutex failure_mutex;
  std::exception_ptr first_failure;

  auto body = [&](int rank) {
    try {
      set_thread_log_rank(rank);
      ThreadCommunicator comm(world, rank, timeout);
      fn(comm);
    } catch (...) {
      std::string what = "unknown exception";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::lock_guard lock(failure_mutex);
      if (!first_failure) first_failure = std::current_exception();
      world.abort(rank, what);
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks));
  for (int rank = 0; rank < ranks; ++rank) threads.emplace_back(body, rank);
  for (auto& thread : threads) thread.join();
  if (first_failure) std::rethrow_exception(first_failure);
}

}  // namespace sparsecomm
