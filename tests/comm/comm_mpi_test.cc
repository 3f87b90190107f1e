// The Communicator contract (comm_checks.h) on the MPI backend, run under
// `mpiexec -n 4` by ctest, plus what only MPI has: duplicated communicators,
// cancellation of a timed-out receive, MPI's int-sized counts.

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_checks.h"
#include "mpi/mpi_world.h"
#include "sparsecomm/comm/launcher.h"
#include "sparsecomm/comm/mpi/mpi_communicator.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

TEST(CommMpi, BackendAndSize) {
  run_on_mpi_world([](Communicator& comm) {
    EXPECT_TRUE(mpi_compiled_in());
    EXPECT_TRUE(launched_by_mpirun());
    EXPECT_EQ(launcher_rank(), comm.rank());
    EXPECT_EQ(comm.backend(), "mpi");
    EXPECT_GE(comm.size(), 2) << "run the MPI suites with at least 2 ranks";
    EXPECT_TRUE(comm.has_native_allreduce());
  });
}
TEST(CommMpi, RingExchange) { run_on_mpi_world(checks::check_ring_exchange); }
TEST(CommMpi, OrderingPerSourceAndTag) {
  run_on_mpi_world(checks::check_ordering_per_source_and_tag);
}
TEST(CommMpi, TagsOutOfOrder) { run_on_mpi_world(checks::check_tags_out_of_order); }
TEST(CommMpi, ZeroByteMessages) { run_on_mpi_world(checks::check_zero_byte_messages); }
TEST(CommMpi, SizeMismatchIsAnError) { run_on_mpi_world(checks::check_size_mismatch_is_an_error); }
TEST(CommMpi, Barrier) { run_on_mpi_world(checks::check_barrier); }
TEST(CommMpi, Broadcast) { run_on_mpi_world(checks::check_broadcast); }
TEST(CommMpi, NativeBroadcast) {
  run_on_mpi_world([](Communicator& comm) {
    ASSERT_TRUE(comm.has_native_broadcast());
    checks::check_native_broadcast(comm);
  });
}
TEST(CommMpi, Allgather) { run_on_mpi_world(checks::check_allgather); }
TEST(CommMpi, Allgatherv) { run_on_mpi_world(checks::check_allgatherv); }
TEST(CommMpi, NativeAllgatherv) {
  run_on_mpi_world([](Communicator& comm) {
    ASSERT_TRUE(comm.has_native_allgatherv());
    checks::check_native_allgatherv(comm);
  });
}
TEST(CommMpi, Alltoallv) { run_on_mpi_world(checks::check_alltoallv); }
TEST(CommMpi, InvalidArguments) { run_on_mpi_world(checks::check_invalid_arguments); }
TEST(CommMpi, NativeAllreduce) { run_on_mpi_world(checks::check_native_allreduce); }
TEST(CommMpi, TypedHelpers) { run_on_mpi_world(checks::check_typed_helpers); }

// Each communicator is its own MPI_Comm: the same tag on two of them never
// matches across.
TEST(CommMpi, DuplicatedCommunicatorsAreIsolated) {
  run_on_mpi_world([](Communicator& world) {
    const std::unique_ptr<Communicator> other = make_mpi_world_communicator(world.timeout());
    const int n = world.size();
    const int r = world.rank();
    const int next = (r + 1) % n;
    const int prev = (r - 1 + n) % n;
    const std::vector<std::byte> on_world = checks::pattern(r, 1, 64);
    const std::vector<std::byte> on_other = checks::pattern(r, 2, 64);
    Request a = world.isend(on_world, next, 5);
    Request b = other->isend(on_other, next, 5);
    std::vector<std::byte> got_other = checks::garbage(64);
    std::vector<std::byte> got_world = checks::garbage(64);
    other->recv(got_other, prev, 5);
    world.recv(got_world, prev, 5);
    a.wait();
    b.wait();
    EXPECT_TRUE(checks::same_bytes(got_world, checks::pattern(prev, 1, 64)));
    EXPECT_TRUE(checks::same_bytes(got_other, checks::pattern(prev, 2, 64)));
    other->barrier();
  });
}

// A receive that times out names the operation, the peer, the tag and the
// wait, and is withdrawn: the message sent later goes to the next receive.
TEST(CommMpi, TimedOutReceiveNamesThePeerAndIsWithdrawn) {
  run_on_mpi_world([](Communicator& world) {
    const std::unique_ptr<Communicator> comm =
        make_mpi_world_communicator(std::chrono::milliseconds(200));
    const int r = comm->rank();
    constexpr int kTag = 61;
    if (r == 0) {
      std::vector<std::byte> lost = checks::garbage(16);
      try {
        comm->recv(lost, 1, kTag);
        ADD_FAILURE() << "the receive completed, but rank 1 sends nothing yet";
      } catch (const TimeoutError& e) {
        const std::string message = e.what();
        EXPECT_EQ(message,
                  "[mpi] rank 0: recv from rank 1 (tag 61, 16 bytes) timed out after 200 ms: "
                  "rank 1 did not send");
      }
    }
    world.barrier();
    if (r == 1) comm->send(checks::pattern(1, 0, 16), 0, kTag);
    if (r == 0) {
      std::vector<std::byte> got = checks::garbage(16);
      comm->recv(got, 1, kTag);
      EXPECT_TRUE(checks::same_bytes(got, checks::pattern(1, 0, 16)));
    }
    world.barrier();
  });
}

// An anonymous mapping of `bytes` that is never touched: spans of more than
// INT_MAX bytes without using that much memory.
class Untouched {
 public:
  explicit Untouched(std::size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) data_ = static_cast<std::byte*>(p);
  }
  ~Untouched() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  Untouched(const Untouched&) = delete;
  Untouched& operator=(const Untouched&) = delete;
  std::span<std::byte> span() { return {data_, bytes_}; }
  bool ok() const { return data_ != nullptr; }

 private:
  std::size_t bytes_;
  std::byte* data_ = nullptr;
};

// MPI counts are int: larger messages and blocks are InvalidArgument on every
// rank before anything is sent.
TEST(CommMpi, CountsAboveIntMaxAreInvalidArguments) {
  run_on_mpi_world([](Communicator& comm) {
    const std::size_t big = static_cast<std::size_t>(std::numeric_limits<int>::max()) + 1;
    Untouched memory(big);
    ASSERT_TRUE(memory.ok()) << "mmap of " << big << " bytes failed";
    const int n = comm.size();
    const int r = comm.rank();
    checks::expect_invalid_argument([&] { comm.isend(memory.span(), (r + 1) % n, 1); }, "limit",
                                    "isend of INT_MAX + 1 bytes");
    checks::expect_invalid_argument([&] { comm.irecv(memory.span(), (r + 1) % n, 1); }, "limit",
                                    "irecv of INT_MAX + 1 bytes");
    std::vector<std::size_t> counts(static_cast<std::size_t>(n), 0);
    counts[0] = big;
    const std::span<std::byte> mine = r == 0 ? memory.span() : std::span<std::byte>();
    checks::expect_invalid_argument([&] { comm.allgatherv(mine, memory.span(), counts); },
                                    "allgatherv", "allgatherv with a block of INT_MAX + 1 bytes");
    comm.barrier();
  });
}

}  // namespace
}  // namespace sparsecomm
