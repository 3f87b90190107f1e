#pragma once
// PNG plots of one or more runs, drawn by gnuplot (Debian: gnuplot-nox).
// Next to the PNGs, out_dir receives the data (run<i>_steps.dat,
// run<i>_evals.dat, breakdown.dat) and the script plots.gp, so the plots can
// be tuned and redrawn by hand: `cd OUT && gnuplot plots.gp`. gnuplot's
// output goes to gnuplot.log there.

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "sparsecomm/report/run_files.h"

namespace sparsecomm::report {

struct PlotOptions {
  std::string gnuplot = "gnuplot";  // program to run: a name looked up in PATH, or a path
  int width = 1000, height = 600;   // pixels per PNG
};

// Writes, into out_dir (created if missing), whichever of these the runs
// have data for:
//   accuracy_vs_time.png   test accuracy (%) against wall time
//   accuracy_vs_epoch.png  test accuracy (%) against epoch
//   density_ratio.png      K/k per step, its 20-step rolling mean, and 1.0
//   time_breakdown.png     compute/selection/exchange/update seconds per run
//   bytes_per_step.png     KiB sent per rank per step (log scale)
// One line per run, labelled as run_labels() does; comparing several runs,
// the accuracy plots zoom on the end of training and draw the first run's
// final accuracy as a dashed line. Returns the PNGs written.
// Throws Error when gnuplot is not installed (saying how to install it) or
// fails (with the tail of its output), InvalidArgument for an empty `runs`.
std::vector<std::filesystem::path> write_plots(std::span<const RunData> runs,
                                               const std::filesystem::path& out_dir,
                                               const PlotOptions& options = {});

}  // namespace sparsecomm::report
