#pragma once
// Timelines on disk (docs/timeline.md): each rank appends its events, as
// Chrome trace-event objects one per line, to a part file of its own after
// every step; rank 0 merges the parts into one trace that Perfetto and
// chrome://tracing open ({"traceEvents": [...]}, one process per rank,
// microseconds from the ranks' common start).

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sparsecomm/core/timeline.h"

namespace sparsecomm {

// The part file of `rank` for the trace `trace`: TRACE.parts/rank-R.jsonl.
std::filesystem::path timeline_part(const std::filesystem::path& trace, int rank);

// One event as a Chrome trace-event object (spans "X", counters "C"; the
// step, a wait's peer and bytes in args), without a newline.
std::string trace_event_json(int rank, const TimelineEvent& event);

// One rank's recording for the trace `trace`: its Timeline, timed from
// construction (make it on every rank right after a barrier: the ranks'
// common origin), and its part, opened once (a previous run's replaced).
class TimelineRecorder {
 public:
  // Throws Error naming the part when it cannot be created.
  TimelineRecorder(const std::filesystem::path& trace, int rank);

  Timeline& events() { return events_; }
  // Appends the events recorded since the last call to the part, one
  // object per line. Throws Error naming the file when it cannot be written.
  void end_step();
  // After every rank's last end_step (the caller's barrier): rank 0 merges
  // the parts (merge_trace_parts) and returns the ranks it did not find;
  // the other ranks return none.
  std::vector<int> merge(int world);

 private:
  std::filesystem::path trace_;
  std::filesystem::path part_;
  Timeline events_;
  std::ofstream out_;
};

// Writes `trace` (atomically) from the parts of ranks 0..ranks-1 that
// exist, naming each rank's process, and removes the parts when none was
// missing. Returns the ranks whose part was not found (on another host's
// disk: copy them beside the others and merge again with `sparsecomm
// report --timeline`).
std::vector<int> merge_trace_parts(const std::filesystem::path& trace, int ranks);

}  // namespace sparsecomm
