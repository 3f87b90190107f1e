// No allocation on the hot path: after warm-up, a step of SparsifyExchangeStep
// allocates nothing. Counts operator new on the calling thread while a step
// runs; a binary of its own because it replaces the global operator new.
//
// The world is one rank on a communicator whose collectives are plain
// copies, so the count covers the sync, the memory, the sparsifier and the
// exchange, and not a backend's own messaging.

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "sync/sync_checks.h"

// The replacements below pair malloc with free themselves; GCC 12 at -O1
// (the sanitizer builds) inlines the delete into gtest's `new TestClass` and
// then warns of a malloc/new mismatch that is not there.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
std::atomic<long> g_allocations{0};
thread_local bool t_counting = false;
}  // namespace

void* operator new(std::size_t size) {
  if (t_counting) g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace sparsecomm::testing {
namespace {

// A world of one rank whose collectives copy and allocate nothing.
class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "solo"; }
  Request isend(std::span<const std::byte>, int, int) override {
    throw NotSupported("[solo] no point-to-point in a world of one");
  }
  Request irecv(std::span<std::byte>, int, int) override {
    throw NotSupported("[solo] no point-to-point in a world of one");
  }
  void barrier() override {}
  void broadcast(std::span<std::byte>, int) override {}
  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) override {
    copy(mine, all);
  }
  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t>) override {
    copy(mine, all);
  }
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t>,
                 std::span<std::byte> recv, std::span<const std::size_t>) override {
    copy(send, recv);
  }

 private:
  static void copy(std::span<const std::byte> from, std::span<std::byte> to) {
    if (!from.empty()) std::memcpy(to.data(), from.data(), from.size());
  }
};

struct Counts {
  long select = 0;  // memory.accumulate + sparsifier.select + memory.after_exchange
  long step = 0;    // SparsifyExchangeStep::synchronize
};

// The first kWarmup steps may size buffers (growth is amortized: a buffer
// grows when a step needs more than any before); the rest are counted.
constexpr int kWarmup = 10;
constexpr int kSteps = 20;
// Fills `gradient` with rank 0's input of `step`; returns the step's context.
StepContext prepare_step(std::span<float> gradient, int step) {
  for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] = sync_input(0, step, i);
  StepContext ctx;
  ctx.step = step;
  return ctx;
}

Counts allocations_after_warmup(const SyncCase& c, std::size_t numel) {
  SoloCommunicator comm;
  Counts counts;
  std::vector<float> gradient(numel);
  // The memory and the sparsifier alone.
  {
    SchemeParts parts = make_scheme(c.scheme, case_options(c));
    SparseSelection selection;
    for (int step = 0; step < kSteps; ++step) {
      const StepContext ctx = prepare_step(gradient, step);
      const long before = g_allocations.load();
      t_counting = step >= kWarmup;
      parts.memory->accumulate(gradient);
      parts.sparsifier->select(parts.memory->accumulated(), ctx, comm, selection);
      parts.memory->after_exchange(selection.indices);
      t_counting = false;
      counts.select += g_allocations.load() - before;
    }
  }
  // The whole step.
  SparsifyExchangeStep sync(make_scheme(c.scheme, case_options(c)));
  for (int step = 0; step < kSteps; ++step) {
    const StepContext ctx = prepare_step(gradient, step);
    const long before = g_allocations.load();
    t_counting = step >= kWarmup;
    sync.synchronize(gradient, ctx, comm);
    t_counting = false;
    counts.step += g_allocations.load() - before;
  }
  return counts;
}

std::vector<SyncCase> cases() {
  return {SyncCase{"topk", "allgather", "fp32", {}},
          SyncCase{"threshold", "allgather", "fp32", {"lambda=0.8"}},
          SyncCase{"randomk", "shared", "fp32", {}},
          SyncCase{"dgc", "allgather", "fp32", {}},
          SyncCase{"dgc", "allgather", "fp32", {"warmup_epochs=3", "clip_norm=10"}},
          SyncCase{"gaussiank", "allgather", "fp32", {}},
          SyncCase{"cltk", "shared", "fp32", {}},
          SyncCase{"topk", "union", "fp16", {}},
          SyncCase{"topk", "sparse-allreduce", "fp32", {}},
          SyncCase{"randomk", "shared", "fp32", {"memory=none", "rescale=true"}}};
}

TEST(HotPath, MemoryAndSparsifierAllocateNothingAfterWarmup) {
  for (const SyncCase& c : cases()) {
    EXPECT_EQ(allocations_after_warmup(c, 200000).select, 0) << case_name(c);
  }
}

// The schemes that send exactly k every step: the exchange's buffers reach
// their final size in the first step. (With a count that varies from step to
// step, a scratch vector that is cleared and resized to a new record size
// still reallocates, to exactly that size: libstdc++ grows from size(), not
// capacity(). That happens less and less often, but not never.)
TEST(HotPath, AWholeStepAllocatesNothingAfterWarmup) {
  for (const SyncCase& c : cases()) {
    if (c.scheme != "topk" && c.scheme != "randomk" && c.scheme != "cltk") continue;
    EXPECT_EQ(allocations_after_warmup(c, 200000).step, 0) << case_name(c);
  }
}

}  // namespace
}  // namespace sparsecomm::testing
