#include "plan_time_to_target.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm::cli::plan_impl {
namespace {

std::string seconds(double s) {
  if (!std::isfinite(s)) return "-";
  if (s >= 3600) return fmt::format("{:.2f} h", s / 3600);
  if (s >= 60) return fmt::format("{:.1f} min", s / 60);
  if (s >= 1) return fmt::format("{:.1f} s", s);
  return fmt::format("{:.0f} ms", s * 1e3);
}

std::string steps_text(const perf::ConfigurationOutcome& o) {
  if (!std::isfinite(o.steps)) return fmt::format("not within {} steps", o.run_steps);
  return o.seeds > 1 ? fmt::format("{:.0f} ± {:.0f}", o.steps, o.steps_spread)
                     : fmt::format("{:.0f}", o.steps);
}

double dense_speedup(const TargetRow& row, const TimeToTarget& t) {
  if (row.dense == nullptr || !std::isfinite(row.dense->time_s) || !std::isfinite(t.time_s)) {
    return std::nan("");
  }
  return row.dense->time_s / t.time_s;
}

// The fastest configuration of each method (the density plan would pick
// for it), in the order of their times.
std::vector<const TimeToTarget*> best_per_method(const TargetRow& row) {
  std::vector<const TimeToTarget*> best;
  for (const TimeToTarget& t : row.configurations) {  // fastest first
    if (!std::isfinite(t.time_s)) continue;
    const bool seen = std::any_of(best.begin(), best.end(), [&](const TimeToTarget* b) {
      return b->outcome.method == t.outcome.method;
    });
    if (!seen) best.push_back(&t);
  }
  return best;
}

std::string pick(const TargetRow& row) {
  const std::vector<const TimeToTarget*> best = best_per_method(row);
  if (best.empty()) return "no configuration of the profile reached the target on every seed";
  const double s = dense_speedup(row, *best.front());
  return fmt::format("{} reaches it first ({}{})", best.front()->outcome.label,
                     seconds(best.front()->time_s),
                     std::isfinite(s) ? fmt::format(", {:.2f}x sooner than dense", s) : "");
}

void print_table(const TargetRow& row) {
  std::size_t width = 13;  // "configuration"
  for (const TimeToTarget& t : row.configurations) width = std::max(width, t.outcome.label.size());
  fmt::print("{:<{}} {:>6} {:>20} {:>10} {:>12} {:>9}\n", "configuration", width, "seeds",
             "steps to target", "step ms", "time", "vs dense");
  for (const TimeToTarget& t : row.configurations) {
    const double s = dense_speedup(row, t);
    fmt::print("{:<{}} {:>6} {:>20} {:>10.2f} {:>12} {:>9}\n", t.outcome.label, width,
               fmt::format("{}/{}", t.outcome.reached, t.outcome.seeds), steps_text(t.outcome),
               t.step.step_s * 1e3, seconds(t.time_s),
               std::isfinite(s) ? fmt::format("{:.2f}x", s) : "-");
  }
}

}  // namespace

std::vector<TargetRow> predict_time_to_target(
    const std::vector<perf::ConfigurationOutcome>& outcomes, const std::vector<int>& ranks,
    const perf::Scenario& base, const perf::CostProfile& costs) {
  std::vector<TargetRow> rows;
  for (const int n : ranks) {
    TargetRow row;
    row.ranks = n;
    for (const perf::ConfigurationOutcome& o : outcomes) {
      perf::Scenario scenario = perf::scenario_of(o, base);
      scenario.ranks = n;
      scenario.bucket_bytes = 0.0;
      TimeToTarget t{.outcome = o, .step = perf::predict_step(o.method, scenario, costs)};
      t.time_s = o.steps * t.step.step_s;  // NaN when not reached
      row.configurations.push_back(std::move(t));
    }
    std::stable_sort(row.configurations.begin(), row.configurations.end(),
                     [](const TimeToTarget& a, const TimeToTarget& b) {
                       const bool fa = std::isfinite(a.time_s), fb = std::isfinite(b.time_s);
                       return fa != fb ? fa : fa && a.time_s < b.time_s;
                     });
    rows.push_back(std::move(row));
  }
  for (TargetRow& row : rows) {
    for (const TimeToTarget& t : row.configurations) {
      if (t.outcome.method == "dense" && t.outcome.local_steps == 0 && t.outcome.options.empty()) {
        row.dense = &t;
      }
    }
  }
  return rows;
}

void print_time_to_target(const std::vector<TargetRow>& rows,
                          const perf::ConvergenceProfile& profile, const std::string& profile_path,
                          const perf::Target& target) {
  fmt::print(
      "\ntime to target: {}; steps to it from the convergence profile {} ({}, {} ranks, batch {} "
      "per rank, {}), taken as measured at {} ranks for every world size\n",
      describe(target), profile_path, profile.model, profile.ranks, profile.batch, profile.schedule,
      profile.ranks);
  if (rows.size() == 1) {
    print_table(rows.front());
    fmt::print("\n{} ranks: {}\n", rows.front().ranks, pick(rows.front()));
  } else {
    for (const TargetRow& row : rows) {
      std::vector<std::string> methods;
      for (const TimeToTarget* t : best_per_method(row)) {
        methods.push_back(fmt::format("{} {}", t->outcome.label, seconds(t->time_s)));
      }
      fmt::print("{:>6} ranks: {}; best per method: {}\n", row.ranks, pick(row),
                 methods.empty() ? std::string("-") : fmt::format("{}", fmt::join(methods, "; ")));
    }
    fmt::print("\nat {} ranks:\n", rows.back().ranks);
    print_table(rows.back());
  }
}

nlohmann::ordered_json time_to_target_json(const std::vector<TargetRow>& rows,
                                           const perf::ConvergenceProfile& profile,
                                           const std::string& profile_path,
                                           const perf::Target& target) {
  nlohmann::ordered_json j;
  j["target"] = describe(target);
  j["convergence_profile"] = profile_path;
  j["profile_model"] = profile.model;
  j["profile_ranks"] = profile.ranks;
  auto number = [](double v) {
    return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
  };
  for (const TargetRow& row : rows) {
    nlohmann::ordered_json r;
    r["ranks"] = row.ranks;
    for (const TimeToTarget& t : row.configurations) {
      nlohmann::ordered_json c;
      c["configuration"] = t.outcome.label;
      c["method"] = t.outcome.method;
      c["density"] = t.outcome.density;
      c["local_steps"] = t.outcome.local_steps;
      c["options"] = t.outcome.options;
      c["seeds"] = t.outcome.seeds;
      c["reached"] = t.outcome.reached;
      c["steps_to_target"] = number(t.outcome.steps);
      c["step_s"] = t.step.step_s;
      c["time_to_target_s"] = number(t.time_s);
      c["speedup_vs_dense"] = number(dense_speedup(row, t));
      r["configurations"].push_back(c);
    }
    const std::vector<const TimeToTarget*> best = best_per_method(row);
    r["best"] = best.empty() ? nlohmann::ordered_json()
                             : nlohmann::ordered_json(best.front()->outcome.label);
    j["per_ranks"].push_back(r);
  }
  return j;
}

}  // namespace sparsecomm::cli::plan_impl
