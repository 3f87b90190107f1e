#pragma once
// Exclusive partitions of the flat vector for MiCRO and ExDyna, and ExDyna's
// dynamic partition allocation. Pure functions of shared integers: every rank
// computes the same layout without a message.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

// Partition p (of `parts`) owned by `rank` at step t: (t + rank) mod parts.
int owned_partition(std::int64_t step, int rank, int parts);

// MiCRO: n equal contiguous partitions, size_i = floor(d/n) + (i < d mod n).
std::vector<Range> equal_partitions(std::size_t numel, int parts);

// ExDyna's block grid: `blocks` blocks of `block_size` elements (a multiple
// of `alignment`), the last block also taking the remainder. Small vectors
// (numel < alignment * requested) get max(1, numel / alignment) blocks of
// `alignment` (the last takes the rest); numel == 0 gives one empty block.
//
// spread_remainder: the reference gives the whole remainder (up to
// (alignment - 1) * blocks elements, e.g. 6.7% of a 421,642-element model
// with B = 1024) to the last block, which no balancer can then split; with
// spreading, the first `wide_blocks` blocks take `alignment` elements more
// each and the last block keeps only what is left (< alignment).
struct BlockGrid {
  std::size_t numel = 0;
  std::size_t block_size = 0;
  std::size_t alignment = 1;
  int blocks = 1;
  int wide_blocks = 0;  // blocks [0, wide_blocks) have block_size + alignment elements
  Range block(int b) const;
  // The block holding element i (i < numel).
  int block_of(std::size_t i) const;
};
BlockGrid make_block_grid(std::size_t numel, int requested_blocks, std::size_t alignment,
                          bool spread_remainder = false);

// A layout: partition i is blocks [first[i], first[i+1]); first has n+1
// entries, first[0] = 0, first[n] = blocks. Partitions may be empty.
struct BlockLayout {
  std::vector<int> first;
  int parts() const { return static_cast<int>(first.size()) - 1; }
  int blocks_in(int p) const { return first[p + 1] - first[p]; }
  Range range(const BlockGrid& grid, int p) const;
};
// floor(B/n) + (i < B mod n) blocks per partition.
BlockLayout initial_layout(int blocks, int parts);

// The reference's one-block-per-boundary sweep (faithful mode), from the
// previous step's loads per partition (load[i] = selected count of partition
// i), the previous global count K_prev and numel d. Moves at most one block
// per boundary, only when both neighbours are outside the band.
struct SweepOptions {
  double band = 1.05;  // balance band factor
  int min_blocks = 0;  // 0: max(1, B / (4n))
};
void faithful_sweep(BlockLayout& layout, std::span<const std::int64_t> partition_loads,
                    std::int64_t previous_total, const BlockGrid& grid,
                    const SweepOptions& options);

// The default balancer: boundaries recomputed from the prefix sums of the
// per-block selected counts (or their running average) so each partition
// carries about total / n, each partition keeping at least min_blocks
// blocks, each boundary moving at most max_move blocks per step
// (0 = unlimited).
struct BalanceOptions {
  int min_blocks = 1;
  int max_move = 0;
};
void balance_from_block_counts(BlockLayout& layout, std::span<const double> block_counts,
                               const BalanceOptions& options);

// The default ExDyna layout: scattered blocks. Each partition is a set of
// blocks anywhere in the vector (not a contiguous run), every partition
// holds floor(B/n) or ceil(B/n) blocks, so every rank reads about d/n
// elements, and a hot region wider than a few blocks is shared by all
// partitions instead of landing in one.
struct BlockAssignment {
  std::vector<int> part_of;              // block -> partition
  std::vector<std::vector<int>> blocks;  // partition -> its blocks, ascending
  int parts() const { return static_cast<int>(blocks.size()); }
  // Partition p's elements: its blocks in ascending order, adjacent blocks
  // merged into one range. `out` is cleared first.
  void ranges(const BlockGrid& grid, int p, std::vector<Range>& out) const;
};
// Block-cyclic: block b belongs to partition b mod n (the layout before any
// count is known).
BlockAssignment cyclic_assignment(int blocks, int parts);
// Greedy packing of the blocks by their predicted load (`predicted[b]`,
// e.g. a running average of each block's selected share): blocks in
// descending order of load (ties: lower block first) each go to the
// partition with the least load so far (ties: fewer blocks, then lower
// partition) among those still below ceil(B/n) blocks. A function of
// `predicted` only: identical on every rank that has the same numbers.
// Reuses `out`'s storage.
void assign_blocks_greedy(std::span<const double> predicted, int parts, BlockAssignment& out);

}  // namespace sparsecomm
