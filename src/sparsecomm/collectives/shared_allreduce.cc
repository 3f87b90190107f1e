// Shared-index all-reduce, the kSharedIndices pattern (see
// sparse_exchange.h for the contract): every rank selected the same
// indices, so U = own I_r (plus the known positions) with no index on the
// wire, and only the values are all-reduced (exchange_internal.cc). Debug
// builds check the precondition with one allgather of (count, hash).

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>

#include <fmt/format.h>

#include "sparsecomm/collectives/exchange_internal.h"

namespace sparsecomm::detail {
namespace {

class SharedIndexAllreduce final : public SparseExchange {
 public:
  explicit SharedIndexAllreduce(const ExchangeOptions& options)
      : SparseExchange(ExchangePattern::kSharedIndices, options) {}

 private:
  void run(Communicator& comm, const Input& input, std::span<float> accumulated,
           std::span<float> out, ExchangeResult& result) override {
    const int n = comm.size();
    const std::span<const Index> selected = input.selected;
#ifndef NDEBUG
    // Debug builds check the precondition: every rank selected the same list.
    gather_headers(comm, selected.size(), index_list_hash(selected), accumulated.size(), wire_,
                   result);
    const std::vector<std::size_t>& hashes = wire_.byte_counts;
    for (int q = 1; q < n; ++q) {
      if (result.counts[q] != result.counts[0] || hashes[q] != hashes[0]) {
        throw InvalidArgument(
            where(comm) +
            fmt::format(
                "pattern 'shared' needs identical selections on all ranks, but rank {} selected {} "
                "indices (hash {:x}) and rank 0 {} (hash {:x})",
                q, result.counts[q], hashes[q], result.counts[0], hashes[0]));
      }
    }
#endif
    result.counts.assign(static_cast<std::size_t>(n), selected.size());
    if (input.known.empty()) {
      union_.assign(selected.begin(), selected.end());
    } else {
      union_.resize(selected.size() + input.known_indices.size());
      std::merge(selected.begin(), selected.end(), input.known_indices.begin(),
                 input.known_indices.end(), union_.begin());
    }
    reduce_values_at(comm, union_, options(), accumulated, out, wire_, result);
  }

  WireBuffers wire_;
  UninitVector<Index> union_;  // U: own I_r merged with the known positions
};

}  // namespace

std::unique_ptr<SparseExchange> make_shared_allreduce(const ExchangeOptions& options) {
  return std::make_unique<SharedIndexAllreduce>(options);
}

}  // namespace sparsecomm::detail
