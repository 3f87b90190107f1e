#include "auto_density.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "convergence_command.h"

#include "sparsecomm/comm/launcher.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"
#include "sparsecomm/perf/convergence.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/perf/step_model.h"
#include "sparsecomm/sync/dense_layers.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/train/model_probe.h"

namespace sparsecomm::cli {

void add_auto_density_flags(CLI::App* cmd, AutoDensityFlags& flags) {
  cmd->add_option("--convergence", flags.convergence,
                  "with --density auto: the convergence profile (`sparsecomm convergence`) of "
                  "pilot runs of this model and batch");
  cmd->add_option("--target-loss", flags.target_loss,
                  "with --density auto: the target, a held-out loss at or below this");
  cmd->add_option("--target-accuracy", flags.target_accuracy,
                  "with --density auto: the target, a test accuracy at or above this percentage");
  cmd->add_option("--link-gbit", flags.link_gbit,
                  "with --density auto: the network's link rate per direction, Gbit/s");
  cmd->add_option("--latency-us", flags.latency_us,
                  "with --density auto: its per-message latency, us (default 5)");
  cmd->add_option("--network-profile", flags.network_profile,
                  "with --density auto: the network as `sparsecomm calibrate` measured it (a "
                  "cost profile, instead of --link-gbit)");
  cmd->add_option("--compute-ms", flags.compute_ms,
                  "with --density auto: forward + backward per step on this cluster, ms "
                  "(default: the convergence profile's pilot runs)");
}

void check_auto_density_flags(const AutoDensityFlags& flags) {
  if (flags.requested) return;
  if (!flags.convergence.empty() || flags.target_loss || flags.target_accuracy || flags.link_gbit ||
      flags.latency_us || !flags.network_profile.empty() || flags.compute_ms) {
    throw InvalidArgument(
        "--convergence, --target-loss, --target-accuracy, --link-gbit, --latency-us, "
        "--network-profile and --compute-ms choose the density of --density auto: add it, or "
        "drop them");
  }
}

namespace {

// The network of --density auto: a calibrated cost profile, or the link's
// rate and latency on the model's default host costs.
perf::CostProfile network_of(const AutoDensityFlags& flags) {
  if (!flags.network_profile.empty()) {
    if (flags.link_gbit || flags.latency_us) {
      throw InvalidArgument(
          "--network-profile already holds the network's rate and latency: drop --link-gbit and "
          "--latency-us, or the profile");
    }
    return perf::load_profile(flags.network_profile);
  }
  if (!flags.link_gbit) {
    throw InvalidArgument(
        "--density auto needs the network it trains on: --link-gbit G (and --latency-us L), or "
        "--network-profile FILE from `sparsecomm calibrate`");
  }
  if (!(*flags.link_gbit > 0) || !std::isfinite(*flags.link_gbit) ||
      (flags.latency_us && (!(*flags.latency_us >= 0) || !std::isfinite(*flags.latency_us)))) {
    throw InvalidArgument("--link-gbit must be > 0 and --latency-us >= 0");
  }
  return perf::network_profile(*flags.link_gbit, flags.latency_us.value_or(5.0));
}

// The method options of configuration `o`: the items of its options that
// its method takes (the rest are train settings, such as outer_lr).
std::map<std::string, std::string> method_options_of(const perf::ConfigurationOutcome& o) {
  std::map<std::string, std::string> out;
  const SyncMethodInfo& info = sync_method(o.method);
  for (const std::pair<std::string, std::string>& item : perf::option_items(o.options)) {
    const auto named = [&](const OptionSpec& spec) { return spec.name == item.first; };
    if (std::ranges::any_of(info.options, named)) out[item.first] = item.second;
  }
  return out;
}

}  // namespace

void choose_auto_configuration(TrainConfig& config, const AutoDensityFlags& flags) {
  const bool any_method = config.method == "auto";
  if (any_method && !flags.requested) {
    throw InvalidArgument(
        "--method auto chooses the method with its density: give --density auto with it");
  }
  if (any_method && !config.method_options.empty()) {
    throw InvalidArgument(
        "--method auto runs the chosen configuration with its own method options (from the "
        "profile): drop -o, or name the method and give --density auto");
  }
  if (config.servers > 0 || (!any_method && !sync_method(config.method).has_density)) {
    throw InvalidArgument(fmt::format(
        "--density auto chooses a sparsifier's density; {} has none to choose (use --method auto "
        "--density auto to choose among every method of the profile)",
        config.servers > 0 ? "parameter-server mode" : config.method));
  }
  if (flags.convergence.empty()) {
    throw InvalidArgument(
        "--density auto needs --convergence PROFILE: pilot runs of this model at a few densities "
        "collected by `sparsecomm convergence` (docs/algorithms.md, \"Time to accuracy\")");
  }
  const perf::Target target =
      perf::target_from_flags(flags.target_loss, flags.target_accuracy, "--density auto");
  const perf::CostProfile costs = network_of(flags);
  if (flags.compute_ms && (!(*flags.compute_ms > 0) || !std::isfinite(*flags.compute_ms))) {
    throw InvalidArgument(
        fmt::format("--compute-ms must be a time > 0 in ms, got {}", *flags.compute_ms));
  }
  const perf::ConvergenceProfile profile = perf::load_convergence_profile(flags.convergence);
  if (profile.model != config.model || profile.batch != config.batch) {
    throw InvalidArgument(fmt::format(
        "--convergence {} holds runs of {} at batch {}, this run trains {} at batch {}: steps to "
        "a target belong to one model and batch; profile this one",
        flags.convergence, profile.model, profile.batch, config.model, config.batch));
  }
  const std::string options = variant_options(to_json(config));
  const bool overlap = config.local_steps > 0 && config.outer_overlap;
  const std::vector<perf::ConfigurationOutcome> outcomes = perf::outcomes(profile, target);

  const ModelProbe probe = probe_model(config.model, 1, 1, 1);  // the sizes
  DenseLayerRule rule;
  rule.min_numel = static_cast<std::size_t>(std::max<std::int64_t>(0, config.min_numel));
  rule.patterns = config.exclude;
  // The method's tensors (PowerSGD's cost depends on their shapes); the
  // values' width and PowerSGD's rank come from each configuration's options.
  std::vector<LayerSpan> method_tensors = probe.tensors;
  std::erase_if(method_tensors, [&](const LayerSpan& t) { return rule.matches(t); });
  perf::Scenario base;
  base.ranks = config.workers > 0 ? config.workers : profile.ranks;
  base.numel = static_cast<double>(probe.numel);
  base.dense_numel = static_cast<double>(dense_numel(rule, probe.tensors, config.model));
  base.compute_s = flags.compute_ms ? *flags.compute_ms / 1e3 : profile.compute_s;
  base.tensors = method_tensors;
  // A configuration fits when this run, given its method, density and method
  // options, would be that configuration: the same rounds and the same other
  // settings (train's, beyond the method's options).
  const auto fits = [&](const perf::ConfigurationOutcome& o) {
    if (o.local_steps != config.local_steps || o.overlap != overlap) return false;
    if (!any_method) return o.method == config.method && o.options == options;
    TrainConfig candidate = config;
    candidate.method = o.method;
    candidate.density = o.density;
    candidate.method_options = method_options_of(o);
    return variant_options(to_json(candidate)) == o.options;
  };
  const std::optional<perf::DensityChoice> choice =
      perf::choose_configuration(outcomes, fits, base, costs);
  if (!choice) {
    std::vector<std::string> held;
    for (const perf::ConfigurationOutcome& o : outcomes) {
      held.push_back(fmt::format("{} ({}/{} seeds reached it)", o.label, o.reached, o.seeds));
    }
    throw InvalidArgument(fmt::format(
        "--convergence {} has no configuration of {}{}{} that reached {} on every seed; it "
        "holds: {}",
        flags.convergence, any_method ? "any method" : config.method,
        config.local_steps > 0
            ? fmt::format(" h{}{}", config.local_steps, overlap ? " overlapped" : "")
            : "",
        options.empty() ? "" : fmt::format(" ({})", options), describe(target),
        fmt::join(held, "; ")));
  }
  // Every rank of an MPI job makes the same choice (the same flags and
  // files); one of them says so.
  if (launcher_rank().value_or(0) == 0) {
    logger().info(
        "--{} auto: {} (predicted {:.0f} steps x {:.2f} ms = {:.1f} s to {}; network {}; steps "
        "measured at {} ranks in {})",
        any_method ? "method" : "density", choice->outcome->label, choice->outcome->steps,
        choice->step_s * 1e3, choice->time_s, describe(target), costs.name, profile.ranks,
        flags.convergence);
  }
  config.method = choice->outcome->method;
  config.density = choice->outcome->density;
  if (any_method) config.method_options = method_options_of(*choice->outcome);
}

}  // namespace sparsecomm::cli
