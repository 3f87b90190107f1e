#pragma once
// The sparse all-reduce's class, shared by its two files:
// sparse_allreduce.cc (the contract, dispatch and recursive doubling) and
// sparse_allreduce_split.cc (the split algorithm). The algorithms are
// described at the top of sparse_allreduce.cc.

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "sparsecomm/collectives/exchange_internal.h"
#include "sparsecomm/collectives/sparse_exchange.h"

namespace sparsecomm::detail {

// Header flag of a range or partial sum sent dense (float32 values).
inline constexpr std::uint64_t kDenseFlag = 1;

// Appends indices (varints or raw uint32) to out; returns the bytes appended.
std::size_t append_indices(std::span<const Index> indices, bool encode,
                           UninitVector<std::byte>& out);

// A partial sum: a sorted (index, value) list or a dense vector with a
// bitmap of the positions some rank contributed to.
struct PartialSum {
  bool dense = false;
  ValueEncoding encoding = ValueEncoding::kFloat32;  // width on the wire
  UninitVector<Index> indices;                       // sparse only
  UninitVector<float> values;                        // sparse: one per index; dense: d
  UninitVector<std::uint8_t> present;                // dense only: ceil(d / 8) bytes
};

class SparseAllreduce final : public SparseExchange {
 public:
  explicit SparseAllreduce(const ExchangeOptions& options)
      : SparseExchange(ExchangePattern::kSparseAllreduce, options) {}

 private:
  void run(Communicator& comm, const Input& input, std::span<float> accumulated,
           std::span<float> out, ExchangeResult& result) override;
  void exchange_list(Communicator& comm, std::span<const Index> selected,
                     std::span<float> accumulated, std::span<float> out, ExchangeResult& result);
  void recursive_doubling(Communicator& comm, std::span<const Index> selected, std::span<float> out,
                          ExchangeResult& result);
  void split_allreduce(Communicator& comm, std::span<const Index> selected, std::span<float> out,
                       ExchangeResult& result);
  void split_send_to_owners(Communicator& comm, std::span<const Index> selected, std::size_t numel,
                            ExchangeResult& result);
  void split_reduce_range(Communicator& comm, std::size_t numel);
  void split_share_reduced(Communicator& comm, std::size_t numel, ExchangeResult& result);
  void split_unpack(Communicator& comm, std::span<float> out, ExchangeResult& result);
  void serialize_partial(PartialSum& partial, std::size_t numel, ExchangeResult& result);
  void deserialize_partial(Communicator& comm, int peer, std::size_t numel);
  void merge_partial(std::size_t numel);
  void densify_if_smaller(PartialSum& partial, std::size_t numel);

  WireBuffers wire_;
  UninitVector<Index> with_known_;   // own list merged with the known positions
  UninitVector<Index> transmitted_;  // what this rank sent (result.transmitted)
  // Recursive doubling: this rank's partial sum, the partner's, and a spare
  // one to merge or densify into (then swapped with current_). Split uses
  // them as its range sum, received block and reduced range.
  PartialSum current_;
  PartialSum incoming_;
  PartialSum spare_;
  std::array<std::uint64_t, 4> wire_header_out_{};
  std::array<std::uint64_t, 4> wire_header_in_{};
  // Split: per-owner block sizes and (count, index bytes) headers, and which
  // positions of this rank's range some rank sent.
  std::vector<std::size_t> send_counts_;
  std::vector<std::size_t> recv_counts_;
  std::vector<std::size_t> meta_counts_;
  std::vector<std::uint64_t> meta_out_;
  std::vector<std::uint64_t> meta_in_;
  UninitVector<std::uint8_t> range_hit_;
};

}  // namespace sparsecomm::detail
