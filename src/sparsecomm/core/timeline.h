#pragma once
// A rank's timeline (docs/timeline.md): the spans of its phases (compute,
// selection, exchange, each blocking wait on a peer, update, evaluation,
// checkpoint) and counters, recorded by whatever thread runs them into the
// Timeline bound to that thread, and written as Chrome trace events
// (Perfetto, chrome://tracing) by train/timeline_writer.h.
//
// Recording is cheap enough to leave on: a span is two clock reads and one
// append under an uncontended mutex into a buffer that the writer drains
// after every step; a thread without a timeline pays one thread-local load.
// Names and categories are string literals (the events keep the pointers).

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include "sparsecomm/core/timer.h"

namespace sparsecomm {

struct TimelineEvent {
  const char* name = "";
  const char* category = "";
  std::int64_t begin_ns = 0;      // since the timeline's origin
  std::int64_t duration_ns = -1;  // < 0: a counter sample (`value`)
  double value = 0.0;
  int thread = 0;  // the recording thread's small id (thread_id_on_timeline)
  int peer = -1;   // a wait's peer rank, -1 for none
  std::uint64_t bytes = 0;
  std::int64_t step = -1;  // the step being trained when recorded
};

class Timeline {
 public:
  // Events are timed from `origin` (the ranks' common start). At most
  // `capacity` events wait between drains; later ones are dropped and
  // counted (a step's worth is far below the default).
  Timeline(int rank, Clock::time_point origin, std::size_t capacity = std::size_t{1} << 18);

  int rank() const { return rank_; }
  std::int64_t since_origin(Clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_).count();
  }
  // The step that events are recorded under from now on.
  void set_step(std::int64_t step);

  // Thread-safe.
  void add_span(const char* name, const char* category, Clock::time_point begin,
                Clock::time_point end, int peer = -1, std::uint64_t bytes = 0);
  void add_counter(const char* name, double value);
  // The events recorded since the last drain, in the order they ended.
  std::vector<TimelineEvent> drain();
  std::uint64_t dropped() const;

 private:
  void add(TimelineEvent event);

  int rank_;
  Clock::time_point origin_;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<TimelineEvent> events_;
  std::int64_t step_ = -1;
  std::uint64_t dropped_ = 0;
};

// The timeline this thread records into; null: none (nothing is recorded).
Timeline* current_timeline();

// Binds `timeline` to this thread for the binding's lifetime (null unbinds);
// the previous binding comes back after.
class BindTimeline {
 public:
  explicit BindTimeline(Timeline* timeline);
  ~BindTimeline();
  BindTimeline(const BindTimeline&) = delete;
  BindTimeline& operator=(const BindTimeline&) = delete;

 private:
  Timeline* previous_;
};

// A Stopwatch whose interval also goes on this thread's timeline: the
// metrics and the timeline then hold the same seconds. stop() ends it
// (once; later calls return the same seconds); destruction stops it.
class TimedSpan {
 public:
  TimedSpan(const char* name, const char* category)
      : name_(name), category_(category), begin_(Clock::now()) {}
  ~TimedSpan() { stop(); }
  TimedSpan(const TimedSpan&) = delete;
  TimedSpan& operator=(const TimedSpan&) = delete;

  double stop();

 private:
  const char* name_;
  const char* category_;
  Clock::time_point begin_;
  double seconds_ = -1.0;
};

// A counter sample on this thread's timeline, if it has one.
void timeline_counter(const char* name, double value);

}  // namespace sparsecomm
