#pragma once
// The options of `sparsecomm bench sparsifiers` (bench_sparsifiers.cc) and
// which steps they warm up on and time, shared by its probes
// (bench_sparsifiers_probe.h) and its report (bench_sparsifiers_report.h).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsecomm::cli {

struct SparsifierBenchOptions {
  std::size_t numel = 25'000'000;
  double density = 0.001;
  int workers = 8;
  int steps = 100;
  int warmup_steps = -1;  // -1: 20% of the steps, at least 10 when steps >= 50
  int time_every = 10;    // timing on every time_every-th step after the warm-up
  int reps = 5;
  std::string schemes;            // empty: every registered scheme
  std::vector<std::string> opts;  // key=value, passed to every scheme
  std::string trace;              // empty: the synthetic stream
  std::uint64_t seed = 1;
  double drift = 10.0;  // synthetic stream: overall scale falls drift x over the run
  double skew = 1.5;    // synthetic stream: regional skew
  double tail = 1.0;    // synthetic stream: heavy-tail strength
  double epoch = 100.0;
  std::string format = "table";
  bool no_torch = false;
  // Which options were given on the command line (a trace supplies the rest).
  bool numel_given = false, workers_given = false, steps_given = false;
  bool synthetic_given = false;      // any of --drift, --skew, --tail
  std::string source;                // the stream's describe(), once resolved
  double exchange_budget_gib = 0.0;  // memory the exchange may use (0: unchecked)
};

// The default warm-up: 20% of the steps, at least 10 when steps >= 50.
inline int default_warmup(int steps) {
  const int fifth = steps / 5;
  return steps >= 50 ? std::max(fifth, 10) : fifth;
}

// The first step whose selection is timed: step 0 is the schemes' set-up
// (first use of their scratch, initial thresholds from an all-reduced
// histogram) and is never timed, even without a warm-up.
inline int first_timed_step(const SparsifierBenchOptions& options) {
  return std::max(options.warmup_steps, 1);
}

// Selection is timed on every time_every-th step from first_timed_step (the
// other steps run, and are verified and counted, but are not re-run alone).
inline bool timed_step(const SparsifierBenchOptions& options, std::int64_t step) {
  const std::int64_t first = first_timed_step(options);
  return step >= first && (step - first) % options.time_every == 0;
}

}  // namespace sparsecomm::cli
