#pragma once
// `sparsecomm report --timeline FILE` (docs/timeline.md): what a Chrome
// trace of train --timeline or the hook's timeline= says about where the
// steps' time went. Per rank: seconds per span name, the time blocked on
// peers and the peer waited on most; per step: the rank that computed
// longest (the one the others wait for); and the share of the exchanges
// that ran while the same rank computed (the hook's and pipelining's
// overlap).

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sparsecomm::report {

struct TimelineRank {
  int rank = 0;
  std::map<std::string, double> seconds;  // per span name, summed
  double wait_s = 0.0;                    // spans of category "wait"
  int waited_most_on = -1;                // the peer of the longest total wait, -1: none
  double waited_most_s = 0.0;
  double overlap_fraction = 0.0;  // as TimelineSummary's, of this rank alone
};

struct TimelineSummary {
  std::vector<TimelineRank> ranks;
  std::int64_t steps = 0;  // steps with compute on every rank
  // For each rank, the steps at which its compute ("compute" or "buckets
  // ready" spans) was the longest of all ranks.
  std::map<int, std::int64_t> slowest_steps;
  // Of the exchanges' seconds (category "sync": a pipelined bucket's
  // exchange, the hook's group exchange), the share that ran while the same
  // rank's compute ran on another thread; 0 with no such exchange.
  double overlap_fraction = 0.0;
};

// InvalidArgument when `trace` has no traceEvents array or an event lacks
// the fields its kind needs.
TimelineSummary summarize_timeline(const nlohmann::json& trace);
std::string format_timeline_summary(const TimelineSummary& summary);

// timeline.png in `out_dir` (with its data and plots.gp, report/plots.h): the
// first `steps` steps of the trace that have spans, one lane per rank and
// thread, a box per span of compute, selection, exchange, waits, update and
// the exchanges on threads of their own (nested spans drawn over their
// parents). Returns the PNG. Error when gnuplot is missing or fails;
// InvalidArgument for a trace without spans.
std::filesystem::path write_timeline_plot(const nlohmann::json& trace,
                                          const std::filesystem::path& out_dir, int steps = 3);

}  // namespace sparsecomm::report
