// The OpenMPI backend (see mpi_communicator.h).
//
// Every operation is started non-blocking (MPI_Isend, MPI_Irecv, MPI_Ibarrier,
// MPI_Iallgather, MPI_Ialltoallv, MPI_Iallreduce; broadcast and allgatherv
// are Communicator's tree and ring on MPI_Isend/MPI_Irecv, MPI_Ibcast and
// MPI_Iallgatherv their native_ versions) and completed
// by polling MPI_Test against a deadline, so that a stalled peer becomes a
// TimeoutError instead of a hang. The polling backs off (spin, then
// sched_yield, then short sleeps) so that more ranks than cores still make
// progress.
//
// Thread level: MPI_THREAD_SERIALIZED. Any thread may use MPI, but never two
// at once, across all MpiCommunicator objects of the process.

#define OMPI_SKIP_MPICXX 1  // the C API only: no deprecated C++ bindings
#define MPICH_SKIP_MPICXX 1

#include "sparsecomm/comm/mpi/mpi_communicator.h"
#include "sparsecomm/comm/mpi/mpi_runtime.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <mpi.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"

namespace sparsecomm {
namespace {

constexpr std::size_t kMaxMpiCount = static_cast<std::size_t>(std::numeric_limits<int>::max());
// Largest piece of a broadcast or all-reduce handed to MPI in one call; the
// rest follows in further calls (every rank splits the same way).
constexpr std::size_t kChunkBytes = std::size_t{1} << 30;

// Polling backoff: the first polls spin, then yield the core until
// kYieldFor has passed, then sleep between polls, growing to kMaxSleep.
constexpr int kSpinPolls = 64;
constexpr auto kYieldFor = std::chrono::milliseconds(1);
constexpr auto kMinSleep = std::chrono::microseconds(50);
constexpr auto kMaxSleep = std::chrono::microseconds(200);
// How long an abandoned receive may take to finish after MPI_Cancel.
constexpr auto kCancelGrace = std::chrono::seconds(1);

enum class OpKind { kSend, kRecv, kCollective };

// What a pending operation is, for error messages. Plain data: building one
// allocates nothing; the text is only formatted when something fails.
struct OpInfo {
  OpKind kind;
  const char* name;      // "send", "recv", "barrier", "broadcast", ...
  const char* mpi_call;  // "MPI_Isend", "MPI_Ibcast", ...
  int peer;              // point-to-point: the other rank; broadcast: the root; else -1
  int tag;               // point-to-point only, else -1
  std::size_t bytes;     // this rank's payload
};

// "recv from rank 3 (tag 30010, 4096 bytes)", "barrier (MPI_Ibarrier)", ...
std::string describe(const OpInfo& op) {
  switch (op.kind) {
    case OpKind::kSend:
      return fmt::format("send to rank {} (tag {}, {} bytes)", op.peer, op.tag, op.bytes);
    case OpKind::kRecv:
      return fmt::format("recv from rank {} (tag {}, {} bytes)", op.peer, op.tag, op.bytes);
    case OpKind::kCollective:
      break;
  }
  if (op.peer >= 0) {
    return fmt::format("{} from root {} ({}, {} bytes)", op.name, op.peer, op.mpi_call, op.bytes);
  }
  if (std::string_view(op.name) == "barrier") return fmt::format("barrier ({})", op.mpi_call);
  return fmt::format("{} ({}, {} bytes)", op.name, op.mpi_call, op.bytes);
}

std::string prefix(int rank) { return fmt::format("[mpi] rank {}: ", rank); }

// Polls with the backoff described at the top of this file.
class Backoff {
 public:
  void pause() {
    ++polls_;
    if (polls_ <= kSpinPolls) return;
    const auto now = Clock::now();
    if (polls_ == kSpinPolls + 1) yield_until_ = now + kYieldFor;
    if (now < yield_until_) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, kMaxSleep);
  }

 private:
  int polls_ = 0;
  Clock::time_point yield_until_{};
  std::chrono::microseconds sleep_{kMinSleep};
};

// One pending MPI operation. An abandoned receive (a timeout or an error
// unwound past it) is cancelled on destruction, so MPI never writes into a
// buffer the caller has since freed; a receive that does not cancel within
// kCancelGrace aborts the job instead. An abandoned send is released and
// completes in the background (MPI may still read its buffer, never write
// it). A collective cannot be
// withdrawn at all (MPI forbids it): its timeout aborts the job, so no
// caller ever goes on while MPI may still write into its buffer.
class MpiRequest final : public Request::Impl {
 public:
  MpiRequest(int rank, int world_size, MPI_Request request, const OpInfo& op)
      : rank_(rank), world_size_(world_size), request_(request), op_(op) {}
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;

  ~MpiRequest() override {
    if (done_ || request_ == MPI_REQUEST_NULL || mpi_finalized()) return;
    if (op_.kind == OpKind::kSend) {
      MPI_Request_free(&request_);
    } else if (op_.kind == OpKind::kRecv) {
      MPI_Cancel(&request_);
      const auto give_up = Clock::now() + kCancelGrace;
      Backoff backoff;
      int flag = 0;
      while (MPI_Test(&request_, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag == 0 &&
             Clock::now() < give_up) {
        backoff.pause();
      }
      if (flag == 0 && request_ != MPI_REQUEST_NULL) {
        mpi_abort_job(prefix(rank_) + fmt::format("{} could not be cancelled within {} s after "
                                                  "it was abandoned; MPI could still write into "
                                                  "the receive buffer, so the job is aborted",
                                                  describe(op_), kCancelGrace.count()),
                      1);
      }
    }
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&request_, &flag, &status);
    if (rc != MPI_SUCCESS) fail(rc);
    if (flag == 0) return false;
    done_ = true;
    if (op_.kind == OpKind::kRecv) check_count(status);
    return true;
  }

  bool wait_until(Clock::time_point deadline) override {
    Backoff backoff;
    while (!test()) {
      if (Clock::now() >= deadline) return false;
      backoff.pause();
    }
    return true;
  }

  [[noreturn]] void fail_timeout(std::chrono::milliseconds waited) override {
    std::string hint;
    switch (op_.kind) {
      case OpKind::kSend:
        hint = fmt::format("rank {} did not receive", op_.peer);
        break;
      case OpKind::kRecv:
        hint = fmt::format("rank {} did not send", op_.peer);
        break;
      case OpKind::kCollective:
        hint = fmt::format("not all {} ranks called {}", world_size_, op_.name);
        break;
    }
    const std::string message = prefix(rank_) + fmt::format("{} timed out after {} ms: {}",
                                                            describe(op_), waited.count(), hint);
    if (op_.kind == OpKind::kCollective) {
      mpi_abort_job(message +
                        "; MPI cannot withdraw a collective it has started (it could "
                        "still write into the caller's buffer), so the job is aborted",
                    1);
    }
    throw TimeoutError(message);
  }

 private:
  [[noreturn]] void fail(int rc) {
    done_ = true;
    // Open MPI keeps a request that completed with an error; release it.
    if (request_ != MPI_REQUEST_NULL) MPI_Request_free(&request_);
    if (op_.kind == OpKind::kRecv && mpi_error_class(rc) == MPI_ERR_TRUNCATE) {
      throw CommError(
          prefix(rank_) +
          fmt::format(
              "recv from rank {} (tag {}) got more than the {} bytes posted (message truncated); "
              "a receive must be posted with the sender's size",
              op_.peer, op_.tag, op_.bytes));
    }
    throw CommError(prefix(rank_) +
                    fmt::format("{} failed: {}", describe(op_), mpi_error_text(rc)));
  }

  void check_count(const MPI_Status& status) const {
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    if (count < 0 || static_cast<std::size_t>(count) != op_.bytes) {
      throw CommError(prefix(rank_) +
                      fmt::format("recv from rank {} (tag {}) got {} bytes, expected {}", op_.peer,
                                  op_.tag, count, op_.bytes));
    }
  }

  int rank_;
  int world_size_;
  MPI_Request request_;
  OpInfo op_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::chrono::milliseconds timeout) {
    ensure_mpi_runtime();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    set_process_log_rank(rank_);
    set_timeout(timeout);
    const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    if (rc != MPI_SUCCESS) {
      comm_ = MPI_COMM_NULL;
      throw CommError(where() + "MPI_Comm_dup(MPI_COMM_WORLD) failed: " + mpi_error_text(rc));
    }
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }

  Request isend(std::span<const std::byte> data, int dst, int tag) override {
    return point_to_point("isend", {OpKind::kSend, "send", "MPI_Isend", dst, tag, data.size()},
                          [&](int count, MPI_Request* request) {
                            return MPI_Isend(data.data(), count, MPI_BYTE, dst, tag, comm_,
                                             request);
                          });
  }

  Request irecv(std::span<std::byte> data, int src, int tag) override {
    return point_to_point("irecv", {OpKind::kRecv, "recv", "MPI_Irecv", src, tag, data.size()},
                          [&](int count, MPI_Request* request) {
                            return MPI_Irecv(data.data(), count, MPI_BYTE, src, tag, comm_,
                                             request);
                          });
  }

  void barrier() override {
    const OpInfo op{OpKind::kCollective, "barrier", "MPI_Ibarrier", -1, -1, 0};
    MPI_Request request = MPI_REQUEST_NULL;
    start(MPI_Ibarrier(comm_, &request), op);
    complete(request, op);
  }

  void broadcast(std::span<std::byte> data, int root) override {
    // Our binomial tree on MPI point-to-point, not MPI_Ibcast: on 4
    // emulated hosts Open MPI 4.1's non-blocking broadcast (libnbc) took
    // 1.3-1.5x the tree's time for 1 and 4 MiB at 200 Mbit/s and 1 Gbit/s
    // (docs/benchmarks/collectives.md, "Allgather and broadcast on the MPI backend";
    // the exception, a 1 MiB burst into a shallow 5 ms
    // queue, is a TCP retransmission stall), and the tree is what the
    // performance model prices. Pieces of at most kChunkBytes keep every
    // message within MPI's int counts.
    std::size_t offset = 0;
    do {
      const std::size_t chunk = std::min(data.size() - offset, kChunkBytes);
      Communicator::broadcast(data.subspan(offset, chunk), root);
      offset += chunk;
    } while (offset < data.size());
  }

  bool has_native_broadcast() const override { return true; }
  void native_broadcast(std::span<std::byte> data, int root) override {
    check_peer_and_tag(root, tags::kBroadcast, "broadcast");
    const OpInfo op{OpKind::kCollective, "broadcast", "MPI_Ibcast", root, -1, data.size()};
    std::size_t offset = 0;
    do {
      const std::size_t chunk = std::min(data.size() - offset, kChunkBytes);
      MPI_Request request = MPI_REQUEST_NULL;
      start(MPI_Ibcast(data.data() + offset, static_cast<int>(chunk), MPI_BYTE, root, comm_,
                       &request),
            op);
      complete(request, op);
      offset += chunk;
    } while (offset < data.size());
  }

  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) override {
    if (all.size() != mine.size() * static_cast<std::size_t>(size_)) {
      throw InvalidArgument(
          where() + fmt::format("allgather: {} bytes to receive, expected {} ranks x {} bytes",
                                all.size(), size_, mine.size()));
    }
    const OpInfo op{OpKind::kCollective, "allgather", "MPI_Iallgather", -1, -1, mine.size()};
    const int count = to_int(mine.size(), op);
    MPI_Request request = MPI_REQUEST_NULL;
    start(
        MPI_Iallgather(mine.data(), count, MPI_BYTE, all.data(), count, MPI_BYTE, comm_, &request),
        op);
    complete(request, op);
  }

  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override {
    check_allgatherv(mine, all, counts, "ring allgatherv");
    // Our ring on MPI point-to-point, not MPI_Iallgatherv: Open MPI 4.1's
    // non-blocking allgatherv (libnbc) sends to every peer at once, and on
    // 4 hosts at 200 Mbit/s it took 2.4x the ring's time for 4 MiB
    // (docs/benchmarks/collectives.md, "Allgather and broadcast on the MPI backend");
    // the ring is also what the performance model prices.
    Communicator::allgatherv(mine, all, counts);
  }

  bool has_native_allgatherv() const override { return true; }
  void native_allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                         std::span<const std::size_t> counts) override {
    const OpInfo op = check_allgatherv(mine, all, counts, "MPI_Iallgatherv");
    MPI_Request request = MPI_REQUEST_NULL;
    start(MPI_Iallgatherv(mine.data(), counts_[rank_], MPI_BYTE, all.data(), counts_.data(),
                          displs_.data(), MPI_BYTE, comm_, &request),
          op);
    complete(request, op);
  }

  // Checks an allgatherv's sizes on every rank, every block against MPI's
  // int counts included, before anything is sent (so a bad call fails
  // everywhere and leaves no message behind); fills counts_ and displs_.
  OpInfo check_allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                          std::span<const std::size_t> counts, const char* how) {
    if (counts.size() != static_cast<std::size_t>(size_)) {
      throw InvalidArgument(where() + fmt::format("allgatherv: {} counts for a world of {} ranks",
                                                  counts.size(), size_));
    }
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    if (mine.size() != counts[rank_] || all.size() != total) {
      throw InvalidArgument(
          where() +
          fmt::format("allgatherv: got {} bytes to send and {} to receive, counts say {} and {}",
                      mine.size(), all.size(), counts[rank_], total));
    }
    const OpInfo op{OpKind::kCollective, "allgatherv", how, -1, -1, mine.size()};
    to_counts_and_displacements(counts, counts_, displs_, op);
    return op;
  }

  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    const auto n = static_cast<std::size_t>(size_);
    if (send_counts.size() != n || recv_counts.size() != n) {
      throw InvalidArgument(
          where() +
          fmt::format("alltoallv: {} send counts and {} receive counts for a world of {} ranks",
                      send_counts.size(), recv_counts.size(), n));
    }
    const std::size_t send_total =
        std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
    const std::size_t recv_total =
        std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
    if (send.size() != send_total || recv.size() != recv_total) {
      throw InvalidArgument(
          where() + fmt::format("alltoallv: buffers of {} and {} bytes, counts add up to {} and {}",
                                send.size(), recv.size(), send_total, recv_total));
    }
    if (send_counts[rank_] != recv_counts[rank_]) {
      throw InvalidArgument(where() +
                            fmt::format("alltoallv: sends {} bytes to itself but expects {}",
                                        send_counts[rank_], recv_counts[rank_]));
    }
    const OpInfo op{OpKind::kCollective, "alltoallv", "MPI_Ialltoallv", -1, -1, send.size()};
    to_counts_and_displacements(send_counts, counts_, displs_, op);
    to_counts_and_displacements(recv_counts, recv_counts_, recv_displs_, op);
    MPI_Request request = MPI_REQUEST_NULL;
    start(MPI_Ialltoallv(send.data(), counts_.data(), displs_.data(), MPI_BYTE, recv.data(),
                         recv_counts_.data(), recv_displs_.data(), MPI_BYTE, comm_, &request),
          op);
    complete(request, op);
  }

  bool has_native_allreduce() const override { return true; }
  void native_allreduce(std::span<float> data) override { allreduce_sum(data, MPI_FLOAT); }
  void native_allreduce(std::span<std::int64_t> data) override {
    static_assert(sizeof(std::int64_t) == 8);
    allreduce_sum(data, MPI_INT64_T);
  }

 private:
  // Throws the CommError for an MPI call that failed to start `op`.
  void start(int rc, const OpInfo& op) const {
    if (rc != MPI_SUCCESS) {
      throw CommError(where() + fmt::format("{}: {} failed: {}", describe(op), op.mpi_call,
                                            mpi_error_text(rc)));
    }
  }

  // Checks the peer and tag (`api` names the call in the error), starts a
  // point-to-point `op` with `mpi_start(count, &request)` and returns its
  // pending request.
  template <class Start>
  Request point_to_point(std::string_view api, const OpInfo& op, Start mpi_start) {
    check_peer_and_tag(op.peer, op.tag, api);
    const int count = to_int(op.bytes, op);
    MPI_Request request = MPI_REQUEST_NULL;
    start(mpi_start(count, &request), op);
    return Request(std::make_unique<MpiRequest>(rank_, size_, request, op), timeout(),
                   {.peer = op.peer, .bytes = op.bytes, .send = op.kind == OpKind::kSend});
  }

  // Polls a collective's request against timeout().
  void complete(MPI_Request request, const OpInfo& op) {
    MpiRequest pending(rank_, size_, request, op);
    if (!pending.wait_until(Clock::now() + timeout())) pending.fail_timeout(timeout());
  }

  int to_int(std::size_t bytes, const OpInfo& op) const {
    if (bytes > kMaxMpiCount) {
      throw InvalidArgument(
          where() +
          fmt::format("{}: {} bytes is more than MPI's limit of {} bytes per message; split it",
                      describe(op), bytes, kMaxMpiCount));
    }
    return static_cast<int>(bytes);
  }

  // MPI takes int counts and int displacements (in bytes here).
  void to_counts_and_displacements(std::span<const std::size_t> counts,
                                   std::vector<int>& out_counts, std::vector<int>& out_displs,
                                   const OpInfo& op) const {
    out_counts.resize(counts.size());
    out_displs.resize(counts.size());
    std::size_t offset = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (counts[q] > kMaxMpiCount || offset > kMaxMpiCount) {
        throw InvalidArgument(where() + fmt::format("{}: {} bytes for rank {} at byte offset {}: "
                                                    "MPI counts and offsets must stay below "
                                                    "{}; split the exchange",
                                                    op.name, counts[q], q, offset, kMaxMpiCount));
      }
      out_counts[q] = static_cast<int>(counts[q]);
      out_displs[q] = static_cast<int>(offset);
      offset += counts[q];
    }
  }

  template <class T>
  void allreduce_sum(std::span<T> data, MPI_Datatype type) {
    const OpInfo op{OpKind::kCollective, "native_allreduce", "MPI_Iallreduce", -1, -1,
                    data.size_bytes()};
    const std::size_t chunk_elements = kChunkBytes / sizeof(T);
    std::size_t offset = 0;
    do {
      const std::size_t chunk = std::min(data.size() - offset, chunk_elements);
      MPI_Request request = MPI_REQUEST_NULL;
      start(MPI_Iallreduce(MPI_IN_PLACE, data.data() + offset, static_cast<int>(chunk), type,
                           MPI_SUM, comm_, &request),
            op);
      complete(request, op);
      offset += chunk;
    } while (offset < data.size());
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  // Scratch for the int counts and displacements of the v-collectives,
  // reused across calls.
  std::vector<int> counts_;
  std::vector<int> displs_;
  std::vector<int> recv_counts_;
  std::vector<int> recv_displs_;
};

}  // namespace

bool mpi_compiled_in() { return true; }

std::unique_ptr<Communicator> make_mpi_world_communicator(std::chrono::milliseconds timeout) {
  return std::make_unique<MpiCommunicator>(timeout);
}

void mpi_abort_job(const std::string& message, int exit_code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  if (mpi_initialized() && !mpi_finalized()) {
    note_mpi_abort();
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
  }
  std::exit(exit_code);
}

}  // namespace sparsecomm
