#pragma once
// The printouts of `sparsecomm plan` (plan_command.h): the predicted step
// times per world size as a table, a curve, JSON, the crossovers, the
// verdict and gnuplot figures.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparsecomm/perf/step_model.h"

namespace sparsecomm::cli::plan_impl {

// The predictions at one world size.
struct Row {
  int ranks = 0;
  std::vector<perf::StepPrediction> methods;  // in the order asked
  const perf::StepPrediction* dense = nullptr;
};

// dense's step time over p's (NaN without dense among the methods).
double speedup(const Row& row, const perf::StepPrediction& p);
// The sentence on which method pays at one world size.
std::string verdict(const Row& row);
// For each method, the world sizes where it stops (or starts) beating
// dense, between consecutive sizes asked for.
std::vector<std::string> crossovers(const std::vector<Row>& rows);
// Two levels (METHOD/hostR beside METHOD): for each method, the world
// sizes where two levels are faster than flat and where flat is, with the
// ratio at the largest size. Empty without two-level predictions.
std::vector<std::string> level_winners(const std::vector<Row>& rows);
nlohmann::ordered_json to_json(const perf::StepPrediction& p, const Row& row);
// One world size's table: each method's step and its parts.
void print_one(const Row& row);
// Two levels: each two-level method's time inside hosts and between them,
// and which bounds its step (the link of `host_link` inside a host).
void print_levels(const Row& row, const perf::CostProfile& host_link);
// "inside hosts" or "between hosts": the larger part of a two-level
// prediction's exchange.
std::string bounding_level(const perf::StepPrediction& p);
// Speed-up over dense per world size, one column per method.
void print_curve(const std::vector<Row>& rows);
// PNG figures of the curve and the breakdown into `dir`.
void write_plan_plots(const std::vector<Row>& rows, const std::string& dir,
                      const std::string& title);

}  // namespace sparsecomm::cli::plan_impl
