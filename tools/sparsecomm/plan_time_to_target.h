#pragma once
// `plan --convergence PROFILE --target-loss X | --target-accuracy P`: the
// predicted time to a target of each configuration a convergence profile
// holds (perf/convergence.h), its measured steps to the target times its
// predicted step at each world size (docs/algorithms.md, "Time to
// accuracy").

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparsecomm/perf/convergence.h"
#include "sparsecomm/perf/step_model.h"

namespace sparsecomm::cli::plan_impl {

// One configuration at one world size. time_s is NaN when it did not reach
// the target on every seed.
struct TimeToTarget {
  perf::ConfigurationOutcome outcome;
  perf::StepPrediction step;
  double time_s = 0.0;
};

// The configurations at one world size, fastest first (those that did not
// reach the target last, in the profile's order).
struct TargetRow {
  int ranks = 0;
  std::vector<TimeToTarget> configurations;
  const TimeToTarget* dense = nullptr;  // dense every step, when the profile has it
};

// For each n of `ranks`, `base` with its ranks set to n and each
// configuration's method, density and rounds. Throws InvalidArgument for a
// configuration the model cannot predict.
std::vector<TargetRow> predict_time_to_target(
    const std::vector<perf::ConfigurationOutcome>& outcomes, const std::vector<int>& ranks,
    const perf::Scenario& base, const perf::CostProfile& costs);

// The header line, a table per world size (one world size) or a line per
// world size and the table of the last (several), and the pick.
void print_time_to_target(const std::vector<TargetRow>& rows,
                          const perf::ConvergenceProfile& profile, const std::string& profile_path,
                          const perf::Target& target);
nlohmann::ordered_json time_to_target_json(const std::vector<TargetRow>& rows,
                                           const perf::ConvergenceProfile& profile,
                                           const std::string& profile_path,
                                           const perf::Target& target);

}  // namespace sparsecomm::cli::plan_impl
