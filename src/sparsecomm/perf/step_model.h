#pragma once
// The step time of each synchronization method (docs/algorithms.md,
// "Performance model"):
//
//   step = compute + accumulate + selection + exchange - overlap + update
//
// where the exchange also holds the arrival wait (the slowest of n ranks'
// compute, when compute times spread), with the exchange from
// collective_cost.h, the sparsification statistics
// from scheme_scaling.h and the host costs from the profile. Pure
// functions: no clock, no communicator.

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/index_codec.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/perf/collective_cost.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/perf/scheme_scaling.h"

namespace sparsecomm::perf {

// What is trained and on what: one prediction's input.
struct Scenario {
  int ranks = 4;       // n (parameter server: workers; servers are extra hosts)
  double numel = 0.0;  // d, parameters
  // Of d, the parameters averaged densely beside a sparse method or
  // Skip-Reduce (train's --min-numel, --exclude): a ring all-reduce of
  // them per call, and the method on the other d - dense_numel, its
  // k = c (d - dense_numel). Dense and ps send every parameter anyway.
  double dense_numel = 0.0;
  double density = 0.01;   // c, k = c d
  double compute_s = 0.0;  // forward + backward per step on one rank (its mean)
  // The standard deviation of one rank's compute time per step, ranks
  // independent; a synchronous step waits for the slowest of n. 0: none.
  double compute_spread_s = 0.0;
  double backward_share = 2.0 / 3.0;  // of compute_s, the part communication can overlap
  double bucket_bytes = 0.0;          // > 0: pipelined in buckets of this size (bucketable methods)
  int servers = 1;                    // parameter server: S
  // > 0: local steps (train's --local-steps H): the method synchronizes the
  // pseudo-gradient once per H steps, unpipelined, and the prediction is per
  // inner step: the synchronization's terms and bytes over H, the arrival
  // wait that of H steps' compute, the outer step's update over H. K/k and
  // the imbalance are taken as the gradient's (not measured on
  // pseudo-gradients). 0: every step synchronizes.
  int local_steps = 0;
  // With local steps: a round's exchange runs while the next round computes
  // (train's --outer-overlap), hiding up to one inner step's compute of
  // exchange per inner step (the arrival wait and the host work stay).
  bool overlap_rounds = false;
  bool encode_indices = true;  // varint indices (the schemes' default)
  // The sparse methods' values on the wire (train's values=; the dense
  // quantizers use their own codec): their width and codec costs. Dense's
  // ring takes fp16 and bf16 (half the bytes) and stays fp32 for the rest.
  ValueEncoding values = ValueEncoding::kFloat32;
  // PowerSGD: the tensors the method runs on, by size and first dimension
  // (LayerSpan::rows; offsets unused); the method's parameters outside them
  // are averaged whole. Borrowed; empty: the shapes are unknown and
  // PowerSGD, whose cost depends on them, is not priced.
  std::span<const LayerSpan> tensors = {};
  int low_rank = 1;  // PowerSGD's rank r
  // Measured statistics (measured_scaling.h) that replace the built-in ones
  // for the schemes they hold; nullptr: the built-in ones. Borrowed.
  const ScalingTable* statistics = nullptr;
  // Hosts of this many ranks (train's --ranks-per-host, sync/two_level.h;
  // docs/algorithms/two-level.md): > 1, the ranks of a host all-reduce the
  // gradient over `host_link`, the method runs among the ranks /
  // ranks_per_host leaders on the profile's link (its statistics at that
  // many ranks), and each leader broadcasts the result inside its host.
  // 1: flat, every rank on the profile's link.
  int ranks_per_host = 1;
  // The link inside a host (alpha, beta, gamma used); nullptr: the
  // profile's. Borrowed.
  const CostProfile* host_link = nullptr;
  // The exchange pattern of the schemes that select per rank (independent
  // and partitioned: train's -o exchange=): unset, each scheme's own (the
  // sparse allgather, or the union all-reduce for the partition schemes).
  // Set, every such scheme that accepts it (registry.h, exchange_choices)
  // is priced with it; kSharedIndices is for the shared schemes only. ok-topk
  // takes fp32 values only.
  std::optional<ExchangePattern> exchange = std::nullopt;
};

// Throws InvalidArgument naming the field when the scenario is not one the
// model can predict (ranks < 1, d <= 0, dense_numel outside [0, d),
// c outside (0, 1], negative times, servers < 1, local_steps < 0,
// low_rank < 1, ranks_per_host < 1 or not dividing ranks, exchange shared
// or ok-topk with values other than fp32).
void check_scenario(const Scenario& scenario);

struct StepPrediction {
  std::string method;
  std::string exchange;  // the collective or pattern it runs
  double compute_s = 0.0;
  double accumulate_s = 0.0;    // error feedback: a = g + e
  double selection_s = 0.0;     // the slowest rank's select(), less its collectives
  double exchange_s = 0.0;      // the exchange plus select()'s own collectives
  double agreement_s = 0.0;     // sparse steps: the non-finite agreement (in exchange_s)
  double arrival_wait_s = 0.0;  // for the slowest rank's compute (in exchange_s)
  double overlap_s = 0.0;       // pipelined: hidden behind backward
  double update_s = 0.0;        // the optimizer
  // Two levels: the all-reduce and the broadcast inside the host (in
  // exchange_s); the rest of exchange_s is between hosts.
  double host_s = 0.0;
  double step_s = 0.0;
  double bytes_sent = 0.0;  // per rank and step: payload
  double bytes_received = 0.0;
  // What the rank's NIC sends per step: the payload with the profile's
  // framing, per message (one per round) the larger of
  // wire_bytes_per_message and wire_overhead_per_byte of its payload.
  double wire_bytes_sent = 0.0;
  double density_ratio = 1.0;  // K/k (1 for dense and Skip-Reduce)
  double imbalance = 0.0;
  // Where K/k and the imbalance came from: "measured" (Scenario::statistics),
  // "built-in" (the synthetic stream) or "" (the method needs none).
  std::string statistics;
};

// E[max of n independent standard normal variables]: 0 for n = 1,
// 1/sqrt(pi) for 2, 3/(2 sqrt(pi)) for 3, about sqrt(2 ln n) for large n.
// The arrival wait of a synchronous step is compute_spread_s times this.
// Throws InvalidArgument for n < 1.
double expected_max_of_normals(int n);

// The methods the model predicts, in the order `plan` lists them: dense,
// skipreduce, powersgd, demo, every sparse scheme with its default pattern, and
// ps (dense pushes under BSP).
const std::vector<std::string>& modeled_methods();

// Whether the model scales `method`'s statistics with n (the schemes whose
// ranks select independently, and the partition schemes), and whether its
// ranks select independently (their union builds up with n).
bool has_scheme_statistics(std::string_view method);
// Whether `method`'s cost depends on the tensors' shapes (Scenario::tensors):
// PowerSGD's.
bool needs_tensor_shapes(std::string_view method);
// Whether `method` can synchronize --local-steps' rounds: not ps (its
// workers push every step) nor demo (train refuses it there).
bool takes_local_steps(std::string_view method);
bool selects_independently(std::string_view method);

// The prediction for `method` (a name of modeled_methods()); throws
// InvalidArgument for an unknown method, a bad scenario, or ps on two
// levels (train refuses it). bytes_* are per rank between hosts: on two
// levels a leader's, as the trainer's metrics count them.
StepPrediction predict_step(std::string_view method, const Scenario& scenario,
                            const CostProfile& profile);

}  // namespace sparsecomm::perf
