#include "sparsecomm/sync/two_level.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/group_view.h"
#include "sparsecomm/comm/host_names.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"

namespace sparsecomm {

void HostTopology::check(int world) const {
  if (ranks_per_host < 1 || world % ranks_per_host != 0) {
    throw InvalidArgument(fmt::format(
        "[two-level] {} ranks per host do not divide the world of {} ranks into hosts; give a "
        "divisor of {} (1: one rank per host, no second level)",
        ranks_per_host, world, world));
  }
}

HostTopology topology_of_hosts(std::span<const int> host) {
  const auto world = static_cast<int>(host.size());
  const auto per_host = static_cast<int>(std::count(host.begin(), host.end(), host.front()));
  // The first rank off the pattern "rank r on host r / per_host"; the last
  // host's first rank when that host runs fewer.
  int off = world % per_host == 0 ? world : world - world % per_host;
  for (int r = 0; r < world; ++r) {
    if (host[static_cast<std::size_t>(r)] != r / per_host) {
      off = r;
      break;
    }
  }
  if (off < world) {
    throw InvalidArgument(fmt::format(
        "[two-level] the ranks' host names do not place {} consecutive ranks on each host, as "
        "rank 0's host has (rank {} is on host {} of {}): start the same number of ranks on "
        "each host, a host at a time (mpiexec --map-by slot, the default), or give "
        "--ranks-per-host R",
        per_host, off, host[static_cast<std::size_t>(off)] + 1,
        *std::max_element(host.begin(), host.end()) + 1));
  }
  return HostTopology{per_host};
}

HostTopology detect_host_topology(Communicator& comm) {
  return topology_of_hosts(host_of_each_rank(comm));
}

HostTopology resolve_host_topology(int ranks_per_host, Communicator& comm) {
  if (ranks_per_host == kDetectRanksPerHost) return detect_host_topology(comm);
  const HostTopology topology{ranks_per_host};
  topology.check(comm.size());
  return topology;
}

namespace {

// What a leader tells its host after the exchange between hosts.
enum class HostOutcome : std::uint8_t { kDone = 0, kSkipped = 1, kStopped = 2 };

class TwoLevelSync final : public GradientSyncDecorator {
 public:
  TwoLevelSync(std::unique_ptr<GradientSync> inner, HostTopology topology)
      : GradientSyncDecorator(std::move(inner)), topology_(topology) {}

  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override {
    views(comm);
    const Stopwatch watch;
    const std::uint64_t host_sent_before = host_->bytes_sent();
    const std::uint64_t host_received_before = host_->bytes_received();
    const bool leader = topology_.leads(comm.rank());
    // 1. The host's mean.
    allreduce(*host_, gradient);
    const float scale = 1.0f / static_cast<float>(topology_.ranks_per_host);
    for (float& value : gradient) value *= scale;

    // 2. Between hosts, on the leaders.
    StepMetrics metrics;
    HostOutcome outcome = HostOutcome::kDone;
    std::string stopped_because;
    if (leader) {
      StepContext between = ctx;
      between.rank = leaders_->rank();
      between.world = leaders_->size();
      try {
        metrics = inner_->synchronize(gradient, between, *leaders_);
        if (metrics.skipped_nonfinite) outcome = HostOutcome::kSkipped;
      } catch (const NonFiniteGradient& e) {
        outcome = HostOutcome::kStopped;
        stopped_because = e.what();
      }
    } else {
      metrics.step = ctx.step;
      metrics.numel = gradient.size();
    }

    // 3. The result to the host.
    auto code = static_cast<std::uint8_t>(outcome);
    host_->broadcast(std::as_writable_bytes(std::span<std::uint8_t>(&code, 1)), 0);
    outcome = static_cast<HostOutcome>(code);
    if (outcome == HostOutcome::kStopped) {
      if (leader) throw NonFiniteGradient(stopped_because);
      throw NonFiniteGradient(fmt::format(
          "[two-level] rank {}: step {}: the leader of host {} stopped on a non-finite gradient "
          "between hosts (its message says which)",
          comm.rank(), ctx.step, topology_.host_of(comm.rank())));
    }
    metrics.skipped_nonfinite = outcome == HostOutcome::kSkipped;
    host_->broadcast(std::as_writable_bytes(gradient), 0);
    metrics.host_bytes_sent = host_->bytes_sent() - host_sent_before;
    metrics.host_bytes_received = host_->bytes_received() - host_received_before;
    metrics.exchange_s = watch.seconds() - metrics.selection_s - metrics.accumulate_s;
    return metrics;
  }

  void save(StateWriter& writer) const override {
    writer.tag("two_level");
    writer.value<std::int32_t>(topology_.ranks_per_host);
    inner_->save(writer);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("two_level");
    const auto saved = reader.value<std::int32_t>();
    if (saved != topology_.ranks_per_host) {
      throw Error(
          fmt::format("[two-level] the saved state is of {} ranks per host, this run has {}", saved,
                      topology_.ranks_per_host));
    }
    inner_->load(reader);
  }

 private:
  // The host's view and, on leaders, the leaders' view of `comm` (made on
  // the first step; a later step must pass the same world).
  void views(Communicator& comm) {
    if (world_ == &comm) return;
    if (world_ != nullptr) {
      throw InvalidArgument(
          "[two-level] a two-level synchronization steps on the world it began on; make one per "
          "communicator");
    }
    topology_.check(comm.size());
    const int per_host = topology_.ranks_per_host;
    const int first = topology_.host_of(comm.rank()) * per_host;
    std::vector<int> host(static_cast<std::size_t>(per_host));
    for (int i = 0; i < per_host; ++i) host[static_cast<std::size_t>(i)] = first + i;
    host_ = std::make_unique<GroupView>(comm, std::move(host));
    if (topology_.leads(comm.rank())) {
      std::vector<int> leaders;
      for (int h = 0; h < topology_.hosts(comm.size()); ++h) leaders.push_back(h * per_host);
      leaders_ = std::make_unique<GroupView>(comm, std::move(leaders));
    }
    world_ = &comm;
  }

  HostTopology topology_;
  const Communicator* world_ = nullptr;
  std::unique_ptr<GroupView> host_;
  std::unique_ptr<GroupView> leaders_;  // leaders only
};

}  // namespace

std::unique_ptr<GradientSync> with_two_levels(std::unique_ptr<GradientSync> inner,
                                              HostTopology topology) {
  if (topology.ranks_per_host < 1) {
    throw InvalidArgument(
        fmt::format("[two-level] {} ranks per host: give 1 or more", topology.ranks_per_host));
  }
  if (topology.ranks_per_host == 1) return inner;
  return std::make_unique<TwoLevelSync>(std::move(inner), topology);
}

}  // namespace sparsecomm
