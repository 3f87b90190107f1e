#include "sparsecomm/core/timeline_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "sparsecomm/core/atomic_file.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {

namespace fs = std::filesystem;

fs::path timeline_part(const fs::path& trace, int rank) {
  return fs::path(trace.string() + ".parts") / fmt::format("rank-{}.jsonl", rank);
}

std::string trace_event_json(int rank, const TimelineEvent& event) {
  // Names and categories are the code's literals: no character to escape.
  const double ts_us = static_cast<double>(event.begin_ns) / 1e3;
  if (event.duration_ns < 0) {
    return fmt::format(
        R"({{"name":"{}","cat":"{}","ph":"C","ts":{:.3f},"pid":{},"tid":{},"args":{{"value":{}}}}})",
        event.name, event.category, ts_us, rank, event.thread, event.value);
  }
  std::string args = fmt::format(R"("step":{})", event.step);
  if (event.peer >= 0) args += fmt::format(R"(,"peer":{})", event.peer);
  if (event.bytes > 0) args += fmt::format(R"(,"bytes":{})", event.bytes);
  return fmt::format(
      R"({{"name":"{}","cat":"{}","ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":{},"args":{{{}}}}})",
      event.name, event.category, ts_us, static_cast<double>(event.duration_ns) / 1e3, rank,
      event.thread, args);
}

TimelineRecorder::TimelineRecorder(const fs::path& trace, int rank)
    : trace_(trace), part_(timeline_part(trace, rank)), events_(rank, Clock::now()) {
  std::error_code ignored;
  fs::create_directories(part_.parent_path(), ignored);
  out_.open(part_, std::ios::trunc);
  if (!out_) {
    throw Error(
        fmt::format("[timeline] cannot create {}: {}", part_.string(), std::strerror(errno)));
  }
}

void TimelineRecorder::end_step() {
  for (const TimelineEvent& event : events_.drain()) {
    out_ << trace_event_json(events_.rank(), event) << '\n';
  }
  out_.flush();
  if (!out_) {
    throw Error(
        fmt::format("[timeline] cannot append to {}: {}", part_.string(), std::strerror(errno)));
  }
}

std::vector<int> TimelineRecorder::merge(int world) {
  out_.close();
  if (events_.rank() != 0) return {};
  return merge_trace_parts(trace_, world);
}

std::vector<int> merge_trace_parts(const fs::path& trace, int ranks) {
  std::ostringstream json;
  json << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  const auto put = [&](const std::string& line) {
    json << (first ? "" : ",\n") << line;
    first = false;
  };
  std::vector<int> missing;
  std::vector<fs::path> merged;
  for (int rank = 0; rank < ranks; ++rank) {
    put(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"rank {}"}}}})",
                    rank, rank));
    put(fmt::format(
        R"({{"name":"process_sort_index","ph":"M","pid":{},"args":{{"sort_index":{}}}}})", rank,
        rank));
    const fs::path part = timeline_part(trace, rank);
    std::ifstream in(part);
    if (!in) {
      missing.push_back(rank);
      continue;
    }
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) put(line);
    }
    merged.push_back(part);
  }
  json << "\n]}\n";
  atomic_write(trace, json.str());
  if (missing.empty()) {  // else kept, to merge again once the others are copied in
    std::error_code ignored;
    for (const fs::path& part : merged) fs::remove(part, ignored);
    fs::remove(fs::path(trace.string() + ".parts"), ignored);
  }
  return missing;
}

}  // namespace sparsecomm
