#include "sparsecomm/sparsify/partition.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <tuple>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

int owned_partition(std::int64_t step, int rank, int parts) {
  return static_cast<int>((step + rank) % parts);
}

std::vector<Range> equal_partitions(std::size_t numel, int parts) {
  if (parts < 1)
    throw InvalidArgument(fmt::format("[partition] need >= 1 partition, got {}", parts));
  std::vector<Range> ranges(static_cast<std::size_t>(parts));
  for (int i = 0; i < parts; ++i) {
    ranges[static_cast<std::size_t>(i)] = {chunk_begin(numel, parts, i),
                                           chunk_begin(numel, parts, i + 1)};
  }
  return ranges;
}

Range BlockGrid::block(int b) const {
  const auto start = [this](int i) {
    return static_cast<std::size_t>(i) * block_size +
           static_cast<std::size_t>(std::min(i, wide_blocks)) * alignment;
  };
  const std::size_t begin = start(b);
  const std::size_t end = b + 1 == blocks ? numel : start(b + 1);
  return {std::min(begin, numel), end};
}

int BlockGrid::block_of(std::size_t i) const {
  const std::size_t wide = block_size + alignment;
  const std::size_t wide_end = static_cast<std::size_t>(wide_blocks) * wide;
  std::size_t b = 0;
  if (i < wide_end) {
    b = i / wide;
  } else if (block_size > 0) {
    b = static_cast<std::size_t>(wide_blocks) + (i - wide_end) / block_size;
  }
  return static_cast<int>(std::min<std::size_t>(b, static_cast<std::size_t>(blocks - 1)));
}

BlockGrid make_block_grid(std::size_t numel, int requested_blocks, std::size_t alignment,
                          bool spread_remainder) {
  if (requested_blocks < 1 || alignment < 1) {
    throw InvalidArgument(fmt::format("[exdyna] blocks ({}) and alignment ({}) must be >= 1",
                                      requested_blocks, alignment));
  }
  BlockGrid grid;
  grid.numel = numel;
  grid.alignment = alignment;
  const auto requested = static_cast<std::size_t>(requested_blocks);
  if (numel >= alignment * requested) {
    grid.blocks = requested_blocks;
    grid.block_size = (numel / requested) / alignment * alignment;
    if (spread_remainder) {
      const std::size_t remainder = numel - grid.block_size * requested;
      grid.wide_blocks =
          static_cast<int>(std::min<std::size_t>(remainder / alignment, requested - 1));
    }
  } else {
    grid.blocks = static_cast<int>(std::max<std::size_t>(1, numel / alignment));
    grid.block_size = numel < alignment ? numel : alignment;
  }
  return grid;
}

Range BlockLayout::range(const BlockGrid& grid, int p) const {
  if (blocks_in(p) == 0) {
    const std::size_t at = first[p] < grid.blocks ? grid.block(first[p]).begin : grid.numel;
    return {at, at};
  }
  return {grid.block(first[p]).begin, grid.block(first[p + 1] - 1).end};
}

BlockLayout initial_layout(int blocks, int parts) {
  BlockLayout layout;
  layout.first.resize(static_cast<std::size_t>(parts) + 1, 0);
  for (int i = 0; i < parts; ++i) {
    layout.first[i + 1] = layout.first[i] + blocks / parts + (i < blocks % parts ? 1 : 0);
  }
  return layout;
}

void faithful_sweep(BlockLayout& layout, std::span<const std::int64_t> partition_loads,
                    std::int64_t previous_total, const BlockGrid& grid,
                    const SweepOptions& options) {
  const int n = layout.parts();
  if (n < 2 || previous_total <= 0 || grid.numel == 0) return;  // kavg == 0: nothing to balance
  const int min_blocks =
      options.min_blocks > 0 ? options.min_blocks : std::max(1, grid.blocks / (4 * n));
  std::vector<double> load(partition_loads.begin(), partition_loads.end());
  const double kavg = static_cast<double>(previous_total) / n;
  const double shift = static_cast<double>(grid.block_size) * static_cast<double>(previous_total) /
                       static_cast<double>(grid.numel);
  for (int i = 0; i + 1 < n; ++i) {
    if (load[i] > options.band * kavg && load[i + 1] < kavg / options.band &&
        layout.blocks_in(i) > min_blocks) {
      --layout.first[i + 1];  // one block from i to i+1
      load[i] -= shift;
      load[i + 1] += shift;
    } else if (load[i + 1] > options.band * kavg && load[i] < kavg / options.band &&
               layout.blocks_in(i + 1) > min_blocks) {
      ++layout.first[i + 1];  // one block from i+1 to i
      load[i + 1] -= shift;
      load[i] += shift;
    }
  }
}

void balance_from_block_counts(BlockLayout& layout, std::span<const double> block_counts,
                               const BalanceOptions& options) {
  const int n = layout.parts();
  const int blocks = static_cast<int>(block_counts.size());
  if (n < 2 || blocks != layout.first[n]) return;
  double total = 0;
  for (double c : block_counts) total += c;
  if (!(total > 0)) return;
  const int min_blocks = std::max(0, std::min(options.min_blocks, blocks / n));
  // One pass over the blocks, boundaries rewritten in place (no allocation
  // per step): `at` is the first block boundary whose prefix sum (the
  // selected count in blocks [0, at)) reaches the goal; `prefix` is that sum
  // and `before` the prefix one boundary earlier, summed in block order.
  int at = 0;
  double prefix = 0.0;
  double before = 0.0;
  for (int i = 1; i < n; ++i) {
    // The block boundary whose prefix is closest to i * total / n.
    const double goal = total * i / n;
    while (at < blocks && prefix < goal) {
      before = prefix;
      prefix += block_counts[at];
      ++at;
    }
    int cut = at;
    if (prefix < goal) {
      cut = blocks;  // rounding left the goal past the total: the last boundary
    } else if (cut > 0 && std::fabs(before - goal) <= std::fabs(prefix - goal)) {
      --cut;
    }
    if (options.max_move > 0) {
      // layout.first[i] is still the old boundary here.
      cut = std::clamp(cut, layout.first[i] - options.max_move, layout.first[i] + options.max_move);
    }
    // Keep min_blocks for every partition on both sides (first[i - 1] is
    // already the new boundary).
    cut = std::clamp(cut, layout.first[i - 1] + min_blocks, blocks - (n - i) * min_blocks);
    layout.first[i] = cut;
  }
}

void BlockAssignment::ranges(const BlockGrid& grid, int p, std::vector<Range>& out) const {
  out.clear();
  for (const int b : blocks[static_cast<std::size_t>(p)]) {
    const Range r = grid.block(b);
    if (r.empty()) continue;
    if (!out.empty() && out.back().end == r.begin) {
      out.back().end = r.end;
    } else {
      out.push_back(r);
    }
  }
}

BlockAssignment cyclic_assignment(int blocks, int parts) {
  if (parts < 1 || blocks < 0) {
    throw InvalidArgument(fmt::format(
        "[partition] need >= 1 partition and >= 0 blocks, got {} and {}", parts, blocks));
  }
  BlockAssignment out;
  out.part_of.resize(static_cast<std::size_t>(blocks));
  out.blocks.assign(static_cast<std::size_t>(parts), {});
  for (int b = 0; b < blocks; ++b) {
    out.part_of[static_cast<std::size_t>(b)] = b % parts;
    out.blocks[static_cast<std::size_t>(b % parts)].push_back(b);
  }
  return out;
}

void assign_blocks_greedy(std::span<const double> predicted, int parts, BlockAssignment& out) {
  if (parts < 1)
    throw InvalidArgument(fmt::format("[partition] need >= 1 partition, got {}", parts));
  const int blocks = static_cast<int>(predicted.size());
  std::vector<int> order(static_cast<std::size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const double la = predicted[static_cast<std::size_t>(a)];
    const double lb = predicted[static_cast<std::size_t>(b)];
    return la != lb ? la > lb : a < b;
  });
  const int capacity = (blocks + parts - 1) / parts;
  out.part_of.resize(static_cast<std::size_t>(blocks));
  out.blocks.resize(static_cast<std::size_t>(parts));
  for (auto& list : out.blocks) list.clear();
  // (load, blocks held, partition): the least loaded on top; a partition
  // that is full leaves the queue.
  using Slot = std::tuple<double, int, int>;
  std::priority_queue<Slot, std::vector<Slot>, std::greater<>> open;
  for (int p = 0; p < parts; ++p) open.emplace(0.0, 0, p);
  for (const int b : order) {
    auto [load, held, p] = open.top();
    open.pop();
    out.part_of[static_cast<std::size_t>(b)] = p;
    out.blocks[static_cast<std::size_t>(p)].push_back(b);
    if (held + 1 < capacity)
      open.emplace(load + predicted[static_cast<std::size_t>(b)], held + 1, p);
  }
  for (auto& list : out.blocks) std::sort(list.begin(), list.end());
}

}  // namespace sparsecomm
