#include "convergence_command.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/json_numbers.h"
#include "sparsecomm/core/log.h"
#include "sparsecomm/perf/convergence.h"
#include "sparsecomm/perf/step_model.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/train/train_config.h"

namespace sparsecomm::cli {
// Named so that the tool's sources can compile as one unit (UNITY_BUILD).
namespace convergence_impl {
namespace {

struct Options {
  std::vector<std::string> dirs;
  std::string out;
  bool describe = false;  // print each run's configuration, write no profile
};

// Settings every pilot run must share: they decide how many steps a target
// takes, whatever the synchronization.
const std::vector<std::string>& shared_keys() {
  static const std::vector<std::string> keys = {
      "model",         "dataset",      "workers",       "batch",         "optimizer", "lr",
      "lr_decay",      "lr_gamma",     "lr_milestones", "warmup_epochs", "momentum",  "nesterov",
      "weight_decay",  "beta1",        "beta2",         "adam_eps",      "max_steps", "epochs",
      "train_samples", "test_samples", "sync",          "servers"};
  return keys;
}

// Keys that describe how a run was carried out rather than what it trained
// (output, evaluation, threads, checkpoints): they may differ freely.
const std::set<std::string>& conduct_keys() {
  static const std::set<std::string> keys = {
      "seed",          "out",           "plots",         "eval_every",
      "eval_deferred", "threads",       "backend",       "checkpoint_every",
      "timeout_s",     "stop_at_step",  "data_dir",      "record_gradients",
      "record_steps",  "deterministic", "nonfinite",     "method",
      "density",       "local_steps",   "outer_overlap", "slowdown"};
  return keys;
}

// A config value as text: strings bare, other values as JSON ("-" when absent).
std::string setting_text(const nlohmann::json& config, const std::string& key) {
  const auto it = config.find(key);
  if (it == config.end()) return "-";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// The settings that set this run's synchronization apart beyond method,
// density and rounds: the method's options, every other key that is neither
// shared nor conduct and differs from train's default, and with local steps
// the outer step whatever its value ("outer_lr=1.0,outer_momentum=0.0,
// outer_nesterov=false"), so that a profile's labels keep their meaning when
// the defaults change.
std::string variant_of(const nlohmann::json& config) {
  const nlohmann::json defaults = to_json(TrainConfig{});
  const bool rounds = config.value("local_steps", std::int64_t{0}) > 0;
  const std::set<std::string> outer_keys = {"outer_lr", "outer_momentum", "outer_nesterov"};
  std::vector<std::string> parts;
  if (const auto options = config.find("method_options");
      options != config.end() && options->is_object()) {
    for (const auto& [key, value] : options->items()) {
      parts.push_back(fmt::format("{}={}", key, setting_text(*options, key)));
    }
  }
  for (const auto& [key, value] : config.items()) {
    if (key == "method_options" || conduct_keys().contains(key) ||
        std::find(shared_keys().begin(), shared_keys().end(), key) != shared_keys().end()) {
      continue;
    }
    if (outer_keys.contains(key)) {
      if (rounds) parts.push_back(fmt::format("{}={}", key, setting_text(config, key)));
      continue;
    }
    const auto fallback = defaults.find(key);
    if (fallback != defaults.end() && *fallback == value) continue;
    parts.push_back(fmt::format("{}={}", key, setting_text(config, key)));
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

perf::ConvergenceRun pilot_run(const report::RunData& data) {
  const std::string dir = data.dir.string();
  const nlohmann::json& config = data.config;
  if (data.failure) {
    // A run that stopped on a non-finite loss is a finding (it never
    // reaches the target); any other failure says nothing about the method.
    const bool nonfinite = data.failure->find("non-finite") != std::string::npos ||
                           data.failure->find("NaN") != std::string::npos;
    if (!nonfinite) {
      throw InvalidArgument(fmt::format(
          "{}: the run failed ({}); a profile takes finished runs and runs stopped by a "
          "non-finite loss",
          dir, *data.failure));
    }
    logger().warn(
        "{}: stopped on a non-finite loss; its configuration counts as not reaching "
        "any target after its last evaluation",
        dir);
  } else if (!data.summary_json) {
    throw InvalidArgument(fmt::format(
        "{}: has no summary.json (still running, or killed): its curve stops early and would "
        "read as a configuration that never reaches the target; let it finish or leave it out",
        dir));
  }
  if (config.value("sync", std::string()) != "" || config.value("model", std::string()) == "dlrm") {
    throw InvalidArgument(fmt::format(
        "{}: parameter-server and click-model runs are not profiled (plan predicts their step "
        "from other terms); profile all-reduce runs",
        dir));
  }
  if (data.evals.empty()) {
    throw InvalidArgument(fmt::format(
        "{}: has no evaluation; train the pilot runs with --eval-every N (a curve needs a few "
        "points, e.g. N = a tenth of the run)",
        dir));
  }
  perf::ConvergenceRun run;
  run.method = config.value("method", std::string());
  const auto& methods = perf::modeled_methods();
  if (std::find(methods.begin(), methods.end(), run.method) == methods.end()) {
    throw InvalidArgument(
        fmt::format("{}: method '{}' is not one the performance model predicts ({})", dir,
                    run.method, fmt::join(methods, ", ")));
  }
  const auto density = config.find("density");
  run.density = run.method == "dense"                             ? 1.0
                : density != config.end() && density->is_number() ? density->get<double>()
                                                                  : 0.0;
  const auto local_steps = config.find("local_steps");
  run.local_steps = local_steps == config.end() ? 0 : json_integer<int>(*local_steps).value_or(-1);
  const auto seed = config.find("seed");
  const std::optional<std::uint64_t> seed_value =
      seed == config.end() ? std::nullopt : json_integer<std::uint64_t>(*seed);
  if (!(run.density > 0 && run.density <= 1) || run.local_steps < 0 || !seed_value) {
    throw InvalidArgument(
        fmt::format("{}: config.json's density, local_steps or seed is missing or malformed", dir));
  }
  run.seed = *seed_value;
  run.overlap = run.local_steps > 0 && config.value("outer_overlap", false);
  run.options = variant_of(config);
  run.steps =
      std::max<std::int64_t>(static_cast<std::int64_t>(data.steps.size()), data.evals.back().step);
  for (const report::EvalRecord& e : data.evals) {
    if (!run.curve.empty() && e.step <= run.curve.back().step) continue;  // a repeated final eval
    run.curve.push_back(
        {.step = e.step, .test_loss = e.test_loss, .test_accuracy = e.test_accuracy});
  }
  return run;
}

// One JSON line per run: the configuration a profile would file it under,
// from its config.json alone (a run stopped short, without evaluations or
// with trimmed metrics, has one too).
void describe(const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs) {
    const report::RunData data = report::load_run(dir);
    const nlohmann::json& config = data.config;
    const std::string method = config.value("method", std::string());
    const auto density = config.find("density");
    nlohmann::json line = {
        {"dir", dir},
        {"method", method},
        {"density", method == "dense"                                 ? nlohmann::json(1.0)
                    : density != config.end() && density->is_number() ? *density
                                                                      : nlohmann::json()},
        {"local_steps", config.value("local_steps", nlohmann::json(0))},
        {"options", variant_of(config)}};
    fmt::print("{}\n", line.dump());
  }
}

void run(const Options& options) {
  if (options.describe) {
    if (!options.out.empty()) {
      throw InvalidArgument("convergence: --describe prints and writes no profile; drop -o");
    }
    describe(options.dirs);
    return;
  }
  if (options.out.empty()) {
    throw InvalidArgument("convergence: say where to write the profile with -o FILE");
  }
  std::vector<report::RunData> runs;
  for (const std::string& dir : options.dirs) {
    runs.push_back(report::load_run(dir));
    for (const std::string& warning : runs.back().warnings) logger().warn("{}", warning);
  }
  const nlohmann::json& first = runs.front().config;
  for (const report::RunData& data : runs) {
    for (const std::string& key : shared_keys()) {
      const auto a = first.find(key);
      const auto b = data.config.find(key);
      const nlohmann::json left = a == first.end() ? nlohmann::json() : *a;
      const nlohmann::json right = b == data.config.end() ? nlohmann::json() : *b;
      if (left != right) {
        throw InvalidArgument(fmt::format(
            "{} and {} differ in '{}' ({} against {}): a profile compares synchronizations on "
            "one model, schedule and world size; make one profile per setting",
            runs.front().dir.string(), data.dir.string(), key, left.dump(), right.dump()));
      }
    }
  }
  perf::ConvergenceProfile profile;
  profile.model = first.value("model", std::string());
  profile.ranks = json_integer<int>(first.value("workers", nlohmann::json())).value_or(0);
  profile.batch = json_integer<std::int64_t>(first.value("batch", nlohmann::json())).value_or(0);
  if (profile.ranks < 1 || profile.batch < 1) {
    throw InvalidArgument(fmt::format("{}: config.json's workers or batch is missing or malformed",
                                      runs.front().dir.string()));
  }
  profile.schedule = fmt::format("{}, lr {}, {}, {}", setting_text(first, "optimizer"),
                                 setting_text(first, "lr"), setting_text(first, "lr_decay"),
                                 setting_text(first, "max_steps") != "0"
                                     ? fmt::format("{} steps", setting_text(first, "max_steps"))
                                     : fmt::format("{} epochs", setting_text(first, "epochs")));
  profile.source = fmt::format("sparsecomm convergence {}", fmt::join(options.dirs, " "));
  // The compute of a step, for --density auto: the median over every pilot
  // step (rank 0's; the runs share model, batch and world).
  std::vector<double> compute;
  for (const report::RunData& data : runs) {
    for (const report::StepRecord& s : data.steps) {
      if (std::isfinite(s.compute_s) && s.compute_s > 0) compute.push_back(s.compute_s);
    }
  }
  if (compute.empty()) {
    throw InvalidArgument("the runs record no compute time per step (metrics.jsonl's compute_s)");
  }
  std::nth_element(compute.begin(), compute.begin() + compute.size() / 2, compute.end());
  profile.compute_s = compute[compute.size() / 2];
  for (const report::RunData& data : runs) profile.runs.push_back(pilot_run(data));
  // The same configuration and seed twice would count one run as two seeds.
  std::set<std::pair<std::string, std::uint64_t>> seen;
  for (std::size_t i = 0; i < profile.runs.size(); ++i) {
    const perf::ConvergenceRun& r = profile.runs[i];
    const std::string key =
        fmt::format("{} {} {} {}", r.method, r.density, r.local_steps, r.options);
    if (!seen.emplace(key, r.seed).second) {
      throw InvalidArgument(
          fmt::format("{}: the same configuration and seed as an earlier run; give each run once",
                      options.dirs[i]));
    }
  }
  perf::save_convergence_profile(profile, options.out);
  fmt::print("wrote {}: {}, {} ranks, batch {}, {}; {} runs; compute {:.2f} ms per step\n",
             options.out, profile.model, profile.ranks, profile.batch, profile.schedule,
             profile.runs.size(), profile.compute_s * 1e3);
}

}  // namespace
}  // namespace convergence_impl

std::string variant_options(const nlohmann::json& config) {
  return convergence_impl::variant_of(config);
}

void add_convergence_command(CLI::App& app) {
  using namespace convergence_impl;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "convergence",
      "Collect pilot runs of `sparsecomm train` (one model, schedule and world size; any "
      "methods, densities, --local-steps and seeds; evaluated with --eval-every) into a "
      "convergence profile for `plan --convergence`");
  cmd->add_option("DIR", options->dirs, "run directories `sparsecomm train --out DIR` wrote")
      ->required();
  cmd->add_option("-o,--out", options->out, "the profile to write (JSON)");
  cmd->add_flag("--describe", options->describe,
                "instead of a profile, print each run's configuration as a profile would label "
                "it (method, density, rounds, options; one JSON line a run, from config.json "
                "alone)");
  cmd->callback([options] { run(*options); });
}

}  // namespace sparsecomm::cli
