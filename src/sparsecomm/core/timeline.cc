#include "sparsecomm/core/timeline.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

namespace sparsecomm {
namespace {

thread_local Timeline* bound_timeline = nullptr;

// A small id per thread, in the order threads first record (the trace's tid).
int this_thread_id() {
  static std::atomic<int> next{0};
  thread_local const int id = next.fetch_add(1);
  return id;
}

}  // namespace

Timeline::Timeline(int rank, Clock::time_point origin, std::size_t capacity)
    : rank_(rank), origin_(origin), capacity_(capacity) {
  events_.reserve(std::min<std::size_t>(capacity_, 4096));
}

void Timeline::set_step(std::int64_t step) {
  const std::lock_guard lock(mutex_);
  step_ = step;
}

void Timeline::add(TimelineEvent event) {
  event.thread = this_thread_id();
  const std::lock_guard lock(mutex_);
  if (events_.size() >= capacity_) {
    ++dropped_;
    return;
  }
  event.step = step_;
  events_.push_back(event);
}

void Timeline::add_span(const char* name, const char* category, Clock::time_point begin,
                        Clock::time_point end, int peer, std::uint64_t bytes) {
  add({.name = name,
       .category = category,
       .begin_ns = since_origin(begin),
       .duration_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count(),
       .peer = peer,
       .bytes = bytes});
}

void Timeline::add_counter(const char* name, double value) {
  if (!std::isfinite(value)) return;  // a diverged run's norms: not a sample
  add({.name = name,
       .category = "counter",
       .begin_ns = since_origin(Clock::now()),
       .duration_ns = -1,
       .value = value});
}

std::vector<TimelineEvent> Timeline::drain() {
  const std::lock_guard lock(mutex_);
  std::vector<TimelineEvent> out;
  out.swap(events_);
  events_.reserve(out.size());
  return out;
}

std::uint64_t Timeline::dropped() const {
  const std::lock_guard lock(mutex_);
  return dropped_;
}

Timeline* current_timeline() { return bound_timeline; }

BindTimeline::BindTimeline(Timeline* timeline) : previous_(bound_timeline) {
  bound_timeline = timeline;
}

BindTimeline::~BindTimeline() { bound_timeline = previous_; }

double TimedSpan::stop() {
  if (seconds_ >= 0.0) return seconds_;
  const Clock::time_point end = Clock::now();
  seconds_ = std::chrono::duration<double>(end - begin_).count();
  if (Timeline* timeline = bound_timeline) timeline->add_span(name_, category_, begin_, end);
  return seconds_;
}

void timeline_counter(const char* name, double value) {
  if (Timeline* timeline = bound_timeline) timeline->add_counter(name, value);
}

}  // namespace sparsecomm
