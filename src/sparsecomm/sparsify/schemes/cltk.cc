// CLT-k (cyclic local top-k): the leader t mod n takes the exact top-k of
// its own a, broadcasts the k indices, and every rank selects those same
// indices with its own values. Exactly k coordinates, no build-up; the
// leader pays a full top-k. Default exchange: "shared" (an all-reduce of the
// k values; the union all-reduce would only add an index allgather).
// The broadcast is communication: its time (for a follower, including its
// wait for the leader's top-k, as any collective includes its wait for the
// slowest rank) goes to last_stats(), which counts it as exchange time.

#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/topk.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm::schemes {
namespace {

class CltK final : public DensitySparsifier {
 public:
  using DensitySparsifier::DensitySparsifier;

  std::string_view name() const override { return "cltk"; }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator& comm,
              SparseSelection& out) override {
    out.clear();
    stats_ = {};
    read_nothing();  // followers gather k scattered values
    const std::size_t k = target(accumulated.size(), ctx);
    if (k == 0) return;  // d == 0 on every rank: no broadcast anywhere
    const int leader = static_cast<int>(static_cast<std::uint64_t>(ctx.step) %
                                        static_cast<std::uint64_t>(comm.size()));
    if (comm.rank() == leader) {
      read_only({0, accumulated.size()});
      selector_.select(accumulated, k, 0, out);  // exactly k, since k <= d
    } else {
      out.indices.resize(k);
    }
    const Stopwatch broadcast;
    comm.broadcast(writable_bytes_of(std::span<Index>(out.indices.data(), out.indices.size())),
                   leader);
    stats_.collective_s = broadcast.seconds();
    stats_.collective_rounds = 1;
    if (comm.rank() != leader) {
      out.values.resize(k);
      for (std::size_t j = 0; j < k; ++j) out.values[j] = accumulated[out.indices[j]];
    }
  }

 private:
  TopKSelector selector_;
};

}  // namespace

SchemeDefinition cltk_definition() {
  return {.name = "cltk",
          .summary = "cyclic local top-k: leader t mod n picks k indices for every rank",
          .traits = {.selection = SchemeTraits::Selection::kLeader},
          .build = build_with_density<CltK>};
}

}  // namespace sparsecomm::schemes
