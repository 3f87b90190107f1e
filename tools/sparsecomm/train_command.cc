#include "train_command.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "auto_density.h"
#include "cli_util.h"
#include "console_reporter.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/stop_request.h"
#include "sparsecomm/report/compare_table.h"
#include "sparsecomm/report/plots.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/train/compare.h"
#include "sparsecomm/train/train_config.h"
#include "sparsecomm/train/trainer.h"
#include "train_flags.h"

namespace sparsecomm::cli {
namespace {

namespace fs = std::filesystem;

// Trains; a run that stopped on a signal ends the command with
// kStoppedExitStatus (on every process) after saying how to resume.
void run_one(const TrainConfig& config, const std::string& resume) {
  // Parameter-server runs write no checkpoints yet: a signal ends them at once.
  if (!ps_mode(config)) install_stop_signal_handlers();
  const std::unique_ptr<TrainObserver> reporter = make_console_reporter(config.method);
  const nlohmann::json summary = run_training(config, reporter.get(), resume);
  if (summary.contains("run_dir")) {  // rank 0
    const report::RunData run = report::load_run(summary.at("run_dir").get<std::string>());
    fmt::print("\n{}\n", report::format_run_summary(run));
  }
  if (!summary.contains("stopped")) return;
  if (summary.at("stopped").is_object()) {
    const nlohmann::json& stop = summary.at("stopped");
    fmt::print("stopped by {} after step {} of {}; checkpoint {}\nresume with: {}\n",
               stop.at("reason").get<std::string>(), stop.at("step").get<std::int64_t>(),
               stop.at("total_steps").get<std::int64_t>(), stop.at("checkpoint").get<std::string>(),
               stop.at("resume").get<std::string>());
  }
  throw CLI::RuntimeError(kStoppedExitStatus);
}

// Runs the comparison, prints its table and plots; a failed run is shown in
// the table and, after it, ends the command with an error (exit code 1).
void run_compare(const TrainConfig& base, const std::vector<std::string>& items) {
  const fs::path root = base.out.empty() ? fs::path("runs") / "compare" : fs::path(base.out);
  std::vector<CompareRun> runs;
  for (const std::string& item : items) {
    runs.push_back(compare_item(base, item));
    runs.back().config.out = (root / runs.back().label).string();
  }
  const CompareResult result =
      run_comparison(runs, [](const std::string& label) -> std::unique_ptr<TrainObserver> {
        return make_console_reporter(label);
      });
  if (!result.rank0) return;
  std::vector<report::RunData> loaded;
  for (const fs::path& dir : result.dirs) {
    try {
      loaded.push_back(report::load_run(dir));
    } catch (const InvalidArgument&) {
      // A run that failed before it wrote anything: only in result.failed.
    }
  }
  fmt::print("\n{}\n", report::format_comparison_table(loaded));
  if (base.plots && !loaded.empty()) {
    for (const fs::path& file : report::write_plots(loaded, root / "plots")) {
      fmt::print("  plot: {}\n", file.string());
    }
  }
  if (!result.failed.empty()) {
    std::string list;
    for (const std::string& failure : result.failed) list += "\n  " + failure;
    throw Error(
        fmt::format("{} of {} compared runs failed:{}", result.failed.size(), runs.size(), list));
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Data-parallel training of a LibTorch model on Fashion-MNIST (or fortune text: "
      "--model char-lstm --dataset fortunes) with a chosen gradient "
      "synchronization, or through parameter servers (--servers, --sync). With no arguments: 4 "
      "ranks as threads, the CNN, ExDyna at density 1%, 5 epochs.");
  add_train_flags(cmd, *flags);

  cmd->callback([flags, cmd] {
    flags->auto_density.requested = flags->density == "auto";
    check_auto_density_flags(flags->auto_density);
    TrainConfig config = config_from_flags(*flags, *cmd);
    if (flags->auto_density.requested || config.method == "auto") {
      if (!flags->compare.empty()) {
        throw InvalidArgument(
            "--density auto chooses one method's density; with --compare give a number");
      }
      choose_auto_configuration(config, flags->auto_density);
    }
    if (!flags->compare.empty()) {
      if (!flags->resume.empty())
        throw InvalidArgument("--compare and --resume exclude each other");
      const std::vector<std::string> methods = split_list(flags->compare, "--compare");
      for (const std::string& method : methods) {
        try {
          validate(compare_item(config, method).config);
        } catch (const InvalidArgument& e) {
          throw InvalidArgument(fmt::format("--compare item '{}': {}", method, e.what()));
        }
      }
      run_compare(config, methods);
      return;
    }
    run_one(config, flags->resume);
  });
}

void add_methods_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "methods", "List the synchronization methods and their options (--method-option key=value)");
  cmd->callback([] {
    for (const SyncMethodInfo& info : sync_methods()) {
      fmt::print("{}\n  {}\n", info.name, info.summary);
      for (const OptionSpec& option : info.options) {
        fmt::print("    {:<18} default {:<10} {}\n", option.name, option.default_value,
                   option.help);
      }
    }
  });
}

}  // namespace sparsecomm::cli
