#pragma once
// What `sparsecomm bench sparsifiers` measures (bench_sparsifiers.cc has the
// method): one scheme's run on n simulated ranks, its selection timed per
// rank through probes around the scheme's sparsifier and memory, everything
// verified; and the reference points it is compared with.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bench_sparsifiers_options.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sync/step_metrics.h"
#include "sparsecomm/traces/gradient_stream.h"

namespace sparsecomm::cli {

// Everything one scheme's run records, indexed [step * workers + rank].
// Timing fields are NaN on the steps (and, for the floor, the ranks) that
// have none.
struct SchemeRun {
  std::string scheme;
  std::string exchange;
  int workers = 0;
  int steps = 0;
  std::vector<double> select_ms;
  std::vector<double> floor_ms;       // read pass over the elements this rank's select() read
  std::vector<std::size_t> elements;  // ... and how many those were (0: no floor)
  std::vector<StepMetrics> metrics;
  std::size_t numel = 0;
  // Set when the scheme's selections are too large for this
  // machine's memory to exchange: the run stops and the row says why.
  std::string skipped;
};

// Runs scheme `name` for options.steps steps of `stream` on options.workers
// thread ranks, each through its own SparsifyExchangeStep, timing every
// rank's selection alone on the timed steps; `evict` is the eviction buffer
// read before each timed pass. Throws Error when any check fails.
SchemeRun run_scheme(const std::string& name, const SchemeOptions& scheme_opts,
                     const GradientStream& stream, std::span<const float> evict,
                     const SparsifierBenchOptions& options);

// The reference points, measured once per run.
struct Baselines {
  double floor_ms = 0.0;  // read pass over all d elements
  double bandwidth_gbps = 0.0;
  double nth_element_ms = 0.0;
  std::optional<double> torch_topk_ms;
};

// The floor over rank 0's first gradient, std::nth_element and torch::topk
// on its |a| for the same k (verified against each other).
Baselines measure_baselines(const GradientStream& stream, const SparsifierBenchOptions& options);

// The eviction buffer's size in floats: 4x the last-level cache, in [64, 512] MiB.
std::size_t eviction_floats();

}  // namespace sparsecomm::cli
