#pragma once
// MiCRO and ExDyna: threshold selection inside exclusive partitions that
// rotate every step, with a shared density controller and (ExDyna) dynamic
// partition allocation. One implementation, configured by options:
//
//   scheme            layout                   controller   empty selection
//   micro             equal                    exact        count 0
//   exdyna            blocks, cyclic           exact, cap   count 0
//   exdyna-faithful   blocks, sweep            table        count 0
//   (micro with controller=table, padding=true is the MiCRO reference;
//   exdyna with balancer=counts controller=histogram is the previous default)
//
// exact: one global threshold from all-reduced histograms of this step's
// candidates (with a cap, no rank above cap x k/n); quota: each rank's own
// threshold that selects exactly its share k/n of its partition
// (StepThreshold, per_rank); histogram, table:
// the threshold the previous steps predict (DensityController).

#include <memory>
#include <string_view>
#include <vector>

#include "sparsecomm/sparsify/density_controller.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/partition.h"
#include "sparsecomm/sparsify/sparsifier.h"
#include "sparsecomm/sparsify/step_threshold.h"

namespace sparsecomm {

struct PartitionedOptions {
  enum class Layout {
    kEqual,      // MiCRO: n equal contiguous partitions
    kSweep,      // the reference's one-block sweep of contiguous partitions
    kBalanced,   // contiguous partitions from prefix sums of per-block counts
    kScattered,  // blocks dealt greedily by predicted load, ceil(B/n) each at most
    kCyclic,     // block-cyclic: partition p holds the blocks b with b mod n == p
  };
  enum class Controller { kExact, kHistogram, kTable };
  std::string name = "micro";
  double density = 0.01;
  Layout layout = Layout::kEqual;
  Controller controller = Controller::kExact;
  StepThresholdOptions exact;
  HistogramControllerOptions histogram;
  TableControllerOptions table;
  int blocks = 1024;               // ExDyna block count B
  int blocks_per_rank = 64;        // scattered layout: B = max(blocks, blocks_per_rank * n)
  int alignment = 32;              // block size multiple
  bool spread_remainder = true;    // false: the reference's remainder-in-the-last-block
  SweepOptions sweep;              // faithful sweep band and min blocks
  BalanceOptions balance;          // default balancer (min_blocks 0 -> 1)
  double balance_smoothing = 0.1;  // weight of the newest block counts in their running average
  bool padding = false;            // reference: one index when the selection is empty
};

std::unique_ptr<Sparsifier> make_partitioned_sparsifier(const PartitionedOptions& options);

// The scheme-specific option specs and their parsing, for the registry.
// `scheme` is one of micro, exdyna, exdyna-faithful (it sets the defaults).
std::vector<OptionSpec> partitioned_option_specs(std::string_view scheme);
PartitionedOptions partitioned_options_from(std::string_view scheme, const SchemeOptions& options);

}  // namespace sparsecomm
