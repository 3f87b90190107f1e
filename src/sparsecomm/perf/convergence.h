#pragma once
// Convergence profiles (docs/algorithms.md, "Time to accuracy"): how many
// steps a model needs to reach a target loss or accuracy under each
// synchronization configuration (method, density, rounds of local steps),
// measured by pilot runs of `sparsecomm train` at one world size and
// collected by `sparsecomm convergence`. `plan --convergence` multiplies
// the steps to a target by the predicted step time.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sparsecomm/perf/step_model.h"

namespace sparsecomm::perf {

// One evaluation of a run: the held-out loss and accuracy (a fraction in
// [0, 1]; NaN when the model reports none) after `step` steps.
struct CurvePoint {
  std::int64_t step = 0;
  double test_loss = 0.0;
  double test_accuracy = 0.0;
};

// One pilot run.
struct ConvergenceRun {
  std::string method;    // a name `plan` predicts (dense, topk, exdyna, ...)
  double density = 1.0;  // c (1 for dense)
  int local_steps = 0;   // rounds of H steps (0: every step synchronizes)
  bool overlap = false;  // each round's exchange during the next (--outer-overlap)
  std::string options;   // what else sets it apart ("memory=ef,decay=0.95"; may be "")
  std::uint64_t seed = 0;
  std::int64_t steps = 0;         // the run's length
  std::vector<CurvePoint> curve;  // its evaluations, steps ascending
};

// Pilot runs of one model and schedule at one world size.
struct ConvergenceProfile {
  std::string model;
  int ranks = 0;           // n of every run
  std::int64_t batch = 0;  // per rank
  double compute_s = 0.0;  // the pilot runs' median compute per step (rank 0's), > 0
  std::string schedule;    // the shared training settings, for the reader
  std::string source;      // how it was made (command, date)
  std::vector<ConvergenceRun> runs;
};

// What "reached" means: the held-out loss at or below `value`, or the
// accuracy (a fraction) at or above it.
struct Target {
  enum class Metric { loss, accuracy };
  Metric metric = Metric::loss;
  double value = 0.0;
};
std::string describe(const Target& target);
// The target of the flags --target-loss X or --target-accuracy P (percent):
// exactly one must be given (InvalidArgument naming `needed_by`, the option
// that needs it, otherwise), X finite, P in (0, 100].
Target target_from_flags(std::optional<double> loss, std::optional<double> accuracy_percent,
                         std::string_view needed_by);  // "test loss <= 2.3", "test accuracy >= 92%"

// The steps `run` took to reach `target`: the first evaluation that meets
// it, linearly interpolated from the one before it (the first evaluation's
// step when that one already meets it); nullopt when none does.
std::optional<double> steps_to_target(const ConvergenceRun& run, const Target& target);

// A configuration's runs over seeds. `steps` is the mean of the seeds'
// steps to the target when every seed reached it (reached == seeds), NaN
// otherwise: a configuration that misses on one seed is not planned on.
struct ConfigurationOutcome {
  std::string label;  // "exdyna c=0.01 h8 (memory=ef)"
  std::string method;
  double density = 1.0;
  int local_steps = 0;
  bool overlap = false;
  std::string options;
  int seeds = 0;
  int reached = 0;
  double steps = 0.0;
  double steps_spread = 0.0;   // sample standard deviation over seeds (0 for one)
  std::int64_t run_steps = 0;  // the shortest run's length (how far "not reached" looked)
};
// One outcome per configuration, in the order the profile first lists it.
std::vector<ConfigurationOutcome> outcomes(const ConvergenceProfile& profile, const Target& target);

// `base` as the configuration ran: its density and rounds, and from its
// options the wire width of `values=` and PowerSGD's `rank=` (fp32 and
// rank 1, the defaults, where they are absent). InvalidArgument for a values= the codec
// does not know or a rank that is not a positive integer.
Scenario scenario_of(const ConfigurationOutcome& outcome, Scenario base);

// The key=value items of a configuration's options ("rank=8,values=int8"),
// in order; an item without '=' is skipped.
std::vector<std::pair<std::string, std::string>> option_items(std::string_view options);

// train's --density auto (and --method auto): among the profile's
// configurations of `method` ("": any method) with these rounds and options
// that reached the target on every seed, the one whose predicted time to it
// (its steps times predict_step of its method on scenario_of(it, base)) is
// least; nullopt when there is none. On a slower network
// the choice is never denser (tested).
struct DensityChoice {
  const ConfigurationOutcome* outcome = nullptr;  // into the outcomes given
  double step_s = 0.0;
  double time_s = 0.0;
};
std::optional<DensityChoice> choose_configuration(const std::vector<ConfigurationOutcome>& outcomes,
                                                  std::string_view method, int local_steps,
                                                  bool overlap, std::string_view options,
                                                  const Scenario& base, const CostProfile& costs);
// The same among the configurations `fits` accepts (train's --method auto
// takes each configuration's method options with it, so it cannot name
// them in advance).
using ConfigurationFilter = std::function<bool(const ConfigurationOutcome&)>;
std::optional<DensityChoice> choose_configuration(const std::vector<ConfigurationOutcome>& outcomes,
                                                  const ConfigurationFilter& fits,
                                                  const Scenario& base, const CostProfile& costs);

// JSON form ({"format": "sparsecomm convergence profile", "version": 1, ...}).
nlohmann::json to_json(const ConvergenceProfile& profile);
// Throws InvalidArgument naming `origin` and the field for a malformed
// profile: a missing or mistyped field, no run, a curve not ascending, a
// step past the run's length, a density outside (0, 1].
ConvergenceProfile convergence_profile_from_json(const nlohmann::json& json,
                                                 std::string_view origin);
ConvergenceProfile load_convergence_profile(const std::string& path);
void save_convergence_profile(const ConvergenceProfile& profile, const std::string& path);

}  // namespace sparsecomm::perf
