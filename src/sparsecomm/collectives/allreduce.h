#pragma once
// All-reduce (sum) of a buffer across all ranks: our segmented ring, or the
// backend's native all-reduce (MPI) for comparison.
//
// Contract: every rank calls with the same number of elements and the same
// options, in the same order relative to other collectives. In place: on
// return `data` holds the element-wise sum over all ranks on every rank.
// Mismatched sizes across ranks are detected by the backends' size checks
// and reported as CommError.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/core/sparse.h"  // chunk_begin

namespace sparsecomm {

// kRing: the segmented ring (bandwidth-optimal; 2(n-1) latency-bound steps).
// kRecursiveDoubling: log2(n) exchanges of the whole buffer (plus one
// fold-in and one fold-out step when n is not a power of two): for small
// buffers, where latency dominates. kNative: the backend's (MPI).
enum class AllreduceAlgorithm { kRing, kRecursiveDoubling, kNative };

// "ring", "recursive-doubling" or "native"; anything else is an
// InvalidArgument listing them.
AllreduceAlgorithm parse_allreduce_algorithm(std::string_view name);
std::string_view allreduce_algorithm_name(AllreduceAlgorithm algorithm);

struct AllreduceOptions {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing;
  // Ring only: each chunk travels in segments of at most this many bytes,
  // with two segments in flight, so the reduction of one overlaps the
  // transfer of the next. Must be > 0.
  std::size_t segment_bytes = std::size_t{1} << 20;
  // Ring on floats only: the values on the wire, fp32, or fp16 / bf16 for
  // half the bytes (PyTorch's fp16 compression hook; Horovod's fp16): each
  // hop sends its partial sum rounded to 16 bits (round to nearest even;
  // fp16 saturates at 65504), the receiver adds it in float32, and the
  // owner rounds its chunk's sum once before the allgather, so every rank
  // ends with the same bits. The partial sums' roundings are in no rank's
  // residual. InvalidArgument for another encoding, another algorithm, or
  // integer data.
  ValueEncoding wire = ValueEncoding::kFloat32;
};

// What one all-reduce did on this rank. Times are wall seconds on this rank.
struct AllreduceReport {
  double reduce_scatter_s = 0.0;  // ring only
  double allgather_s = 0.0;       // ring only
  double total_s = 0.0;
  int reduce_scatter_steps = 0;
  int allgather_steps = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
};

void allreduce(Communicator& comm, std::span<float> data, const AllreduceOptions& options = {},
               AllreduceReport* report = nullptr);
void allreduce(Communicator& comm, std::span<std::int64_t> data,
               const AllreduceOptions& options = {}, AllreduceReport* report = nullptr);

}  // namespace sparsecomm
