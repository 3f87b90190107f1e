#include "sparsecomm/report/timeline_summary.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/report/plots.h"

namespace sparsecomm::report {
namespace {

struct Interval {
  double begin;
  double end;
};

// Seconds of `a` covered by the union of `covering` (sorted by begin).
double covered(const Interval& a, const std::vector<Interval>& covering) {
  double total = 0.0;
  double reach = a.begin;
  for (const Interval& c : covering) {
    if (c.end <= reach) continue;
    if (c.begin >= a.end) break;
    const double from = std::max(reach, c.begin);
    const double to = std::min(a.end, c.end);
    if (to > from) total += to - from;
    reach = std::max(reach, to);
  }
  return total;
}

bool is_compute(const std::string& name) { return name == "compute" || name == "buckets ready"; }

}  // namespace

TimelineSummary summarize_timeline(const nlohmann::json& trace) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    throw InvalidArgument("[report] not a trace of sparsecomm's --timeline: no traceEvents array");
  }
  std::map<int, TimelineRank> ranks;
  std::map<int, std::map<int, double>> waits;  // rank -> peer -> seconds
  // rank -> thread -> compute intervals; rank -> (thread, exchange interval)
  std::map<int, std::map<int, std::vector<Interval>>> compute;
  std::map<int, std::vector<std::pair<int, Interval>>> exchanges;
  std::map<std::int64_t, std::map<int, double>> compute_per_step;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    if (!e.contains("pid") || !e.contains("ts") || !e.contains("dur") || !e.contains("name")) {
      throw InvalidArgument(
          fmt::format("[report] a span lacks pid, ts, dur or name: {}", e.dump().substr(0, 200)));
    }
    const int rank = e["pid"].get<int>();
    const int thread = e.value("tid", 0);
    const std::string name = e["name"].get<std::string>();
    const double begin = e["ts"].get<double>() / 1e6;
    const double seconds = e["dur"].get<double>() / 1e6;
    TimelineRank& r = ranks[rank];
    r.rank = rank;
    r.seconds[name] += seconds;
    const std::string category = e.value("cat", "");
    const nlohmann::json args = e.value("args", nlohmann::json::object());
    if (category == "wait") {
      r.wait_s += seconds;
      if (args.contains("peer")) waits[rank][args["peer"].get<int>()] += seconds;
    }
    if (is_compute(name)) {
      compute[rank][thread].push_back({begin, begin + seconds});
      if (args.contains("step"))
        compute_per_step[args["step"].get<std::int64_t>()][rank] += seconds;
    }
    if (category == "sync") exchanges[rank].push_back({thread, {begin, begin + seconds}});
  }
  TimelineSummary out;
  for (auto& [rank, r] : ranks) {
    for (const auto& [peer, seconds] : waits[rank]) {
      if (seconds > r.waited_most_s) {
        r.waited_most_s = seconds;
        r.waited_most_on = peer;
      }
    }
  }
  for (const auto& [step, per_rank] : compute_per_step) {
    if (per_rank.size() != ranks.size()) continue;
    ++out.steps;
    const auto slowest =
        std::max_element(per_rank.begin(), per_rank.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    ++out.slowest_steps[slowest->first];
  }
  double exchange_s = 0.0;
  double overlapped_s = 0.0;
  for (auto& [rank, spans] : exchanges) {
    for (auto& [thread, intervals] : compute[rank]) {
      std::sort(intervals.begin(), intervals.end(),
                [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
    }
    double rank_exchange_s = 0.0;
    double rank_overlapped_s = 0.0;
    for (const auto& [thread, span] : spans) {
      rank_exchange_s += span.end - span.begin;
      for (const auto& [other, intervals] : compute[rank]) {
        if (other != thread) rank_overlapped_s += covered(span, intervals);
      }
    }
    ranks[rank].overlap_fraction =
        rank_exchange_s > 0.0 ? rank_overlapped_s / rank_exchange_s : 0.0;
    exchange_s += rank_exchange_s;
    overlapped_s += rank_overlapped_s;
  }
  out.overlap_fraction = exchange_s > 0.0 ? overlapped_s / exchange_s : 0.0;
  for (const auto& [rank, r] : ranks) out.ranks.push_back(r);
  return out;
}

std::string format_timeline_summary(const TimelineSummary& summary) {
  std::string out =
      "rank  top spans (seconds)                                        waits     overlap  waited "
      "most on\n";
  for (const TimelineRank& r : summary.ranks) {
    std::vector<std::pair<std::string, double>> spans(r.seconds.begin(), r.seconds.end());
    std::sort(spans.begin(), spans.end(),
              [](const auto& a, const auto& b) { return a.second > b.second; });
    std::string top;
    for (std::size_t i = 0; i < std::min<std::size_t>(4, spans.size()); ++i) {
      top += fmt::format("{}{} {:.3f}", i == 0 ? "" : ", ", spans[i].first, spans[i].second);
    }
    out += fmt::format("{:>4}  {:<58} {:>7.3f} s  {:>6.1f}%  {}\n", r.rank, top, r.wait_s,
                       100.0 * r.overlap_fraction,
                       r.waited_most_on < 0
                           ? std::string("-")
                           : fmt::format("rank {} ({:.3f} s)", r.waited_most_on, r.waited_most_s));
  }
  out += fmt::format("\nsteps with compute on every rank: {}; the rank that computed longest:",
                     summary.steps);
  const char* separator = " ";
  for (const auto& [rank, steps] : summary.slowest_steps) {
    out += fmt::format("{}rank {} in {}", separator, rank, steps);
    separator = ", ";
  }
  out += fmt::format("\noverlap: {:.1f}% of the exchanges ran while the rank computed\n",
                     100.0 * summary.overlap_fraction);
  return out;
}

std::filesystem::path write_timeline_plot(const nlohmann::json& trace,
                                          const std::filesystem::path& out_dir, int steps) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    throw InvalidArgument("[report] not a trace of sparsecomm's --timeline: no traceEvents array");
  }
  // The categories drawn, bottom to top, with their colors.
  const std::vector<std::pair<std::string, std::string>> categories = {
      {"compute", "#4477aa"},  {"sync", "#bbbbbb"}, {"selection", "#ee7733"},
      {"exchange", "#228833"}, {"wait", "#cc3311"}, {"update", "#aa3377"}};
  std::int64_t first_step = -1;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X" || !e.contains("args")) continue;
    const std::int64_t step = e["args"].value("step", std::int64_t{-1});
    if (step >= 0 && (first_step < 0 || step < first_step)) first_step = step;
  }
  if (first_step < 0) throw InvalidArgument("[report] the trace has no span of a step to draw");
  std::map<std::pair<int, int>, int> lanes;  // (rank, thread) -> lane
  std::map<std::string, std::string> rows;   // category -> data rows
  double origin = -1.0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X" || !e.contains("args")) continue;
    const std::int64_t step = e["args"].value("step", std::int64_t{-1});
    if (step < first_step || step >= first_step + steps) continue;
    const double ts = e.at("ts").get<double>();
    if (origin < 0 || ts < origin) origin = ts;
    lanes.emplace(std::pair{e.at("pid").get<int>(), e.value("tid", 0)}, 0);
  }
  int lane = 0;
  for (auto& [key, index] : lanes) index = lane++;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X" || !e.contains("args")) continue;
    const std::int64_t step = e["args"].value("step", std::int64_t{-1});
    if (step < first_step || step >= first_step + steps) continue;
    const std::string category = e.value("cat", "");
    const double begin = (e.at("ts").get<double>() - origin) / 1e3;  // ms
    const double end = begin + e.at("dur").get<double>() / 1e3;
    const int y = lanes.at({e.at("pid").get<int>(), e.value("tid", 0)});
    // Nested spans thinner than their parents, so both show.
    const double half = category == "sync" ? 0.42 : category == "wait" ? 0.15 : 0.35;
    rows[category] +=
        fmt::format("{} {} {} {} {} {}\n", (begin + end) / 2, y, begin, end, y - half, y + half);
  }
  GnuplotFigures figures(out_dir, "sparsecomm report --timeline");
  // A rank's first thread is its training thread; the others are named by their id.
  std::string ytics;
  int previous_rank = -1;
  for (const auto& [key, index] : lanes) {
    const std::string label = key.first == previous_rank
                                  ? fmt::format("rank {} thread {}", key.first, key.second)
                                  : fmt::format("rank {}", key.first);
    ytics += fmt::format("{}'{}' {}", ytics.empty() ? "" : ", ", label, index);
    previous_rank = key.first;
  }
  figures.begin_png("timeline.png");
  figures += fmt::format(
      "set title 'steps {} to {}: one lane per rank and thread'\nset xlabel 'ms'\n"
      "set ytics ({})\nset yrange [-0.6:{}]\nset key outside right\nset style fill solid 0.9\n",
      first_step, first_step + steps - 1, ytics, lane - 0.4);
  std::vector<std::string> items;
  for (const auto& [category, colour] : categories) {
    if (!rows.contains(category)) continue;
    figures.write_data("timeline_" + category + ".dat", rows[category]);
    items.push_back(
        fmt::format("'timeline_{}.dat' using 1:2:3:4:5:6 with boxxyerror lc rgb '{}' "
                    "title '{}'",
                    category, colour, category));
  }
  figures.plot(items);
  return figures.draw().front();
}

}  // namespace sparsecomm::report
