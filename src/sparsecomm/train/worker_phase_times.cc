#include "sparsecomm/train/worker_phase_times.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>

#include "sparsecomm/report/statistics.h"

namespace sparsecomm {

nlohmann::json WorkerPhaseTimes::gather(Communicator& comm) const {
  const std::size_t ranks = static_cast<std::size_t>(comm.size());
  // The step counts first, so the rows can be padded to one length.
  const std::int64_t mine = static_cast<std::int64_t>(compute_.size());
  std::vector<std::int64_t> counts(ranks);
  comm.allgather(std::as_bytes(std::span<const std::int64_t>(&mine, 1)),
                 std::as_writable_bytes(std::span<std::int64_t>(counts)));
  const std::size_t longest =
      static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
  // Each rank's row: its compute times, then its exchange times, each
  // padded to `longest`.
  std::vector<double> row(2 * longest, 0.0);
  std::copy(compute_.begin(), compute_.end(), row.begin());
  std::copy(exchange_.begin(), exchange_.end(), row.begin() + static_cast<std::ptrdiff_t>(longest));
  std::vector<double> all(ranks * row.size());
  comm.allgather(std::as_bytes(std::span<const double>(row)),
                 std::as_writable_bytes(std::span<double>(all)));
  if (comm.rank() != 0) return nlohmann::json::object();

  std::size_t common = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> workers;
  for (std::size_t r = 0; r < ranks; ++r) {
    if (counts[r] == 0) continue;
    workers.push_back(r);
    common = std::min(common, static_cast<std::size_t>(counts[r]));
  }
  if (workers.empty()) {
    return {{"compute_spread_s", 0.0}, {"compute_spread_rms_s", 0.0}, {"arrival_wait_s", 0.0}};
  }
  // The first steps allocate, fault pages in and start thread pools, and
  // spread far more than the rest: left out when later steps remain.
  const std::size_t skipped = common > kWarmupSteps ? kWarmupSteps : 0;
  const std::size_t counted = common - skipped;
  // Worker rows of `counted` steps each, for report::compute_spread.
  std::vector<double> compute;
  nlohmann::json compute_means = nlohmann::json::array();
  nlohmann::json exchange_means = nlohmann::json::array();
  for (const std::size_t r : workers) {
    const double* base = all.data() + r * row.size() + skipped;
    compute.insert(compute.end(), base, base + counted);
    compute_means.push_back(report::mean(std::span<const double>(base, counted)));
    exchange_means.push_back(report::mean(std::span<const double>(base + longest, counted)));
  }
  const report::ComputeSpread spread =
      report::compute_spread(compute, static_cast<int>(workers.size()));
  return {{"compute_spread_s", spread.spread_s},
          {"compute_spread_rms_s", spread.spread_rms_s},
          {"arrival_wait_s", spread.wait_s},
          {"per_worker_mean_s", {{"compute", compute_means}, {"exchange", exchange_means}}},
          {"phase_times_skipped_steps", skipped}};
}

}  // namespace sparsecomm
