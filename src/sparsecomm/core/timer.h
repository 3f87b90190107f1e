#pragma once
// Monotonic wall-clock stopwatch for per-phase timings, and thread CPU time.

#include <chrono>

#include <time.h>

namespace sparsecomm {

using Clock = std::chrono::steady_clock;

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void restart() { start_ = Clock::now(); }
  // Seconds since construction or the last restart().
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  Clock::time_point start_;
};

// CPU time the calling thread has used, in seconds (what it computed, not
// the time it waited for a core).
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace sparsecomm
