#pragma once
// The consistency controller that parameter server 0 runs beside its shard
// (server.cc): each worker's clock (the pushes it has made) and the answer
// of the synchronization model (sync_model.h) to a worker's BEGIN of a step.

#include <cstdint>
#include <vector>

#include "sparsecomm/core/state_io.h"
#include "sparsecomm/ps/sync_model.h"

namespace sparsecomm::ps {

class ClockController {
 public:
  ClockController(const SyncModel& model, int workers);

  // Worker p's push of clock - 1 arrived at `time_s`: its clock is now `clock`.
  void pushed(int p, std::int64_t clock, double time_s);
  // Worker p is done: it leaves the minimum clock.
  void finished(int p);
  // A new BEGIN from worker p: DSSP decides its extra steps afresh.
  void new_request(int p);

  std::int64_t clock(int p) const { return workers_[index(p)].clock; }
  // The smallest clock of the workers still running.
  std::int64_t min_clock() const;

  struct Decision {
    bool grant = false;          // the step may begin now
    bool extra = false;          // DSSP: beyond s_L, on granted extra steps
    std::int64_t min_clock = 0;  // the running workers' minimum it was decided on
    std::int64_t dssp_r = -1;    // DSSP: the extra steps granted at this BEGIN (-1: none decided)
  };
  // Whether worker p, at its own clock, may begin its next step now. Not
  // granted: ask again when a push or a DONE has arrived. DSSP's extra
  // steps are decided once per request (new_request) and then counted down.
  Decision decide(int p);

  // The clocks and DSSP's episodes (a checkpoint's cut: no request open).
  void save(StateWriter& writer) const;
  // Error when the state is of another number of workers.
  void load(StateReader& reader);

 private:
  struct WorkerClock {
    std::int64_t clock = 0;  // pushes received
    double last_push = 0.0;
    double previous_push = 0.0;
    bool done = false;
    bool in_episode = false;  // DSSP: past s_L on granted extra steps
    std::int64_t remaining = 0;
    bool grant_evaluated = false;  // DSSP: this request's extra steps decided
    std::int64_t dssp_r = -1;
  };
  static std::size_t index(int p) { return static_cast<std::size_t>(p); }
  // The running worker with the smallest clock (ties: the oldest last push).
  const WorkerClock& slowest() const;
  // DSSP between s_L and s_U: extra steps, if the timing predicts they help.
  bool grant_extra(WorkerClock& worker);

  SyncModel model_;
  std::vector<WorkerClock> workers_;
};

}  // namespace sparsecomm::ps
