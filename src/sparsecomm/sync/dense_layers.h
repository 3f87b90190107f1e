#pragma once
// Tensors left out of sparsification: a GradientSync decorator that averages
// some of the model's tensors with the dense ring all-reduce and hands the
// others to the method being run (docs/algorithms.md, "Small tensors sent
// densely").
//
// Which tensors: those with fewer than `min_numel` elements (biases, small
// first layers: DGC sends such layers densely, PyTorch's PowerSGD hook
// leaves 1-D tensors uncompressed), and those whose name matches one of the
// shell patterns (`fc2.*`). The method then sees only the other tensors,
// packed in their order: its density, k = c * d', counts only those d'
// elements, and its residuals, thresholds and partitions span only them.

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/sync/gradient_sync.h"

namespace sparsecomm {

struct DenseLayerRule {
  std::size_t min_numel = 0;          // tensors with fewer elements go dense
  std::vector<std::string> patterns;  // fnmatch patterns on tensor names

  bool empty() const { return min_numel == 0 && patterns.empty(); }
  bool matches(const LayerSpan& layer) const;
};

// How the messages below name the settings behind a rule: the CLI's flags
// by default; the Python hook passes its keywords.
struct DenseRuleWords {
  std::string_view min_numel = "--min-numel";
  std::string_view exclude = "--exclude";
  std::string_view all_dense = "or run -m dense";  // the way out when nothing is left
};

// The elements of `layers` that `rule` sends densely (0 for an empty
// rule). InvalidArgument when a pattern matches none of the tensors (the
// message lists them) or when the rule leaves no tensor to sparsify;
// `model` names the model in the messages.
std::size_t dense_numel(const DenseLayerRule& rule, std::span<const LayerSpan> layers,
                        std::string_view model, const DenseRuleWords& words = {});

// Wraps `inner` when the rule selects anything; returns `inner` unchanged
// for an empty rule and for the method "dense" (which already averages
// every tensor). InvalidArgument for a malformed pattern and for methods
// that apply momentum themselves (DGC's momentum correction: the dense
// tensors would then get no momentum at all).
std::unique_ptr<GradientSync> with_dense_layers(std::unique_ptr<GradientSync> inner,
                                                const DenseLayerRule& rule,
                                                NonFinitePolicy nonfinite);

}  // namespace sparsecomm
