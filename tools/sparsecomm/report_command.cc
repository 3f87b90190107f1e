#include "report_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"
#include "sparsecomm/core/timeline_file.h"
#include "sparsecomm/report/compare_table.h"
#include "sparsecomm/report/plots.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/report/timeline_summary.h"

namespace sparsecomm::cli {
// Named so that the tool's sources can compile as one unit (UNITY_BUILD).
namespace report_impl {
namespace {

namespace fs = std::filesystem;

struct Options {
  std::vector<std::string> dirs;
  std::string out;
  bool no_plots = false;
  double target_drop = 0.0;  // points below the first run's final accuracy
  std::string format = "table";
  std::string timeline;  // --timeline FILE
};

// --timeline FILE: merges parts left beside it (other hosts' ranks copied
// back), then summarizes the trace.
void report_timeline(const Options& options) {
  const std::string& trace = options.timeline;
  const fs::path parts(trace + ".parts");
  if (fs::is_directory(parts)) {
    int ranks = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(parts)) {
      int rank = -1;
      if (std::sscanf(entry.path().filename().string().c_str(), "rank-%d.jsonl", &rank) == 1) {
        ranks = std::max(ranks, rank + 1);
      }
    }
    // Parts stay beside a trace that lacks ranks: merge again with the copies.
    if (ranks > 0) {
      const std::vector<int> missing = merge_trace_parts(trace, ranks);
      if (!missing.empty())
        logger().warn("{}: no part of ranks {}", trace, fmt::join(missing, ", "));
    }
  }
  std::ifstream in(trace);
  if (!in) throw InvalidArgument(fmt::format("[report] cannot read the timeline {}", trace));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("[report] {} is not JSON: {}", trace, e.what()));
  }
  fmt::print("{}", report::format_timeline_summary(report::summarize_timeline(json)));
  if (options.no_plots) return;
  const fs::path out = options.out.empty() ? fs::path(trace + ".plot") : fs::path(options.out);
  fmt::print("\nthe first steps drawn: {}\n", report::write_timeline_plot(json, out).string());
}

// Where plots go without --out: the run's own directory for one run, else
// "compare" beside the first run.
fs::path default_out(const std::vector<std::string>& dirs) {
  if (dirs.size() == 1) return dirs[0];
  fs::path first = fs::absolute(dirs[0]).lexically_normal();
  if (!first.has_filename()) first = first.parent_path();
  return first.parent_path() / "compare";
}

// --format json: every run as report::run_json gives it, one JSON array on
// stdout (the scripts' one way to read run directories: scripts/run_dirs.py).
void print_json(const Options& options) {
  nlohmann::json runs = nlohmann::json::array();
  for (const std::string& dir : options.dirs) {
    runs.push_back(report::run_json(dir));
  }
  fmt::print("{}\n", runs.dump());
}

void run(const Options& options) {
  if (!options.timeline.empty()) return report_timeline(options);
  if (options.dirs.empty()) {
    throw InvalidArgument("report needs run directories (DIR...) or --timeline FILE");
  }
  if (options.format == "json") return print_json(options);
  std::vector<report::RunData> runs;
  for (const std::string& dir : options.dirs) runs.push_back(report::load_run(dir));
  for (const report::RunData& run : runs) {
    for (const std::string& warning : run.warnings) {
      logger().warn("{}", warning);
    }
  }
  if (runs.size() == 1) fmt::print("{}\n", report::format_run_summary(runs[0]));
  fmt::print("{}", report::format_comparison_table(runs, options.target_drop));
  if (options.no_plots) return;
  const fs::path out = options.out.empty() ? default_out(options.dirs) : fs::path(options.out);
  const std::vector<fs::path> pngs = report::write_plots(runs, out);
  fmt::print("\nplots in {}:\n", out.string());
  for (const fs::path& png : pngs) fmt::print("  {}\n", png.filename().string());
  fmt::print("data and gnuplot script beside them (redraw: cd '{}' && gnuplot plots.gp)\n",
             out.string());
}

}  // namespace
}  // namespace report_impl

void add_report_command(CLI::App& app) {
  using namespace report_impl;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Summarize and compare runs written by `sparsecomm train --out DIR`: a comparison table "
      "on stdout and PNG plots (gnuplot) of test accuracy against wall time and epoch, the "
      "density ratio K/k per step, the time breakdown and the bytes per rank per step");
  // Either run directories or one trace.
  CLI::Option* dirs = cmd->add_option("DIR", options->dirs,
                                      "run directories (config.json, metrics.jsonl, summary.json)");
  cmd->add_option("--timeline", options->timeline,
                  "summarize a trace of train --timeline or the hook's timeline= instead: time "
                  "per span and rank, waits and the peer waited on most, the rank that computed "
                  "longest, the exchanges' overlap with compute (merges parts left beside it), and "
                  "a PNG of the first steps into --out (default: FILE.plot)")
      ->excludes(dirs);
  cmd->add_option("--out,-o", options->out,
                  "directory for the plots, their .dat files and plots.gp (default: the run's "
                  "own directory for one run, <parent of the first run>/compare for several)");
  cmd->add_option("--target-drop", options->target_drop,
                  "the \"s to X%\" column's target: the first run's final test accuracy less "
                  "this many percentage points (e.g. 0.5: one baseline run is a noisy target)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--no-plots", options->no_plots, "print the table only (no gnuplot needed)");
  cmd->add_option("--format", options->format,
                  "table: the comparison table and plots; json: each run's config, summary, "
                  "warnings and records as one JSON array on stdout (no plots)")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  cmd->callback([options] { run(*options); });
}

}  // namespace sparsecomm::cli
