// The server's log (server.h, ServerLog in parameter_server.h): the
// record of each applied push and of each granted BEGIN, the totals they
// add to, and the log's part of the server's state.

#include <chrono>

#include "sparsecomm/ps/server.h"

namespace sparsecomm::ps {

// Worker p's push, applied now at version_: its record and the log's
// totals.
void Server::record_applied(int p, const RequestHeader& h, std::uint64_t fingerprint, double sum,
                            std::size_t bytes) {
  AppliedPush applied;
  applied.worker = p;
  applied.clock = h.clock;
  applied.pulled_version = h.pulled_version;
  applied.staleness = version_ - h.pulled_version;
  applied.time_s = now_s();
  applied.values = static_cast<std::size_t>(h.count);
  applied.bytes = bytes;
  log_.applied.push_back(applied);
  ++log_.pushes;
  log_.values += applied.values;
  log_.value_sum += sum;
  log_.fingerprint += fingerprint;
}

// Worker p's BEGIN, granted now on `decision`: a grant record, and its
// wait in the worker's WaitStats when it was held.
BeginGrant Server::record_grant(int p, const ClockController::Decision& decision) {
  const Slot& slot = slot_of(p);
  const RequestHeader& h = slot.header;
  BeginGrant record;
  record.worker = p;
  record.clock = h.clock;
  record.min_clock = decision.min_clock;
  record.blocked = slot.held;
  record.extra = decision.extra;
  record.dssp_r = decision.dssp_r;
  record.wait_s =
      slot.held ? std::chrono::duration<double>(Clock::now() - slot.held_since).count() : 0.0;
  record.time_s = now_s();
  log_.grants.push_back(record);
  if (record.blocked) {
    WaitStats& waits = log_.waits[static_cast<std::size_t>(p)];
    ++waits.count;
    waits.seconds += record.wait_s;
  }
  return record;
}

void save_log(StateWriter& w, const ServerLog& log) {
  w.value<std::int64_t>(log.pushes);
  w.value<std::uint64_t>(log.values);
  w.value<double>(log.value_sum);
  w.value<std::uint64_t>(log.fingerprint);
  w.value<std::int64_t>(log.pulls);
  w.value<std::uint64_t>(log.bytes_received);
  w.value<std::uint64_t>(log.bytes_sent);
  w.value<std::uint64_t>(log.applied.size());
  for (const AppliedPush& a : log.applied) {
    w.value<std::int32_t>(a.worker);
    w.value<std::int64_t>(a.clock);
    w.value<std::int64_t>(a.pulled_version);
    w.value<std::int64_t>(a.staleness);
    w.value<double>(a.time_s);
    w.value<std::uint64_t>(a.values);
    w.value<std::uint64_t>(a.bytes);
  }
  w.value<std::uint64_t>(log.grants.size());
  for (const BeginGrant& g : log.grants) {
    w.value<std::int32_t>(g.worker);
    w.value<std::int64_t>(g.clock);
    w.value<std::int64_t>(g.min_clock);
    w.value<std::uint8_t>(g.blocked ? 1 : 0);
    w.value<std::uint8_t>(g.extra ? 1 : 0);
    w.value<std::int64_t>(g.dssp_r);
    w.value<double>(g.wait_s);
    w.value<double>(g.time_s);
  }
  w.value<std::uint64_t>(log.waits.size());
  for (const WaitStats& s : log.waits) {
    w.value<std::int64_t>(s.count);
    w.value<double>(s.seconds);
  }
}

void load_log(StateReader& r, ServerLog& log) {
  log.pushes = r.value<std::int64_t>();
  log.values = r.value<std::uint64_t>();
  log.value_sum = r.value<double>();
  log.fingerprint = r.value<std::uint64_t>();
  log.pulls = r.value<std::int64_t>();
  log.bytes_received = r.value<std::uint64_t>();
  log.bytes_sent = r.value<std::uint64_t>();
  log.applied.resize(r.count(sizeof(std::int32_t) + 6 * sizeof(std::int64_t)));
  for (AppliedPush& a : log.applied) {
    a.worker = r.value<std::int32_t>();
    a.clock = r.value<std::int64_t>();
    a.pulled_version = r.value<std::int64_t>();
    a.staleness = r.value<std::int64_t>();
    a.time_s = r.value<double>();
    a.values = r.value<std::uint64_t>();
    a.bytes = r.value<std::uint64_t>();
  }
  log.grants.resize(r.count(sizeof(std::int32_t) + 2 + 5 * sizeof(std::int64_t)));
  for (BeginGrant& g : log.grants) {
    g.worker = r.value<std::int32_t>();
    g.clock = r.value<std::int64_t>();
    g.min_clock = r.value<std::int64_t>();
    g.blocked = r.value<std::uint8_t>() != 0;
    g.extra = r.value<std::uint8_t>() != 0;
    g.dssp_r = r.value<std::int64_t>();
    g.wait_s = r.value<double>();
    g.time_s = r.value<double>();
  }
  log.waits.resize(r.count(2 * sizeof(std::int64_t)));
  for (WaitStats& s : log.waits) {
    s.count = r.value<std::int64_t>();
    s.seconds = r.value<double>();
  }
}

}  // namespace sparsecomm::ps
