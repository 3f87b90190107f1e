#pragma once
// PNG plots of one or more runs, drawn by gnuplot (Debian: gnuplot-nox).
// Next to the PNGs, out_dir receives the data (run<i>_steps.dat,
// run<i>_evals.dat, breakdown.dat) and the script plots.gp, so the plots can
// be tuned and redrawn by hand: `cd OUT && gnuplot plots.gp`. gnuplot's
// output goes to gnuplot.log there.

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/report/run_files.h"

namespace sparsecomm::report {

struct PlotOptions {
  std::string gnuplot = "gnuplot";  // program to run: a name looked up in PATH, or a path
  int width = 1000, height = 600;   // pixels per PNG
};

// A gnuplot script drawing PNGs into one directory, with its data files:
// the one mechanism behind every plot the tool draws (the run plots below,
// `sparsecomm plan`'s curves). The directory keeps plots.gp and the data,
// so a plot can be tuned and redrawn by hand, and gnuplot's output in
// gnuplot.log.
class GnuplotFigures {
 public:
  // Throws Error when gnuplot is not installed (saying how to install it)
  // or out_dir cannot be created. `written_by` goes in the script's header.
  GnuplotFigures(std::filesystem::path out_dir, std::string_view written_by,
                 const PlotOptions& options = {});

  // Writes a data file into the directory.
  void write_data(const std::string& name, const std::string& text) const;
  // Starts the next PNG: reset, its output file, the common settings.
  void begin_png(const std::string& name);
  // Appends settings to the current PNG's script.
  GnuplotFigures& operator+=(std::string_view text);
  // One `plot` command of comma-separated items.
  void plot(const std::vector<std::string>& items);
  // Writes plots.gp, runs gnuplot and checks that every PNG begun was
  // written; returns them. Error with the tail of gnuplot's output if not.
  std::vector<std::filesystem::path> draw();

 private:
  std::filesystem::path out_dir_;
  std::string gnuplot_;
  std::string script_;
  std::vector<std::filesystem::path> pngs_;
};

// Writes, into out_dir (created if missing), whichever of these the runs
// have data for:
//   accuracy_vs_time.png   test accuracy (%) against wall time
//   accuracy_vs_epoch.png  test accuracy (%) against epoch
//   density_ratio.png      K/k per step, its 20-step rolling mean, and 1.0
//   time_breakdown.png     compute/selection/exchange/update seconds per run
//   bytes_per_step.png     KiB sent per rank per step (log scale; the click
//                          model's tables included)
//   embedding_rows.png     the click model: rows touched by rank 0 and their
//                          union over ranks, per step
//   overlap.png            pipelined runs: communication hidden under backward
// One line per run, labelled as run_labels() does; comparing several runs,
// the accuracy plots zoom on the end of training and draw the first run's
// final accuracy as a dashed line. Returns the PNGs written.
// Throws Error when gnuplot is not installed (saying how to install it) or
// fails (with the tail of its output), InvalidArgument for an empty `runs`.
std::vector<std::filesystem::path> write_plots(std::span<const RunData> runs,
                                               const std::filesystem::path& out_dir,
                                               const PlotOptions& options = {});

}  // namespace sparsecomm::report
