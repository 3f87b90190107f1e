#pragma once
// The Communicator: what every backend (threads in one process, OpenMPI)
// provides and what every collective in collectives/ is built on.
//
// Contract shared by all methods:
//  - Buffers are borrowed. For a non-blocking call the buffer must stay alive
//    and untouched until the returned Request completes.
//  - A receive must be posted with exactly the size of the matching send;
//    a size mismatch is a CommError naming both ranks (this is how mismatched
//    buffer sizes across ranks are detected).
//  - Messages between one pair of ranks with one tag arrive in send order.
//  - Every blocking call (and Request::wait) gives up after timeout() with a
//    TimeoutError that names the operation, the peer(s) and the tag. After
//    it returns, nothing writes into the caller's buffers: the thread
//    backend withdraws the operation; the MPI backend cancels a receive,
//    and aborts the job (MPI_Abort, with the same message) where it
//    cannot: a timed-out collective, or a receive that does not cancel.
//  - Collectives: every rank of the world calls them in the same order.
//  - A Communicator is used by one thread at a time.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "sparsecomm/core/timeline.h"
#include "sparsecomm/core/timer.h"

namespace sparsecomm {

// Tag space. User code may use tags in [0, kMaxUserTag]; the library's own
// protocols (collectives, the parameter server) use the reserved tags above
// it, all listed here so that none collides. Every backend accepts tags in
// [0, kMaxTag].
inline constexpr int kMaxUserTag = 29999;
inline constexpr int kMaxTag = 32767;  // the minimum MPI guarantees
namespace tags {
inline constexpr int kBarrier = 30000;
inline constexpr int kBroadcast = 30001;
inline constexpr int kAllgather = 30002;
inline constexpr int kAlltoall = 30003;
inline constexpr int kRingReduceScatter = 30010;
inline constexpr int kRingAllgather = 30011;
// Dense recursive-doubling all-reduce (collectives/allreduce.cc).
inline constexpr int kRecursiveDoubling = 30012;
// Sparse all-reduce, recursive doubling (collectives/sparse_allreduce.cc).
inline constexpr int kSparseAllreduceHeader = 30020;
inline constexpr int kSparseAllreducePayload = 30021;
// Parameter-server protocol (ps/protocol.h): worker <-> server messages.
inline constexpr int kPsRequest = 30100;
inline constexpr int kPsPushPayload = 30101;
inline constexpr int kPsPullVersion = 30102;
inline constexpr int kPsPullPayload = 30103;
inline constexpr int kPsGrant = 30104;
}  // namespace tags

// What a point-to-point operation moves, for the timeline's waits.
struct RequestEndpoint {
  int peer = -1;
  std::size_t bytes = 0;
  bool send = false;
};

// Handle of a non-blocking operation. Move-only; an empty (default) Request
// is already complete. Destroying an incomplete Request (for example while
// unwinding from an error) withdraws it where the backend can, so nothing is
// ever written into a buffer that is gone; in normal operation wait() on
// every request you start.
class Request {
 public:
  // What a backend implements for one pending operation.
  class Impl {
   public:
    virtual ~Impl() = default;
    // Polls once; true when complete. Throws the operation's error, or
    // PeerFailure when the world was aborted (a polling loop cannot spin on a
    // request that can no longer complete).
    virtual bool test() = 0;
    // Blocks until complete (true) or until `deadline` (false). Throws the
    // operation's error, or PeerFailure when the world was aborted.
    virtual bool wait_until(Clock::time_point deadline) = 0;
    // Throws the TimeoutError for this operation after `waited` (the backend
    // knows what to name and may abort the job instead of throwing).
    [[noreturn]] virtual void fail_timeout(std::chrono::milliseconds waited) = 0;
  };

  using Endpoint = RequestEndpoint;

  Request() = default;
  Request(std::unique_ptr<Impl> impl, std::chrono::milliseconds timeout, Endpoint endpoint = {})
      : impl_(std::move(impl)), timeout_(timeout), endpoint_(endpoint) {}

  bool test() { return !impl_ || impl_->test(); }
  // Waits up to the communicator's timeout at the time of the call.
  void wait() { wait_for(timeout_); }
  // A wait that blocks goes on the thread's timeline (core/timeline.h) as
  // "wait send" or "wait recv" with the peer and the bytes.
  void wait_for(std::chrono::milliseconds timeout) {
    if (!impl_) return;
    Timeline* timeline = current_timeline();
    if (timeline == nullptr || impl_->test()) {
      if (!impl_->wait_until(Clock::now() + timeout)) impl_->fail_timeout(timeout);
    } else {
      const Clock::time_point begin = Clock::now();
      if (!impl_->wait_until(begin + timeout)) impl_->fail_timeout(timeout);
      timeline->add_span(endpoint_.send ? "wait send" : "wait recv", "wait", begin, Clock::now(),
                         endpoint_.peer, endpoint_.bytes);
    }
    impl_.reset();
  }

 private:
  std::unique_ptr<Impl> impl_;
  std::chrono::milliseconds timeout_{0};
  Endpoint endpoint_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "thread" or "mpi".
  virtual std::string_view backend() const = 0;

  // Limit for every blocking call made through this communicator.
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout);

  // --- point-to-point (what a backend must provide) ---
  virtual Request isend(std::span<const std::byte> data, int dst, int tag) = 0;
  virtual Request irecv(std::span<std::byte> data, int src, int tag) = 0;
  void send(std::span<const std::byte> data, int dst, int tag) { isend(data, dst, tag).wait(); }
  void recv(std::span<std::byte> data, int src, int tag) { irecv(data, src, tag).wait(); }

  // --- collectives; the defaults are built on point-to-point ---
  virtual void barrier();
  // `data` has the same size on every rank; root's content ends up everywhere.
  // A binomial tree, or a scatter and ring allgather for large buffers
  // (broadcast_rule.h says which).
  virtual void broadcast(std::span<std::byte> data, int root);
  // `all.size() == size() * mine.size()`; rank r's bytes land at r*mine.size().
  virtual void allgather(std::span<const std::byte> mine, std::span<std::byte> all);
  // `counts[r]` bytes from rank r land at the prefix sum of counts; every rank
  // passes the same counts, `mine.size() == counts[rank()]`,
  // `all.size() == sum(counts)`.
  virtual void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                          std::span<const std::size_t> counts);
  // Rank r sends send_counts[q] bytes (packed in rank order) to every rank q
  // and receives recv_counts[q] bytes from q (packed in rank order).
  virtual void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                         std::span<std::byte> recv, std::span<const std::size_t> recv_counts);

  // --- optional native all-reduce (sum), for comparison with our own ---
  virtual bool has_native_allreduce() const { return false; }
  virtual void native_allreduce(std::span<float> data);
  virtual void native_allreduce(std::span<std::int64_t> data);
  // --- optional native allgatherv (MPI's), for comparison with the ring ---
  // Same contract as allgatherv. Decorators (recording, delay) do not offer it.
  virtual bool has_native_allgatherv() const { return false; }
  virtual void native_allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                                 std::span<const std::size_t> counts);
  // --- optional native broadcast (MPI's), for comparison with the tree ---
  // Same contract as broadcast. Decorators (recording, delay) do not offer it.
  virtual bool has_native_broadcast() const { return false; }
  virtual void native_broadcast(std::span<std::byte> data, int root);

  // Prefix for error messages: "[<backend>] rank <r>: ".
  std::string where() const;

 protected:
  // Throws InvalidArgument unless 0 <= peer < size() and 0 <= tag <= kMaxTag.
  void check_peer_and_tag(int peer, int tag, std::string_view op) const;

 private:
  // The ring allgather of allgatherv, in place: rank r's block
  // [offsets[r], offsets[r+1]) of `all` is already there.
  void ring_allgather_in_place(std::span<std::byte> all, std::span<const std::size_t> offsets,
                               int tag);
  void binomial_broadcast(std::span<std::byte> data, int root);
  void scatter_allgather_broadcast(std::span<std::byte> data, int root);

  std::chrono::milliseconds timeout_{std::chrono::seconds(60)};
};

// Default timeout of new communicators, overridable with the environment
// variable SPARSECOMM_TIMEOUT_MS.
std::chrono::milliseconds default_timeout();

}  // namespace sparsecomm
