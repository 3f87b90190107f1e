// Sparse allgather, the kSparseAllgather pattern (see sparse_exchange.h for
// the contract): allgather (count, payload bytes, d) -> allgatherv every
// rank's [indices][values][values at the known positions] block -> every
// rank adds all blocks in rank order.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>

#include "sparsecomm/collectives/exchange_internal.h"

namespace sparsecomm::detail {
namespace {

class SparseAllgather final : public SparseExchange {
 public:
  explicit SparseAllgather(const ExchangeOptions& options)
      : SparseExchange(ExchangePattern::kSparseAllgather, options) {}

 private:
  void run(Communicator& comm, const Input& input, std::span<float> accumulated,
           std::span<float> out, ExchangeResult& result) override {
    const ExchangeOptions& opts = options();
    const std::span<const Index> selected = input.selected;
    const std::span<const Index> known = input.known_indices;
    const int n = comm.size();
    const std::size_t numel = accumulated.size();
    const std::size_t count = selected.size();
    const std::size_t extra = known.size();  // values at the known positions
    // Block: [indices][count values][extra values at the known positions].
    UninitVector<std::byte>& send = wire_.send;
    UninitVector<float>& values = wire_.values;
    send.clear();
    if (opts.encode_indices) {
      encode_indices(selected, send);
    } else {
      send.resize(selected.size_bytes());
      if (count > 0) std::memcpy(send.data(), selected.data(), selected.size_bytes());
    }
    result.index_bytes_raw = sizeof(Index) * count;
    result.index_bytes_encoded = send.size();
    const std::size_t index_part = send.size();
    send.resize(index_part + encoded_value_bytes(opts.values, count + extra));
    values.resize(count + extra);
    for (std::size_t j = 0; j < count; ++j) values[j] = accumulated[selected[j]];
    for (std::size_t j = 0; j < extra; ++j) values[count + j] = accumulated[known[j]];
    encode_values(values, opts.values, std::span<std::byte>(send).subspan(index_part),
                  rounding_nonce(comm, opts.values, values));
    for (std::size_t j = 0; j < count; ++j) accumulated[selected[j]] -= values[j];
    for (std::size_t j = 0; j < extra; ++j) accumulated[known[j]] -= values[count + j];

    gather_headers(comm, count, send.size(), numel, wire_, result);
    const std::vector<std::size_t>& byte_counts = wire_.byte_counts;
    wire_.recv.resize(std::accumulate(byte_counts.begin(), byte_counts.end(), std::size_t{0}));
    comm.allgatherv(std::span<const std::byte>(send), wire_.recv, byte_counts);
    count_allgatherv(comm, byte_counts, result);
    runs_.decode_blocks(comm, wire_.recv, byte_counts, result.counts,
                        BlockFormat{opts.values, opts.encode_indices, 0, numel}, 1, extra);

    std::fill(out.begin(), out.end(), 0.0f);
    std::size_t most = 0;
    for (const std::size_t c : result.counts) most = std::max(most, c + extra);
    wire_.other_values.resize(most);
    std::size_t offset = 0;
    for (std::size_t q = 0; q < static_cast<std::size_t>(n); ++q) {
      const std::size_t q_count = result.counts[q];
      const std::size_t value_part = encoded_value_bytes(opts.values, q_count + extra);
      const std::span<float> q_values(wire_.other_values.data(), q_count + extra);
      offset += byte_counts[q];
      decode_values(std::span<const std::byte>(wire_.recv.data() + offset - value_part, value_part),
                    opts.values, q_values);
      const Index* q_indices = runs_.run(q).data();
      for (std::size_t j = 0; j < q_count; ++j) out[q_indices[j]] += q_values[j];
      for (std::size_t j = 0; j < extra; ++j) out[known[j]] += q_values[q_count + j];
    }
    const auto r = static_cast<std::size_t>(comm.rank());
    if (!input.known.empty()) {
      // What this rank transmitted: its list merged with the known positions.
      with_known_.resize(count + extra);
      std::merge(selected.begin(), selected.end(), known.begin(), known.end(), with_known_.begin());
      runs_.append(known);
    }
    runs_.build_union();
    const auto divisor = static_cast<float>(n);
    for (const Index i : runs_.union_indices()) out[i] /= divisor;
    result.union_size = runs_.union_indices().size();
    result.transmitted = input.known.empty() ? runs_.run(r) : std::span<const Index>(with_known_);
  }

  WireBuffers wire_;
  IndexRuns runs_;                  // every rank's list (+ the known positions) and U
  UninitVector<Index> with_known_;  // own list merged with the known positions
};

}  // namespace

std::unique_ptr<SparseExchange> make_sparse_allgather(const ExchangeOptions& options) {
  return std::make_unique<SparseAllgather>(options);
}

}  // namespace sparsecomm::detail
