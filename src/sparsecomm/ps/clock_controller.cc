#include "sparsecomm/ps/clock_controller.h"

#include <limits>

#include <fmt/format.h>

namespace sparsecomm::ps {

ClockController::ClockController(const SyncModel& model, int workers)
    : model_(model), workers_(static_cast<std::size_t>(workers)) {}

void ClockController::pushed(int p, std::int64_t clock, double time_s) {
  WorkerClock& w = workers_[index(p)];
  w.clock = clock;
  w.previous_push = w.last_push;
  w.last_push = time_s;
}

void ClockController::save(StateWriter& writer) const {
  writer.tag("ps-clocks");
  writer.value<std::uint64_t>(workers_.size());
  for (const WorkerClock& w : workers_) {
    writer.value<std::int64_t>(w.clock);
    writer.value<double>(w.last_push);
    writer.value<double>(w.previous_push);
    writer.value<std::uint8_t>(w.done ? 1 : 0);
    writer.value<std::uint8_t>(w.in_episode ? 1 : 0);
    writer.value<std::int64_t>(w.remaining);
  }
}

void ClockController::load(StateReader& reader) {
  reader.expect_tag("ps-clocks");
  const auto count = reader.value<std::uint64_t>();
  if (count != workers_.size()) {
    throw Error(fmt::format("[ps] the saved clocks are of {} workers, this run has {}", count,
                            workers_.size()));
  }
  for (WorkerClock& w : workers_) {
    w.clock = reader.value<std::int64_t>();
    w.last_push = reader.value<double>();
    w.previous_push = reader.value<double>();
    w.done = reader.value<std::uint8_t>() != 0;
    w.in_episode = reader.value<std::uint8_t>() != 0;
    w.remaining = reader.value<std::int64_t>();
    w.grant_evaluated = false;
    w.dssp_r = -1;
  }
}

void ClockController::finished(int p) { workers_[index(p)].done = true; }

void ClockController::new_request(int p) {
  WorkerClock& w = workers_[index(p)];
  w.grant_evaluated = false;
  w.dssp_r = -1;
}

std::int64_t ClockController::min_clock() const {
  std::int64_t min = std::numeric_limits<std::int64_t>::max();
  for (const WorkerClock& w : workers_) {
    if (!w.done) min = std::min(min, w.clock);
  }
  return min;
}

const ClockController::WorkerClock& ClockController::slowest() const {
  const WorkerClock* best = nullptr;
  for (const WorkerClock& w : workers_) {
    if (w.done) continue;
    if (best == nullptr || w.clock < best->clock ||
        (w.clock == best->clock && w.last_push < best->last_push)) {
      best = &w;
    }
  }
  return best != nullptr ? *best : workers_.front();
}

bool ClockController::grant_extra(WorkerClock& w) {
  if (w.in_episode && w.remaining > 0) {
    --w.remaining;
    return true;
  }
  if (w.in_episode || w.grant_evaluated) return false;
  w.grant_evaluated = true;
  const WorkerClock& slow = slowest();
  // Fall back to SSP(s_L) until both have push intervals.
  if (w.clock < 2 || slow.clock < 2) return false;
  w.dssp_r =
      dssp_grant(w.last_push, w.last_push - w.previous_push, slow.last_push,
                 slow.last_push - slow.previous_push, model_.staleness_upper - model_.staleness);
  if (w.dssp_r <= 0) return false;
  w.in_episode = true;
  w.remaining = w.dssp_r - 1;
  return true;
}

ClockController::Decision ClockController::decide(int p) {
  WorkerClock& w = workers_[index(p)];
  Decision d;
  d.min_clock = min_clock();
  const std::int64_t ahead = w.clock - d.min_clock;
  switch (model_.kind) {
    case SyncModelKind::kAsp:
      d.grant = true;
      break;
    case SyncModelKind::kBsp:
      d.grant = ahead <= 0;
      break;
    case SyncModelKind::kSsp:
      d.grant = ahead <= model_.staleness;
      break;
    case SyncModelKind::kDssp:
      if (ahead <= model_.staleness) {
        d.grant = true;
        w.in_episode = false;
        w.remaining = 0;
      } else if (ahead <= model_.staleness_upper) {
        d.grant = d.extra = grant_extra(w);
      }
      break;
  }
  d.dssp_r = w.dssp_r;
  return d;
}

}  // namespace sparsecomm::ps
