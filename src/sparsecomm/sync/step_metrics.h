#pragma once
// The per-step metrics record of docs/algorithms.md ("Metrics every sparse
// scheme reports each step"), as every synchronization strategy fills it.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace sparsecomm {

struct StepMetrics {
  std::int64_t step = 0;
  std::size_t numel = 0;       // d
  std::size_t target = 0;      // k
  std::size_t selected = 0;    // |I_r| on this rank
  std::size_t union_size = 0;  // K
  double density_ratio = 0.0;  // K / k (0 when k == 0)
  double imbalance = 0.0;      // n * max|I_r| / sum|I_r| - 1 (0 when nothing selected)
  double residual_norm = 0.0;  // ||e_r||_2
  double gradient_norm = 0.0;  // ||g_r||_2 before the memory (sparsified methods; 0 otherwise)
  double accumulate_s = 0.0;   // forming a = g + e (reported apart from selection)
  double selection_s = 0.0;    // the sparsifier's select(), less its own collectives
  double exchange_s = 0.0;     // the exchange, select()'s own collectives, the finite agreement
  // The non-finite agreement (in exchange_s): the step's first collective,
  // so it also holds the wait for the slowest rank to arrive.
  double agreement_s = 0.0;
  double selection_collective_s = 0.0;  // select()'s own collectives (in exchange_s)
  int selection_collectives = 0;        // how many it ran (the partition schemes' rounds)
  int candidate_passes = 0;             // its read passes (same-step threshold; 1 normally)
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  // Two levels (sync/two_level.h): the bytes inside the host (its
  // all-reduce and broadcast); bytes_sent/received are then between hosts.
  std::uint64_t host_bytes_sent = 0;
  std::uint64_t host_bytes_received = 0;
  std::uint64_t index_bytes_raw = 0;
  std::uint64_t index_bytes_encoded = 0;
  double value_bits = 32.0;       // bits per value on the wire (value_codec.h: wire_bits_per_value)
  std::size_t skip_subject = 0;   // Skip-Reduce: elements whose reduction may skip ranks
  std::size_t dense_numel = 0;    // of numel, averaged densely beside the method (--min-numel,
                                  // --exclude: sync/dense_layers.h); k counts only the rest
  double overlapped_s = 0.0;      // pipelined: selection + exchange done before backward ended
  bool gradient_clipped = false;  // the memory's spike clip scaled this step's gradient down
  bool skipped_nonfinite = false;  // the step was skipped: some rank had NaN/inf
};

// One step's metrics over the parts that synchronized it (buckets, or the
// DDP hook's groups): counts, bytes, times and overlapped_s summed; the norms
// combined as the root of the sum of squares; imbalance the largest; the
// flags true if any part's is; K/k of the totals (0 when k is 0); step of
// the first part, value_bits of the first part that selected for the
// method (k > 0), else of the first. Empty: a default record.
StepMetrics combined(std::span<const StepMetrics> parts);

// One JSON object (single line) with every field.
std::string to_json_line(const StepMetrics& metrics);

}  // namespace sparsecomm
