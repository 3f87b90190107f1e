#pragma once
// DEFT: layer-wise selection with norm-based budget allocation
// (docs/algorithms.md "DEFT"). Tensors larger than d/n are split into n
// pieces; each step the leader (t mod n) allocates the budget k over pieces
// by the norms of its own accumulated gradient, bin-packs the pieces into n
// bins by selection cost, and broadcasts the assignment with the per-piece
// budgets; rank r runs an exact top-k per piece of bin (leader + r) mod n.
// Selections are disjoint. Pieces with k_l == size_l ("whole") go into every
// rank's SparseSelection::known: they join the union without any index
// exchange.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/partition.h"
#include "sparsecomm/sparsify/sparsifier.h"

namespace sparsecomm {

struct DeftOptions {
  double density = 0.01;
  bool force_one = true;  // k_l >= 1 while budget remains (reference behaviour)
};

// The leader's plan for one step; identical on all ranks after the broadcast.
struct DeftPlan {
  std::vector<Range> pieces;         // fixed after the first step
  std::vector<std::int64_t> budget;  // k_l per piece (sum <= k)
  std::vector<std::int32_t> bin;     // bin per piece; -1: no selection (k_l == 0); -2: whole piece
};

// The pure parts, exposed for tests.
std::vector<Range> deft_pieces(std::span<const LayerSpan> layers, std::size_t numel, int world);
std::vector<std::int64_t> deft_allocate(std::span<const double> norms,
                                        std::span<const Range> pieces, std::size_t k,
                                        bool force_one);
std::vector<std::int32_t> deft_pack(std::span<const Range> pieces,
                                    std::span<const std::int64_t> budget, int bins);

std::unique_ptr<Sparsifier> make_deft_sparsifier(const DeftOptions& options);
std::vector<OptionSpec> deft_option_specs();
DeftOptions deft_options_from(const SchemeOptions& options);

}  // namespace sparsecomm
