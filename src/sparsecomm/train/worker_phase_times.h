#pragma once
// Every worker's per-step phase times, gathered once after training (off
// the clock) for summary.json. Rank 0's metrics.jsonl shows one rank; the
// performance model predicts the mean over ranks, and a rank that computes
// more slowly than the others also waits less for them, so the comparison
// needs every rank's times.

#include <vector>

#include <nlohmann/json.hpp>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm {

class WorkerPhaseTimes {
 public:
  // One trained step: its forward/backward time and its communication
  // (everything between the gradient and the update that is not selection:
  // the exchange and, in parameter-server mode, the wait for the grant).
  void add_step(double compute_s, double exchange_s) {
    compute_.push_back(compute_s);
    exchange_.push_back(exchange_s);
  }

  // The first steps this process trains are warm-up (allocation, page
  // faults, thread pools): the statistics leave them out when more remain.
  static constexpr std::size_t kWarmupSteps = 3;

  // Collective over every rank of `comm`: ranks that train no step (the
  // parameter servers) take part with none and are left out. When workers
  // trained different numbers of steps, their common first steps count.
  // Rank 0 gets summary.json's fields, the other ranks an empty object:
  //   compute_spread_s, compute_spread_rms_s, arrival_wait_s
  //       report::compute_spread of compute;
  //   per_worker_mean_s.compute / .exchange   each worker's mean per step;
  //   phase_times_skipped_steps   the warm-up steps left out (0 or 3).
  nlohmann::json gather(Communicator& comm) const;

 private:
  std::vector<double> compute_;
  std::vector<double> exchange_;
};

}  // namespace sparsecomm
