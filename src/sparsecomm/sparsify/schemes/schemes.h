#pragma once
// Internal to the sparsify layer: what each scheme file gives the registry
// (registry.cc), and the small base class the schemes share. Tests may look
// in here (the threshold-search statistics, the inverse normal CDF); the
// CLI and the trainer go through registry.h only.
//
// Adding a scheme: write schemes/<name>.cc with a `<name>_definition()`,
// declare it below and add one line to the list in registry.cc.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sparsify/sparsifier.h"

namespace sparsecomm::schemes {

// The options every scheme accepts, parsed and validated by the registry
// before the scheme's own build function runs.
struct CommonOptions {
  std::string scheme;  // the scheme's name, for messages
  double density = 0.01;
  std::uint64_t seed = 0;
  std::string memory;  // "ef", "none" or "momentum"
};

// Builds the scheme into `parts`. On entry parts.exchange and
// parts.exchange_options are set from the common options, and parts.memory
// is built from the common memory options. It may replace the memory.
using SchemeBuild = void (*)(const SchemeOptions& options, const CommonOptions& common,
                             SchemeParts& parts);

// The build of a scheme whose sparsifier needs the density alone: S(density).
template <class S>
void build_with_density(const SchemeOptions&, const CommonOptions& common, SchemeParts& parts) {
  parts.sparsifier = std::make_unique<S>(common.density);
}

// One scheme's entry in the registry, written as a designated initializer
// in its file (fields in this order).
struct SchemeDefinition {
  std::string name = {};
  std::string summary = {};
  SchemeTraits traits = {};
  // allowed; the first is the default
  std::vector<std::string> memories = {"ef", "none", "momentum", "ef21"};
  std::vector<OptionSpec> options = {};  // the scheme's own options
  SchemeBuild build = nullptr;
};

SchemeDefinition topk_definition();
SchemeDefinition threshold_definition();
SchemeDefinition randomk_definition();
SchemeDefinition dgc_definition();
SchemeDefinition gaussiank_definition();
SchemeDefinition cltk_definition();
SchemeDefinition micro_definition();            // partitioned.cc
SchemeDefinition exdyna_definition();           // partitioned.cc
SchemeDefinition exdyna_faithful_definition();  // partitioned.cc
SchemeDefinition deft_definition();             // deft.cc
SchemeDefinition qsgd_definition();             // quantizers.cc
SchemeDefinition terngrad_definition();         // quantizers.cc
SchemeDefinition signsgd_definition();          // quantizers.cc
SchemeDefinition natural_definition();          // quantizers.cc

// What the last select() of a threshold-searching scheme (DGC, Gaussian-k)
// did: the passes over the vector, the final threshold, and how many
// elements that threshold selected (before any trimming to k).
struct ThresholdSearch {
  int rounds = 0;
  float threshold = 0.0f;
  std::size_t found = 0;
};

// Base of the schemes in this directory: k = target_count(density, d)
// (DGC overrides it for its warm-up), a stateless save/load that only
// checks the section tag, and the threshold-search statistics.
class DensitySparsifier : public Sparsifier {
 public:
  explicit DensitySparsifier(double density) : density_(density) {}

  std::size_t target(std::size_t numel, const StepContext&) const override {
    return target_count(density_, numel);
  }
  void save(StateWriter& writer) const override { writer.tag(name()); }
  void load(StateReader& reader) override { reader.expect_tag(name()); }

  double density() const { return density_; }
  // Rounds == 0 for the schemes that do not search a threshold.
  const ThresholdSearch& last_search() const { return last_search_; }

 protected:
  // The start of a select() that reads the whole vector: clears `out` and
  // the last threshold search, records the read, returns this step's k.
  std::size_t start_full_read(std::span<const float> accumulated, const StepContext& ctx,
                              SparseSelection& out) {
    out.clear();
    read_only({0, accumulated.size()});
    last_search_ = {};
    return target(accumulated.size(), ctx);
  }

  // A threshold search: selects every |v| >= threshold into `out` (cleared
  // each round), then asks `next(found, threshold)` for the next round's
  // threshold (nullopt: keep this selection), at most `max_rounds` rounds.
  // Records the search in last_search_ and returns it.
  template <class Next>
  const ThresholdSearch& search_threshold(std::span<const float> accumulated, float threshold,
                                          int max_rounds, SparseSelection& out, Next next) {
    ThresholdSearch& search = last_search_;
    search = {0, threshold, 0};
    while (true) {
      out.clear();
      search.found = threshold_select(accumulated, search.threshold, 0, out);
      ++search.rounds;
      if (search.rounds == max_rounds) break;
      const std::optional<float> next_threshold = next(search.found, search.threshold);
      if (!next_threshold) break;
      search.threshold = *next_threshold;
    }
    return search;
  }

  double density_;
  ThresholdSearch last_search_;
};

// No memory with Random-k's unbiased rescaling: a = (d/k) * g, with
// k = target_count(density, d); whatever is not sent is dropped.
std::unique_ptr<GradientMemory> make_rescaled_no_memory(double density);

// Counter streams of Philox draws (the second counter word's upper half),
// so schemes sharing a seed never draw the same numbers.
inline constexpr std::uint64_t kRandomKStream = 1;
inline constexpr std::uint64_t kDgcStartStream = 2;

// Inverse of the standard normal CDF, Phi^-1(p) for p in (0, 1): Acklam's
// rational approximation refined by one Halley step (relative error about
// 1e-15). Returns -inf / +inf at p = 0 / 1, NaN outside [0, 1].
double inverse_normal_cdf(double p);

}  // namespace sparsecomm::schemes
