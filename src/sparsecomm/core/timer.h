#pragma once
// Monotonic wall-clock stopwatch for per-phase timings.

#include <chrono>

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

}  // namespace sparsecomm
