// Union all-reduce, the kUnionAllreduce pattern (see sparse_exchange.h for
// the contract, sparse_exchange.cc for the overview): allgather (count,
// index bytes, d) -> allgatherv the index lists -> every rank merges them
// into the same sorted union U -> all-reduce a_r[U] (exchange_internal.cc).

#include <cstddef>
#include <memory>
#include <numeric>
#include <span>

#include "sparsecomm/collectives/exchange_internal.h"

namespace sparsecomm::detail {
namespace {

class UnionAllreduce final : public SparseExchange {
 public:
  explicit UnionAllreduce(const ExchangeOptions& options)
      : SparseExchange(ExchangePattern::kUnionAllreduce, options) {}

 private:
  void run(Communicator& comm, const Input& input, std::span<float> accumulated,
           std::span<float> out, ExchangeResult& result) override {
    const ExchangeOptions& opts = options();
    const std::span<const Index> selected = input.selected;
    const std::size_t numel = accumulated.size();
    std::span<const std::byte> mine = std::as_bytes(selected);
    if (opts.encode_indices) {
      wire_.send.clear();
      encode_indices(selected, wire_.send);
      mine = wire_.send;
    }
    result.index_bytes_raw = sizeof(Index) * selected.size();
    result.index_bytes_encoded = mine.size();
    gather_headers(comm, selected.size(), mine.size(), numel, wire_, result);
    wire_.recv.resize(
        std::accumulate(wire_.byte_counts.begin(), wire_.byte_counts.end(), std::size_t{0}));
    comm.allgatherv(mine, wire_.recv, wire_.byte_counts);
    count_allgatherv(comm, wire_.byte_counts, result);
    runs_.decode_blocks(comm, wire_.recv, wire_.byte_counts, result.counts,
                        BlockFormat{opts.values, opts.encode_indices, 0, numel}, 0);
    // The known ranges: one more run, which no rank sent.
    if (!input.known.empty()) runs_.append(input.known_indices);
    runs_.build_union();
    reduce_values_at(comm, runs_.union_indices(), opts, accumulated, out, wire_, result);
  }

  WireBuffers wire_;
  IndexRuns runs_;  // every rank's list (+ the known positions) and U
};

}  // namespace

std::unique_ptr<SparseExchange> make_union_allreduce(const ExchangeOptions& options) {
  return std::make_unique<UnionAllreduce>(options);
}

}  // namespace sparsecomm::detail
