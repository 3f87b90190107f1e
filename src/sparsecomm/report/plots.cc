#include "sparsecomm/report/plots.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm::report {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kRollingWindow = 20;
constexpr const char* kColors[] = {"1f77b4", "d62728", "2ca02c", "ff7f0e",
                                   "9467bd", "8c564b", "e377c2", "17becf"};
constexpr const char* kScript = "plots.gp";
constexpr const char* kLog = "gnuplot.log";

std::string color(std::size_t i, const char* alpha = "00") {  // gnuplot: #AARRGGBB, 00 = opaque
  return fmt::format("#{}{}", alpha, kColors[i % std::size(kColors)]);
}

// A number for a gnuplot data file; NaN/inf become "NaN" (a missing point).
std::string num(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "NaN"; }

// The text of a gnuplot single-quoted string ('' is a literal quote).
std::string gp_quote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\n') c = ' ';
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    throw Error(fmt::format("[report] cannot write {}: {}", path.string(), std::strerror(errno)));
  }
}

bool any_finite(std::span<const StepRecord> steps, double StepRecord::*field, bool positive) {
  return std::any_of(steps.begin(), steps.end(), [&](const StepRecord& r) {
    return std::isfinite(r.*field) && (!positive || r.*field > 0);
  });
}

bool any_accuracy(std::span<const EvalRecord> evals, double EvalRecord::*x) {
  return std::any_of(evals.begin(), evals.end(), [&](const EvalRecord& r) {
    return std::isfinite(r.*x) && std::isfinite(r.test_accuracy);
  });
}

// Where a comparison's accuracy axis starts: a point below the lowest
// accuracy any run has halfway through its evaluations, so the end of
// training, where runs differ by tenths of a point, fills the plot; NaN
// (gnuplot chooses) when no run has evaluations.
double accuracy_axis_floor(std::span<const RunData> runs) {
  double floor = NAN;
  for (const RunData& run : runs) {
    std::vector<double> accuracies;
    for (const EvalRecord& e : run.evals) {
      if (std::isfinite(e.test_accuracy)) accuracies.push_back(100.0 * e.test_accuracy);
    }
    if (accuracies.empty()) continue;
    const double halfway = accuracies[accuracies.size() / 2];
    floor = std::isnan(floor) ? halfway : std::min(floor, halfway);
  }
  return std::isnan(floor) ? floor : std::floor(floor - 1.0);
}

// The mean of the finite values among the last kRollingWindow added.
class RollingMean {
 public:
  double add(double value) {
    if (std::isfinite(value)) {
      window_.push_back(value);
      sum_ += value;
      if (window_.size() > kRollingWindow) {
        sum_ -= window_.front();
        window_.erase(window_.begin());
      }
    }
    return window_.empty() ? NAN : sum_ / static_cast<double>(window_.size());
  }

 private:
  std::vector<double> window_;
  double sum_ = 0;
};

// A pipelined step's overlap: the share of selection + exchange done while
// backward ran (NaN when the step has no such record or no communication).
double overlap_of(const StepRecord& r) {
  const double communication = r.selection_s + r.exchange_s;
  return std::isfinite(r.overlapped_s) && communication > 0 ? r.overlapped_s / communication : NAN;
}

// run<i>_steps.dat: step epoch wall_s density_ratio rolling_mean bytes_sent bytes_received
// overlap overlap_rolling_mean table_bytes_sent table_touched_rows table_union_rows (the
// click model's tables; bytes_sent includes table_bytes_sent)
std::string steps_data(const RunData& run, const std::string& label) {
  std::string out = fmt::format(
      "# {}: step records of {}\n# step epoch wall_s density_ratio density_ratio_mean{} "
      "bytes_sent bytes_received overlap overlap_mean{} table_bytes_sent table_touched_rows "
      "table_union_rows\n",
      label, run.dir.string(), kRollingWindow, kRollingWindow);
  RollingMean density;
  RollingMean overlap;
  for (const StepRecord& r : run.steps) {
    const double density_mean = density.add(r.density_ratio);
    const double step_overlap = overlap_of(r);
    const double overlap_mean = overlap.add(step_overlap);
    fmt::format_to(std::back_inserter(out), "{} {} {} {} {} {} {} {} {} {} {} {}\n", r.step,
                   num(r.epoch), num(r.wall_s), num(r.density_ratio), num(density_mean),
                   num(r.bytes_sent + r.embedding_bytes_sent), num(r.bytes_received),
                   num(step_overlap), num(overlap_mean), num(r.embedding_bytes_sent),
                   num(r.embedding_touched_rows), num(r.embedding_union_rows));
  }
  return out;
}

// run<i>_evals.dat: step epoch wall_s test_accuracy_percent test_loss train_loss
std::string evals_data(const RunData& run, const std::string& label) {
  std::string out = fmt::format(
      "# {}: eval records of {}\n# step epoch wall_s test_accuracy_percent test_loss "
      "train_loss\n",
      label, run.dir.string());
  for (const EvalRecord& r : run.evals) {
    fmt::format_to(std::back_inserter(out), "{} {} {} {} {} {}\n", r.step, num(r.epoch),
                   num(r.wall_s), num(100.0 * r.test_accuracy), num(r.test_loss),
                   num(r.train_loss));
  }
  return out;
}

// breakdown.dat: "label" compute selection exchange update (seconds; unknown = 0)
std::string breakdown_data(std::span<const RunData> runs, const std::vector<std::string>& labels) {
  std::string out = "# run compute_s selection_s exchange_s update_s\n";
  const auto zero_if_unknown = [](double v) { return std::isfinite(v) ? v : 0.0; };
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::string label = labels[i];
    std::replace(label.begin(), label.end(), '"', '\'');
    const TimeBreakdown& t = runs[i].summary.time_breakdown_s;
    fmt::format_to(std::back_inserter(out), "\"{}\" {} {} {} {}\n", label,
                   zero_if_unknown(t.compute), zero_if_unknown(t.selection),
                   zero_if_unknown(t.exchange), zero_if_unknown(t.update));
  }
  return out;
}

// "" when `program` cannot be run; else its path.
std::string find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return ::access(program.c_str(), X_OK) == 0 ? program : std::string();
  }
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const std::size_t colon = dirs.find(':');
    const std::string_view dir = dirs.substr(0, colon);
    const fs::path candidate = fs::path(dir.empty() ? "." : std::string(dir)) / program;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) {
      return candidate.string();
    }
    if (colon == std::string_view::npos) return {};
    dirs.remove_prefix(colon + 1);
  }
}

// Runs `args` (args[0] a path) in `cwd` with stdout and stderr to `log`;
// returns the wait status. No shell, so paths need no quoting.
int run_program(const std::vector<std::string>& args, const fs::path& cwd, const fs::path& log) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string cwd_text = cwd.string(), log_text = log.string();
  const pid_t pid = ::fork();
  if (pid < 0)
    throw Error(fmt::format("[report] cannot start {}: {}", args[0], std::strerror(errno)));
  if (pid == 0) {  // child: async-signal-safe calls only
    const int fd = ::open(log_text.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) ::_exit(126);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    if (!cwd_text.empty() && ::chdir(cwd_text.c_str()) != 0) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR)
      throw Error(fmt::format("[report] waiting for {}: {}", args[0], std::strerror(errno)));
  }
  return status;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("wait status {}", status);
}

std::string tail_of(const fs::path& path, std::size_t max_chars) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  std::string s = std::move(text).str();
  if (s.size() > max_chars) s = "..." + s.substr(s.size() - max_chars);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The settings every plot starts from (after `reset`).
std::string common_settings(const std::string& png) {
  return fmt::format(
      "reset\nset output {}\nset datafile missing 'NaN'\nset grid lc rgb '#d0d0d0'\n"
      "set border lw 1.2\nset key box opaque\nset title font ',13'\n",
      gp_quote(png));
}

}  // namespace

GnuplotFigures::GnuplotFigures(fs::path out_dir, std::string_view written_by,
                               const PlotOptions& options)
    : out_dir_(std::move(out_dir)), gnuplot_(find_program(options.gnuplot)) {
  if (gnuplot_.empty()) {
    throw Error(
        fmt::format("[report] gnuplot ('{}') is not installed or not in PATH: install it with "
                    "`apt-get install gnuplot-nox` (the setup script installs it)",
                    options.gnuplot));
  }
  std::error_code error;
  fs::create_directories(out_dir_, error);
  if (error) {
    throw Error(fmt::format("[report] cannot create {}: {}", out_dir_.string(), error.message()));
  }
  // pngcairo draws smoother lines and text; plain png is the fallback.
  const bool cairo =
      run_program({gnuplot_, "-e", "set terminal pngcairo"}, {}, out_dir_ / kLog) == 0;
  script_ = fmt::format(
      "# Written by {}. Redraw by hand with:\n"
      "#   cd <this directory> && gnuplot {}\n"
      "set terminal {} size {},{} {}\nset termoption noenhanced\n",
      written_by, kScript, cairo ? "pngcairo" : "png truecolor", options.width, options.height,
      cairo ? "font 'Sans,11'" : "");
}

void GnuplotFigures::write_data(const std::string& name, const std::string& text) const {
  write_text(out_dir_ / name, text);
}

void GnuplotFigures::begin_png(const std::string& name) {
  script_ += fmt::format("\n# --- {} ---\n", name);
  script_ += common_settings(name);
  pngs_.push_back(out_dir_ / name);
}

GnuplotFigures& GnuplotFigures::operator+=(std::string_view text) {
  script_ += text;
  return *this;
}

void GnuplotFigures::plot(const std::vector<std::string>& items) {
  script_ += "plot " + fmt::format("{}", fmt::join(items, ", \\\n     ")) + "\n";
}

std::vector<fs::path> GnuplotFigures::draw() {
  const fs::path log = out_dir_ / kLog;
  write_text(out_dir_ / kScript, script_ + "\nunset output\n");
  const int status = run_program({gnuplot_, kScript}, out_dir_, log);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error(fmt::format("[report] gnuplot failed ({}) on {}:\n{}", describe_status(status),
                            (out_dir_ / kScript).string(), tail_of(log, 2000)));
  }
  std::error_code error;
  for (const fs::path& png : pngs_) {
    if (!fs::is_regular_file(png, error) || fs::file_size(png, error) == 0) {
      throw Error(
          fmt::format("[report] gnuplot did not write {} (see {})", png.string(), log.string()));
    }
  }
  return pngs_;
}

namespace {

// The figures of write_plots, one method each, over the same runs.
struct RunPlots {
  RunPlots(std::span<const RunData> data, GnuplotFigures& out)
      : runs(data),
        figures(out),
        labels(run_labels(data)),
        single(data.size() == 1),
        about(single ? fmt::format(" - {} ({}, {} workers)", labels[0], data[0].summary.model,
                                   data[0].summary.workers)
                     : std::string()) {}

  void write_data() {
    for (std::size_t i = 0; i < runs.size(); ++i) {
      figures.write_data(fmt::format("run{}_steps.dat", i), steps_data(runs[i], labels[i]));
      figures.write_data(fmt::format("run{}_evals.dat", i), evals_data(runs[i], labels[i]));
    }
    figures.write_data("breakdown.dat", breakdown_data(runs, labels));
  }

  // Test accuracy against wall time and against epoch.
  void accuracy() {
    const double accuracy_floor = accuracy_axis_floor(runs);
    const auto accuracy_plot = [&](const char* png, double EvalRecord::*x, int column,
                                   const char* what, const char* xlabel) {
      std::vector<std::string> items;
      for (std::size_t i = 0; i < runs.size(); ++i) {
        if (!any_accuracy(runs[i].evals, x)) continue;
        items.push_back(
            fmt::format("'run{}_evals.dat' using {}:4 with linespoints lw 2 pt 7 ps 0.6 "
                        "lc rgb '{}' title {}",
                        i, column, color(i), gp_quote(single ? "test accuracy" : labels[i])));
      }
      if (items.empty()) return;
      begin_plot(png);
      figures += fmt::format("set title {}\nset xlabel {}\nset ylabel 'test accuracy (%)'\n",
                             gp_quote(fmt::format("Test accuracy vs {}{}", what, about)),
                             gp_quote(xlabel));
      figures += "set key bottom right\nset xrange [0:*]\n";
      // Comparisons: zoom on the end, and mark the first run's final accuracy
      // (the table's "s to X%" target).
      if (!single && std::isfinite(accuracy_floor)) {
        figures += fmt::format("set yrange [{}:*]\n", accuracy_floor);
        if (std::isfinite(runs[0].summary.test_accuracy)) {
          items.push_back(
              fmt::format("{} with lines dt 2 lw 1.5 lc rgb 'black' title {}",
                          100.0 * runs[0].summary.test_accuracy,
                          gp_quote(fmt::format("{}: final {:.2f}%", labels[0],
                                               100.0 * runs[0].summary.test_accuracy))));
        }
      }
      plot(items);
    };
    accuracy_plot("accuracy_vs_time.png", &EvalRecord::wall_s, 3, "wall time", "wall time (s)");
    accuracy_plot("accuracy_vs_epoch.png", &EvalRecord::epoch, 2, "epoch", "epoch");
  }

  // K/k per step (faint), its rolling mean (bold), and the target 1.0.
  void density_ratio() {
    std::vector<std::string> items;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (!any_finite(runs[i].steps, &StepRecord::density_ratio, false)) continue;
      add_per_step_and_mean(items, i, 4, "K/k per step");
    }
    if (!items.empty()) {
      items.push_back("1.0 with lines dt 2 lw 1.5 lc rgb 'black' title 'K/k = 1 (target density)'");
      begin_plot("density_ratio.png");
      figures += fmt::format(
          "set title {}\nset xlabel 'step'\nset ylabel 'density ratio K/k (union / target)'\n"
          "set key top right\n",
          gp_quote("Density ratio K/k per step" + about));
      plot(items);
    }
  }

  // Seconds per phase, one stacked bar per run.
  void time_breakdown() {
    const bool any_time = std::any_of(runs.begin(), runs.end(), [](const RunData& run) {
      const TimeBreakdown& t = run.summary.time_breakdown_s;
      return t.compute > 0 || t.selection > 0 || t.exchange > 0 || t.update > 0;  // NaN: false
    });
    if (any_time) {
      begin_plot("time_breakdown.png");
      figures += fmt::format(
          "set title {}\nset ylabel 'seconds (whole run)'\nset yrange [0:*]\n"
          "set style data histograms\nset style histogram rowstacked\n"
          "set style fill solid 0.85 border rgb 'black'\nset boxwidth 0.6\n"
          "set key outside right top\nset grid noxtics\n{}",
          gp_quote("Time breakdown" + about), runs.size() > 4 ? "set xtics rotate by -30\n" : "");
      plot({fmt::format("'breakdown.dat' using 2:xtic(1) title 'compute' lc rgb '{}'", color(0)),
            fmt::format("'' using 3 title 'selection' lc rgb '{}'", color(3)),
            fmt::format("'' using 4 title 'exchange' lc rgb '{}'", color(1)),
            fmt::format("'' using 5 title 'update' lc rgb '{}'", color(2))});
    }
  }

  // Bytes sent per rank per step, log scale.
  void bytes_per_step() {
    std::vector<std::string> items;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (!any_finite(runs[i].steps, &StepRecord::bytes_sent, true)) continue;
      items.push_back(
          fmt::format("'run{}_steps.dat' using 1:($6 > 0 ? $6 / 1024 : NaN) with lines lw 2 "
                      "lc rgb '{}' title {}",
                      i, color(i), gp_quote(single ? "bytes sent" : labels[i])));
    }
    if (!items.empty()) {
      begin_plot("bytes_per_step.png");
      figures += fmt::format(
          "set title {}\nset xlabel 'step'\nset ylabel 'KiB sent per rank per step (log scale)'\n"
          "set logscale y 10\nset key outside right top\n",
          gp_quote("Bytes per rank per step" + about));
      plot(items);
    }
  }

  // The click model's tables: rows touched per rank and their union per step.
  void embedding_rows() {
    std::vector<std::string> items;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const bool tables =
          std::any_of(runs[i].steps.begin(), runs[i].steps.end(),
                      [](const StepRecord& r) { return r.embedding_union_rows > 0; });
      if (!tables) continue;
      const std::string name = single ? "" : labels[i] + ": ";
      items.push_back(
          fmt::format("'run{}_steps.dat' using 1:11 with lines lw 1 lc rgb '{}' title {}", i,
                      color(i), gp_quote(name + "touched rows, rank 0")));
      items.push_back(
          fmt::format("'run{}_steps.dat' using 1:12 with lines lw 2 dt 2 lc rgb '{}' title {}", i,
                      color(single ? 1 : i), gp_quote(name + "union over ranks")));
    }
    if (!items.empty()) {
      begin_plot("embedding_rows.png");
      figures += fmt::format(
          "set title {}\nset xlabel 'step'\nset ylabel 'embedding rows per step'\n"
          "set key outside right top\n",
          gp_quote("Embedding rows exchanged" + about));
      plot(items);
    }
  }

  // Pipelining: the share of communication hidden under backward, per step.
  void overlap() {
    std::vector<std::string> items;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const bool pipelined = std::any_of(runs[i].steps.begin(), runs[i].steps.end(),
                                         [](const StepRecord& r) { return overlap_of(r) > 0; });
      if (!pipelined) continue;
      add_per_step_and_mean(items, i, 8, "per step");
    }
    if (!items.empty()) {
      begin_plot("overlap.png");
      figures += fmt::format(
          "set title {}\nset xlabel 'step'\n"
          "set ylabel 'overlap: communication hidden under backward'\nset yrange [0:1]\n"
          "set key bottom right\n",
          gp_quote("Overlap of synchronization with backward" + about));
      plot(items);
    }
  }

  void begin_plot(const char* png) { figures.begin_png(png); }
  void plot(const std::vector<std::string>& items) { figures.plot(items); }

  // Run i's per-step values in column `column` of its steps data (faint)
  // and their rolling mean in the next column (bold).
  void add_per_step_and_mean(std::vector<std::string>& items, std::size_t i, int column,
                             const char* per_step_title) const {
    items.push_back(fmt::format("'run{}_steps.dat' using 1:{} with lines lw 1 lc rgb '{}' {}", i,
                                column, color(i, "a0"),
                                single ? fmt::format("title '{}'", per_step_title) : "notitle"));
    items.push_back(fmt::format(
        "'run{}_steps.dat' using 1:{} with lines lw 2.5 lc rgb '{}' title {}", i, column + 1,
        color(i),
        gp_quote(single ? fmt::format("{}-step rolling mean", kRollingWindow)
                        : fmt::format("{} ({}-step mean)", labels[i], kRollingWindow))));
  }

  std::span<const RunData> runs;
  GnuplotFigures& figures;
  const std::vector<std::string> labels;
  const bool single;
  const std::string about;
};

}  // namespace

std::vector<fs::path> write_plots(std::span<const RunData> runs, const fs::path& out_dir,
                                  const PlotOptions& options) {
  if (runs.empty()) throw InvalidArgument("[report] write_plots: no runs given");
  GnuplotFigures figures(out_dir, fmt::format("`sparsecomm report` for {} run(s)", runs.size()),
                         options);
  RunPlots plots(runs, figures);
  plots.write_data();
  plots.accuracy();
  plots.density_ratio();
  plots.time_breakdown();
  plots.bytes_per_step();
  plots.embedding_rows();
  plots.overlap();
  return figures.draw();
}

}  // namespace sparsecomm::report
