#include "sparsecomm/perf/convergence.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/atomic_file.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/json_numbers.h"
#include "sparsecomm/perf/json_file.h"
#include "sparsecomm/sync/gradient_sync.h"

namespace sparsecomm::perf {
namespace {

constexpr std::string_view kProfileFormat = "sparsecomm convergence profile";
constexpr int kProfileVersion = 1;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The metric of `point` that `target` reads, oriented so that larger is
// better (NaN stays NaN: a diverged evaluation never meets a target).
double progress(const CurvePoint& point, const Target& target) {
  return target.metric == Target::Metric::loss ? -point.test_loss : point.test_accuracy;
}

double goal(const Target& target) {
  return target.metric == Target::Metric::loss ? -target.value : target.value;
}

std::string configuration_label(const ConvergenceRun& run) {
  std::string label = run.method;
  // A method without a density (PowerSGD, the quantizers) records train's
  // default, which says nothing about it.
  const SyncMethodInfo* info = find_sync_method(run.method);
  if (info == nullptr || info->has_density) label += fmt::format(" c={:g}", run.density);
  if (run.local_steps > 0) {
    label += fmt::format(" h{}{}", run.local_steps, run.overlap ? " overlapped" : "");
  }
  if (!run.options.empty()) label += fmt::format(" ({})", run.options);
  return label;
}

const nlohmann::json& member(const nlohmann::json& json, std::string_view key,
                             std::string_view origin) {
  const auto it = json.find(key);
  if (it == json.end()) throw InvalidArgument(fmt::format("{}: '{}' is missing", origin, key));
  return *it;
}

std::string string_member(const nlohmann::json& json, std::string_view key,
                          std::string_view origin) {
  const nlohmann::json& value = member(json, key, origin);
  if (!value.is_string())
    throw InvalidArgument(fmt::format("{}: '{}' is not a string", origin, key));
  return value.get<std::string>();
}

template <typename T>
T integer_member(const nlohmann::json& json, std::string_view key, std::string_view origin,
                 T minimum) {
  const std::optional<T> value = json_integer<T>(member(json, key, origin));
  if (!value || *value < minimum) {
    throw InvalidArgument(
        fmt::format("{}: '{}' must be a whole number >= {}", origin, key, minimum));
  }
  return *value;
}

// A number, or null for NaN (JSON has no NaN; the trainer writes null).
double metric_value(const nlohmann::json& value, std::string_view what) {
  if (value.is_null()) return kNaN;
  if (!value.is_number()) throw InvalidArgument(fmt::format("{} is not a number or null", what));
  return value.get<double>();
}

ConvergenceRun run_from_json(const nlohmann::json& json, const std::string& origin) {
  if (!json.is_object()) throw InvalidArgument(fmt::format("{} is not an object", origin));
  ConvergenceRun run;
  run.method = string_member(json, "method", origin);
  const nlohmann::json& density = member(json, "density", origin);
  run.density = density.is_number() ? density.get<double>() : kNaN;
  if (!(run.density > 0 && run.density <= 1)) {
    throw InvalidArgument(fmt::format("{}: 'density' must be a number in (0, 1]", origin));
  }
  run.local_steps = integer_member<int>(json, "local_steps", origin, 0);
  if (const auto overlap = json.find("overlap"); overlap != json.end()) {
    if (!overlap->is_boolean() || (overlap->get<bool>() && run.local_steps == 0)) {
      throw InvalidArgument(fmt::format(
          "{}: 'overlap' must be true or false, and true only with local_steps > 0", origin));
    }
    run.overlap = overlap->get<bool>();
  }
  run.options = string_member(json, "options", origin);
  run.seed = integer_member<std::uint64_t>(json, "seed", origin, 0);
  run.steps = integer_member<std::int64_t>(json, "steps", origin, 1);
  const nlohmann::json& curve = member(json, "curve", origin);
  if (!curve.is_array() || curve.empty()) {
    throw InvalidArgument(fmt::format(
        "{}: 'curve' must be a non-empty array of [step, test_loss, test_accuracy]", origin));
  }
  for (std::size_t i = 0; i < curve.size(); ++i) {
    const std::string where = fmt::format("{}: curve[{}]", origin, i);
    const nlohmann::json& point = curve[i];
    if (!point.is_array() || point.size() != 3) {
      throw InvalidArgument(fmt::format("{} is not [step, test_loss, test_accuracy]", where));
    }
    const std::optional<std::int64_t> step = json_integer<std::int64_t>(point[0]);
    if (!step || *step < 0 || *step > run.steps ||
        (!run.curve.empty() && *step <= run.curve.back().step)) {
      throw InvalidArgument(
          fmt::format("{}: the step must be a whole number in [0, {}] above the one before it",
                      where, run.steps));
    }
    const double accuracy = metric_value(point[2], where + " test_accuracy");
    if (accuracy < 0.0 || accuracy > 1.0) {
      throw InvalidArgument(fmt::format(
          "{}: test_accuracy {} is not a fraction in [0, 1] (a percentage? divide it by 100)",
          where, accuracy));
    }
    run.curve.push_back({.step = *step,
                         .test_loss = metric_value(point[1], where + " test_loss"),
                         .test_accuracy = accuracy});
  }
  return run;
}

}  // namespace

std::string describe(const Target& target) {
  return target.metric == Target::Metric::loss
             ? fmt::format("test loss <= {:g}", target.value)
             : fmt::format("test accuracy >= {:g}%", 100.0 * target.value);
}

Target target_from_flags(std::optional<double> loss, std::optional<double> accuracy_percent,
                         std::string_view needed_by) {
  if (loss.has_value() == accuracy_percent.has_value()) {
    throw InvalidArgument(
        fmt::format("{} needs one target: --target-loss X (held-out loss at or below X) or "
                    "--target-accuracy P (test accuracy at or above P percent)",
                    needed_by));
  }
  if (loss) {
    if (!std::isfinite(*loss)) {
      throw InvalidArgument(fmt::format("--target-loss must be a finite number, got {}", *loss));
    }
    return {.metric = Target::Metric::loss, .value = *loss};
  }
  if (!(*accuracy_percent > 0 && *accuracy_percent <= 100)) {
    throw InvalidArgument(
        fmt::format("--target-accuracy is a percentage in (0, 100], got {}", *accuracy_percent));
  }
  return {.metric = Target::Metric::accuracy, .value = *accuracy_percent / 100.0};
}

std::optional<double> steps_to_target(const ConvergenceRun& run, const Target& target) {
  const double wanted = goal(target);
  for (std::size_t i = 0; i < run.curve.size(); ++i) {
    const double here = progress(run.curve[i], target);
    if (!(here >= wanted)) continue;
    if (i == 0) return static_cast<double>(run.curve[0].step);
    const double before = progress(run.curve[i - 1], target);
    const auto from = static_cast<double>(run.curve[i - 1].step);
    const auto to = static_cast<double>(run.curve[i].step);
    // The previous evaluation missed (or was NaN): interpolate when it is a
    // number, else take this evaluation's step.
    if (!std::isfinite(before)) return to;
    return from + (to - from) * (wanted - before) / (here - before);
  }
  return std::nullopt;
}

std::vector<ConfigurationOutcome> outcomes(const ConvergenceProfile& profile,
                                           const Target& target) {
  std::vector<ConfigurationOutcome> out;
  std::vector<std::vector<double>> reached_steps;
  for (const ConvergenceRun& run : profile.runs) {
    const std::string label = configuration_label(run);
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const ConfigurationOutcome& o) { return o.label == label; });
    if (it == out.end()) {
      out.push_back({.label = label,
                     .method = run.method,
                     .density = run.density,
                     .local_steps = run.local_steps,
                     .overlap = run.overlap,
                     .options = run.options,
                     .run_steps = run.steps});
      reached_steps.emplace_back();
      it = out.end() - 1;
    }
    const auto index = static_cast<std::size_t>(it - out.begin());
    it->seeds += 1;
    it->run_steps = std::min(it->run_steps, run.steps);
    if (const std::optional<double> steps = steps_to_target(run, target)) {
      it->reached += 1;
      reached_steps[index].push_back(*steps);
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    ConfigurationOutcome& o = out[i];
    const std::vector<double>& steps = reached_steps[i];
    if (o.reached < o.seeds) {
      o.steps = kNaN;
      continue;
    }
    double sum = 0.0;
    for (const double s : steps) sum += s;
    o.steps = sum / static_cast<double>(steps.size());
    double squares = 0.0;
    for (const double s : steps) squares += (s - o.steps) * (s - o.steps);
    o.steps_spread =
        steps.size() > 1 ? std::sqrt(squares / static_cast<double>(steps.size() - 1)) : 0.0;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> option_items(std::string_view options) {
  std::vector<std::pair<std::string, std::string>> items;
  while (!options.empty()) {
    const std::size_t comma = options.find(',');
    const std::string_view item = options.substr(0, comma);
    options = comma == std::string_view::npos ? std::string_view() : options.substr(comma + 1);
    const std::size_t equals = item.find('=');
    if (equals == std::string_view::npos) continue;
    items.emplace_back(item.substr(0, equals), item.substr(equals + 1));
  }
  return items;
}

Scenario scenario_of(const ConfigurationOutcome& outcome, Scenario base) {
  base.density = outcome.density;
  base.local_steps = outcome.local_steps;
  base.overlap_rounds = outcome.overlap;
  base.values = ValueEncoding::kFloat32;  // and rank 1, unless the options say otherwise
  base.low_rank = 1;
  for (const auto& [key, value] : option_items(outcome.options)) {
    if (key == "values") {
      base.values = parse_value_encoding(value);
    } else if (key == "rank" && outcome.method == "powersgd") {
      int rank = 0;
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), rank);
      if (error != std::errc() || end != value.data() + value.size() || rank < 1) {
        throw InvalidArgument(fmt::format("configuration '{}': rank={} is not a positive integer",
                                          outcome.label, value));
      }
      base.low_rank = rank;
    }
  }
  return base;
}

std::optional<DensityChoice> choose_configuration(const std::vector<ConfigurationOutcome>& outcomes,
                                                  std::string_view method, int local_steps,
                                                  bool overlap, std::string_view options,
                                                  const Scenario& base, const CostProfile& costs) {
  return choose_configuration(
      outcomes,
      [&](const ConfigurationOutcome& o) {
        return (method.empty() || o.method == method) && o.local_steps == local_steps &&
               o.overlap == overlap && o.options == options;
      },
      base, costs);
}

std::optional<DensityChoice> choose_configuration(const std::vector<ConfigurationOutcome>& outcomes,
                                                  const ConfigurationFilter& fits,
                                                  const Scenario& base, const CostProfile& costs) {
  std::optional<DensityChoice> best;
  for (const ConfigurationOutcome& o : outcomes) {
    if (!std::isfinite(o.steps) || !fits(o)) continue;
    const double step_s = predict_step(o.method, scenario_of(o, base), costs).step_s;
    const double time_s = o.steps * step_s;
    if (!best || time_s < best->time_s) best = DensityChoice{&o, step_s, time_s};
  }
  return best;
}

nlohmann::json to_json(const ConvergenceProfile& profile) {
  nlohmann::json runs = nlohmann::json::array();
  for (const ConvergenceRun& run : profile.runs) {
    nlohmann::json curve = nlohmann::json::array();
    for (const CurvePoint& p : run.curve) {
      curve.push_back({p.step, json_number(p.test_loss), json_number(p.test_accuracy)});
    }
    runs.push_back({{"method", run.method},
                    {"density", run.density},
                    {"local_steps", run.local_steps},
                    {"overlap", run.overlap},
                    {"options", run.options},
                    {"seed", run.seed},
                    {"steps", run.steps},
                    {"curve", std::move(curve)}});
  }
  return {{"format", kProfileFormat},     {"version", kProfileVersion},
          {"model", profile.model},       {"ranks", profile.ranks},
          {"batch", profile.batch},       {"compute_s", profile.compute_s},
          {"schedule", profile.schedule}, {"source", profile.source},
          {"runs", std::move(runs)}};
}

ConvergenceProfile convergence_profile_from_json(const nlohmann::json& json,
                                                 std::string_view origin) {
  const auto format = json.is_object() ? json.find("format") : json.end();
  if (!json.is_object() || format == json.end() || !format->is_string() ||
      format->get<std::string>() != kProfileFormat) {
    throw InvalidArgument(
        fmt::format("{}: not a convergence profile (its 'format' must be \"{}\"); make one with "
                    "`sparsecomm convergence RUN_DIR... -o FILE`",
                    origin, kProfileFormat));
  }
  if (const int version = integer_member<int>(json, "version", origin, 0);
      version != kProfileVersion) {
    throw InvalidArgument(fmt::format(
        "{}: version {} is not one this build reads ({}); make the profile again with this "
        "build's `sparsecomm convergence`",
        origin, version, kProfileVersion));
  }
  ConvergenceProfile profile;
  profile.model = string_member(json, "model", origin);
  profile.ranks = integer_member<int>(json, "ranks", origin, 1);
  profile.batch = integer_member<std::int64_t>(json, "batch", origin, 1);
  const nlohmann::json& compute = member(json, "compute_s", origin);
  profile.compute_s = compute.is_number() ? compute.get<double>() : kNaN;
  if (!(profile.compute_s > 0) || !std::isfinite(profile.compute_s)) {
    throw InvalidArgument(
        fmt::format("{}: 'compute_s' must be a finite number of seconds > 0", origin));
  }
  profile.schedule = string_member(json, "schedule", origin);
  profile.source = string_member(json, "source", origin);
  const nlohmann::json& runs = member(json, "runs", origin);
  if (!runs.is_array() || runs.empty()) {
    throw InvalidArgument(fmt::format("{}: 'runs' must be a non-empty array", origin));
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    profile.runs.push_back(run_from_json(runs[i], fmt::format("{}: runs[{}]", origin, i)));
  }
  return profile;
}

ConvergenceProfile load_convergence_profile(const std::string& path) {
  return convergence_profile_from_json(
      read_json_file(path, "the convergence profile",
                     "make one with `sparsecomm convergence RUN_DIR... -o FILE` from pilot runs "
                     "of `sparsecomm train`"),
      path);
}

void save_convergence_profile(const ConvergenceProfile& profile, const std::string& path) {
  atomic_write(path, to_json(profile).dump(2) + "\n");
}

}  // namespace sparsecomm::perf
