// Convergence profiles (docs/algorithms.md, "Time to accuracy"): steps to a
// target read off evaluation curves, outcomes over seeds, and the file's
// JSON with its refusals.

#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "error_message.h"
#include "scratch_dir.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/perf/convergence.h"
#include "sparsecomm/perf/cost_profile.h"

namespace sparsecomm::perf {
namespace {

using testing::error_message;
using testing::ScratchDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

ConvergenceRun run_of(std::string method, double density, std::uint64_t seed,
                      std::vector<CurvePoint> curve, int local_steps = 0) {
  return {.method = std::move(method),
          .density = density,
          .local_steps = local_steps,
          .options = "",
          .seed = seed,
          .steps = curve.back().step,
          .curve = std::move(curve)};
}

const Target kLoss1{.metric = Target::Metric::loss, .value = 1.0};

TEST(Convergence, StepsToTargetInterpolateBetweenEvaluations) {
  // Loss 2.0 at step 100, 0.5 at 200: 1.0 is two thirds of the way.
  const ConvergenceRun run =
      run_of("dense", 1.0, 1, {{0, 3.0, 0.1}, {100, 2.0, 0.4}, {200, 0.5, 0.8}});
  ASSERT_TRUE(steps_to_target(run, kLoss1).has_value());
  EXPECT_NEAR(*steps_to_target(run, kLoss1), 100 + 100 * (2.0 - 1.0) / (2.0 - 0.5), 1e-9);
  // Accuracy targets read the other column, larger is better.
  const Target accuracy{.metric = Target::Metric::accuracy, .value = 0.6};
  EXPECT_NEAR(*steps_to_target(run, accuracy), 150.0, 1e-9);
  // Met at the first evaluation: its step; never met: nullopt.
  EXPECT_EQ(*steps_to_target(run, {.metric = Target::Metric::loss, .value = 5.0}), 0.0);
  EXPECT_FALSE(steps_to_target(run, {.metric = Target::Metric::loss, .value = 0.1}).has_value());
}

TEST(Convergence, NaNEvaluationsNeverMeetATarget) {
  // A run that diverged after reaching 1.5: NaN is not <= 1.0.
  const ConvergenceRun diverged = run_of("topk", 0.01, 1, {{100, 1.5, 0.5}, {200, kNaN, kNaN}});
  EXPECT_FALSE(steps_to_target(diverged, kLoss1).has_value());
  // A NaN before the evaluation that meets it: that evaluation's step.
  const ConvergenceRun recovered = run_of("topk", 0.01, 1, {{100, kNaN, kNaN}, {200, 0.9, 0.5}});
  EXPECT_EQ(*steps_to_target(recovered, kLoss1), 200.0);
}

TEST(Convergence, OutcomesAverageSeedsAndMissOnAnySeedThatMisses) {
  ConvergenceProfile profile;
  profile.runs = {run_of("dense", 1.0, 1, {{100, 2.0, 0}, {200, 0.0, 0}}),  // 150
                  run_of("dense", 1.0, 2, {{100, 2.0, 0}, {200, 1.0, 0}}),  // 200
                  run_of("topk", 0.01, 1, {{100, 0.5, 0}, {300, 0.4, 0}}),  // 100
                  run_of("topk", 0.01, 2, {{100, 1.5, 0}, {300, 1.2, 0}}),  // missed
                  run_of("topk", 0.01, 1, {{100, 0.5, 0}, {300, 0.4, 0}}, 8)};
  const std::vector<ConfigurationOutcome> out = outcomes(profile, kLoss1);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].label, "dense");
  EXPECT_EQ(out[0].seeds, 2);
  EXPECT_EQ(out[0].reached, 2);
  EXPECT_DOUBLE_EQ(out[0].steps, 175.0);
  EXPECT_NEAR(out[0].steps_spread, std::sqrt(2 * 25.0 * 25.0), 1e-9);
  EXPECT_EQ(out[1].label, "topk c=0.01");
  EXPECT_EQ(out[1].reached, 1);
  EXPECT_TRUE(std::isnan(out[1].steps))
      << "a configuration that misses on one seed is not planned on";
  EXPECT_EQ(out[1].run_steps, 300);
  EXPECT_EQ(out[2].label, "topk c=0.01 h8");
  EXPECT_EQ(out[2].local_steps, 8);
  EXPECT_DOUBLE_EQ(out[2].steps, 100.0);
}

TEST(Convergence, LabelsNameADensityOnlyForMethodsThatHaveOne) {
  // A PowerSGD or quantizer run records train's default density (0.01),
  // which is not its compression: its label leaves it out.
  ConvergenceProfile profile;
  profile.runs = {run_of("powersgd", 0.01, 1, {{100, 0.5, 0}}),
                  run_of("qsgd", 0.01, 1, {{100, 0.5, 0}}),
                  run_of("exdyna", 0.01, 1, {{100, 0.5, 0}})};
  profile.runs[0].options = "rank=4";
  const std::vector<ConfigurationOutcome> out = outcomes(profile, kLoss1);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].label, "powersgd (rank=4)");
  EXPECT_EQ(out[1].label, "qsgd");
  EXPECT_EQ(out[2].label, "exdyna c=0.01");
}

ConvergenceProfile small_profile() {
  ConvergenceProfile profile{.model = "cnn",
                             .ranks = 4,
                             .batch = 64,
                             .compute_s = 0.05,
                             .schedule = "sgd, lr 0.1, cosine, 60 steps",
                             .source = "test",
                             .runs = {}};
  profile.runs = {run_of("dense", 1.0, 42, {{20, 1.2, 0.6}, {60, kNaN, kNaN}}),
                  run_of("exdyna", 0.001, 42, {{20, 1.5, 0.5}, {60, 0.7, 0.75}}, 10)};
  profile.runs[1].options = "memory=ef,decay=0.95";
  return profile;
}

TEST(Convergence, JsonRoundTripsIncludingNaN) {
  const ConvergenceProfile profile = small_profile();
  const nlohmann::json json = to_json(profile);
  const ConvergenceProfile back = convergence_profile_from_json(json, "test");
  EXPECT_EQ(to_json(back), json);
  EXPECT_TRUE(json["runs"][0]["curve"][1][1].is_null());
  EXPECT_TRUE(std::isnan(back.runs[0].curve[1].test_loss));
  EXPECT_EQ(back.runs[1].options, "memory=ef,decay=0.95");

  ScratchDir dir("convergence");
  const std::string path = (dir.path() / "profile.json").string();
  save_convergence_profile(profile, path);
  EXPECT_EQ(to_json(load_convergence_profile(path)), json);
}

TEST(Convergence, MalformedProfilesAreRefusedNamingTheField) {
  const nlohmann::json good = to_json(small_profile());
  auto refusal = [](const nlohmann::json& json) {
    return error_message<InvalidArgument>([&] { convergence_profile_from_json(json, "p.json"); });
  };
  EXPECT_NE(refusal(nlohmann::json::array()).find("not a convergence profile"), std::string::npos);
  nlohmann::json j = good;
  j["format"] = 3;
  EXPECT_NE(refusal(j).find("not a convergence profile"), std::string::npos);
  j = good;
  j["version"] = 2;
  EXPECT_NE(refusal(j).find("version 2 is not one this build reads"), std::string::npos);
  j = good;
  j["runs"] = nlohmann::json::array();
  EXPECT_NE(refusal(j).find("'runs' must be a non-empty array"), std::string::npos);
  j = good;
  j["runs"][1]["density"] = 1.5;
  EXPECT_NE(refusal(j).find("runs[1]: 'density' must be a number in (0, 1]"), std::string::npos);
  j = good;
  j["runs"][0]["curve"][1][0] = 10;  // below the step before it
  EXPECT_NE(refusal(j).find("runs[0]: curve[1]: the step must be a whole number in [0, 60]"),
            std::string::npos);
  j = good;
  j["runs"][0]["curve"][1][0] = 61;  // past the run's length
  EXPECT_NE(refusal(j).find("curve[1]: the step must be"), std::string::npos);
  j = good;
  j["runs"][0]["curve"][0][0] = 2.5e78;
  EXPECT_NE(refusal(j).find("curve[0]: the step must be"), std::string::npos);
  j = good;
  j["runs"][0]["curve"][0][1] = "low";
  EXPECT_NE(refusal(j).find("curve[0] test_loss is not a number or null"), std::string::npos);
  j = good;
  j["runs"][0]["curve"][0][2] = 91.5;  // a percentage
  EXPECT_NE(refusal(j).find("curve[0]: test_accuracy 91.5 is not a fraction in [0, 1]"),
            std::string::npos);
  j = good;
  j["runs"][0].erase("seed");
  EXPECT_NE(refusal(j).find("runs[0]: 'seed' is missing"), std::string::npos);
  j = good;
  j["compute_s"] = -1;
  EXPECT_NE(refusal(j).find("'compute_s' must be a finite number of seconds > 0"),
            std::string::npos);
  j = good;
  j["ranks"] = 0;
  EXPECT_NE(refusal(j).find("'ranks' must be a whole number >= 1"), std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([] {
              load_convergence_profile("/nonexistent/p.json");
            }).find("make one with `sparsecomm convergence"),
            std::string::npos);
}

// --density auto's rule on a synthetic profile: fewer steps at higher
// density, dearer steps too. On a fast link a dense configuration wins (the
// host's selection and decoding still grow with the density), on a slow one
// the sparsest, and the choice never gets denser as the link slows (the time
// is steps x (compute + host work + bytes / rate): the bytes term grows with
// the density and weighs more on a slower link).
TEST(Convergence, AutoDensityIsNeverDenserOnASlowerNetwork) {
  ConvergenceProfile profile;
  const std::vector<std::pair<double, std::int64_t>> steps_at = {
      {0.001, 3000}, {0.003, 2000}, {0.01, 1500}, {0.03, 1250}, {0.1, 1100}, {0.3, 1050}};
  for (const auto& [density, steps] : steps_at) {
    profile.runs.push_back(
        run_of("exdyna", density, 1, {{steps / 2, 2.0, 0.0}, {steps, 1.0, 0.0}, {4000, 0.5, 0.0}}));
  }
  profile.runs.push_back(run_of("topk", 0.01, 1, {{10, 0.1, 0.0}}));  // another method: ignored
  const std::vector<ConfigurationOutcome> out = outcomes(profile, kLoss1);
  const Scenario base{.ranks = 8, .numel = 2.5e7, .compute_s = 0.1};
  double previous = 2.0;
  std::vector<double> chosen;
  for (const double gbit : {400.0, 100.0, 25.0, 10.0, 1.0, 0.3, 0.1, 0.05, 0.01}) {
    const std::optional<DensityChoice> choice =
        choose_configuration(out, "exdyna", 0, false, "", base, network_profile(gbit, 5));
    ASSERT_TRUE(choice.has_value()) << gbit;
    EXPECT_LE(choice->outcome->density, previous) << gbit << " Gbit/s";
    EXPECT_EQ(choice->outcome->method, "exdyna");
    EXPECT_DOUBLE_EQ(choice->time_s, choice->outcome->steps * choice->step_s);
    previous = choice->outcome->density;
    chosen.push_back(previous);
  }
  EXPECT_GE(chosen.front(), 0.03);
  EXPECT_EQ(chosen.back(), 0.001);
  // Nothing of the method, rounds or options asked for: no choice.
  const CostProfile link = network_profile(1, 5);
  EXPECT_FALSE(choose_configuration(out, "micro", 0, false, "", base, link).has_value());
  EXPECT_FALSE(choose_configuration(out, "exdyna", 8, false, "", base, link).has_value());
  EXPECT_FALSE(
      choose_configuration(out, "exdyna", 0, false, "memory=ef21", base, link).has_value());
  // Any method: Top-k reaches this target in 10 steps and wins.
  const std::optional<DensityChoice> any = choose_configuration(out, "", 0, false, "", base, link);
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ(any->outcome->label, "topk c=0.01");
}

// A configuration is predicted as it ran: its density and rounds, and the
// values' wire width and PowerSGD's rank from its options (fp32 and rank 1
// where they are absent, whatever the base scenario says).
TEST(Convergence, AConfigurationIsPricedWithItsOwnValuesAndRank) {
  Scenario base{.ranks = 8, .numel = 2.5e7, .compute_s = 0.1, .values = ValueEncoding::kFloat16};
  base.low_rank = 8;
  ConfigurationOutcome exdyna{.label = "exdyna c=0.01 (values=int2)",
                              .method = "exdyna",
                              .density = 0.01,
                              .local_steps = 4,
                              .options = "memory=ef,values=int2"};
  Scenario s = scenario_of(exdyna, base);
  EXPECT_EQ(s.density, 0.01);
  EXPECT_EQ(s.local_steps, 4);
  EXPECT_EQ(s.values, ValueEncoding::kInt2);
  EXPECT_EQ(s.low_rank, 1);
  exdyna.options = "";
  EXPECT_EQ(scenario_of(exdyna, base).values, ValueEncoding::kFloat32);
  ConfigurationOutcome powersgd{
      .label = "powersgd (rank=4)", .method = "powersgd", .density = 1.0, .options = "rank=4"};
  EXPECT_EQ(scenario_of(powersgd, base).low_rank, 4);
  powersgd.options = "rank=four";
  EXPECT_EQ(error_message<InvalidArgument>([&] { scenario_of(powersgd, base); }),
            "configuration 'powersgd (rank=4)': rank=four is not a positive integer");
  exdyna.options = "values=int3";
  EXPECT_THROW(scenario_of(exdyna, base), InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm::perf
