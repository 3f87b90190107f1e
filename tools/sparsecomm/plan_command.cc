#include "plan_command.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cli_util.h"
#include "plan_report.h"
#include "plan_time_to_target.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/perf/measured_scaling.h"
#include "sparsecomm/perf/step_model.h"
#include "sparsecomm/sync/dense_layers.h"
#include "sparsecomm/train/model_probe.h"

namespace sparsecomm::cli {
// Named so that the tool's sources can compile as one unit (UNITY_BUILD).
namespace plan_impl {
namespace {

struct PlanOptions {
  std::string model;
  std::string params;
  // Tensors averaged densely beside the method: by size and name (with
  // --model, as train's options), or a count (--dense-params).
  std::int64_t min_numel = 0;
  std::vector<std::string> exclude;
  std::string dense_params;
  std::optional<double> compute_ms;
  double compute_spread_ms = 0.0;  // std. deviation of one rank's compute per step
  std::int64_t batch = 64;
  int threads = 1;
  std::string profile;
  std::optional<double> link_gbit;
  std::optional<double> latency_us;
  std::string ranks = "4";
  // Two levels (train's --ranks-per-host): also each method between hosts
  // of this many ranks, inside them on a link of its own.
  int ranks_per_host = 1;
  double host_link_gbit = 100.0;
  double host_latency_us = 2.0;
  std::string host_profile;  // a calibrated profile of the link inside a host
  double density = 0.01;
  std::string methods;
  int servers = 0;  // ps: S servers on hosts of their own (0: ps not planned)
  bool no_host_costs = false;
  double bucket_mb = 0.0;
  int local_steps = 0;  // > 0: train's --local-steps H (per inner step; dense also every step)
  bool outer_overlap = false;  // train's --outer-overlap
  std::string values = "fp32";
  std::string exchange;   // empty: each scheme's own
  int powersgd_rank = 1;  // PowerSGD's rank r (train's -m powersgd -o rank=R)
  std::string format = "table";
  std::string plot_dir;
  std::vector<std::string> stats;  // bench sparsifiers JSON (measured statistics)
  // Time to a target: a convergence profile and the target (one of the two).
  std::string convergence;
  std::optional<double> target_loss;
  std::optional<double> target_accuracy;  // percent
};

perf::CostProfile profile_of(const PlanOptions& o) {
  if (!o.profile.empty()) {
    if (o.link_gbit || o.latency_us) {
      throw InvalidArgument(
          "give either --profile or --link-gbit/--latency-us: a profile already names its network");
    }
    return perf::load_profile(o.profile);
  }
  return perf::network_profile(o.link_gbit.value_or(10.0), o.latency_us.value_or(5.0));
}

// The link inside a host (--host-profile, or --host-link-gbit and
// --host-latency-us); checks that --ranks-per-host divides every world size.
perf::CostProfile host_link_of(const PlanOptions& o, const std::vector<int>& ranks) {
  for (const int n : ranks) {
    if (o.ranks_per_host < 1 || n % o.ranks_per_host != 0) {
      throw InvalidArgument(fmt::format(
          "--ranks-per-host {} does not divide {} ranks into hosts; give 1 or more that divides "
          "every world size",
          o.ranks_per_host, n));
    }
  }
  if (!(o.host_link_gbit > 0) || !(o.host_latency_us >= 0)) {
    throw InvalidArgument(fmt::format(
        "--host-link-gbit {} / --host-latency-us {}: give a rate > 0 and a latency >= 0",
        o.host_link_gbit, o.host_latency_us));
  }
  if (!o.host_profile.empty()) return perf::load_profile(o.host_profile);
  perf::CostProfile link = perf::network_profile(o.host_link_gbit, o.host_latency_us);
  link.name = "inside a host";
  return link;
}

struct Workload {
  std::string what;  // for the header
  double numel = 0.0;
  double dense_numel = 0.0;  // averaged densely beside the method
  std::string dense_rule;    // the options that chose them, for the header ("" for none)
  double compute_s = 0.0;
  std::string compute_source;
  // With --model: the tensors the method runs on (those not averaged
  // densely beside it), whose shapes price PowerSGD; empty with --params.
  std::vector<LayerSpan> method_tensors;
};

// The parameters averaged densely beside the method, from --dense-params
// or, with --model, --min-numel and --exclude as train applies them.
void set_dense_part(const PlanOptions& o, const ModelProbe* probe, Workload& w) {
  const bool by_rule = o.min_numel != 0 || !o.exclude.empty();
  if (o.min_numel < 0) {
    throw InvalidArgument(fmt::format("--min-numel must be >= 0, got {}", o.min_numel));
  }
  if (by_rule && !o.dense_params.empty()) {
    throw InvalidArgument(
        "give either --dense-params or --min-numel/--exclude: both say which parameters are "
        "averaged densely");
  }
  if (!o.dense_params.empty()) {
    w.dense_numel = parse_count(o.dense_params, "--dense-params");
    w.dense_rule = fmt::format("--dense-params {}", o.dense_params);
    if (w.dense_numel >= w.numel) {
      throw InvalidArgument(fmt::format(
          "--dense-params {} leaves none of the model's {:.4g} parameters to sparsify; give fewer, "
          "or plan --methods dense alone",
          o.dense_params, w.numel));
    }
  } else if (by_rule) {
    if (probe == nullptr) {
      throw InvalidArgument(
          "--min-numel and --exclude pick tensors by size and name, which --params does not "
          "give: name one of the tool's models with --model, or give their count with "
          "--dense-params");
    }
    DenseLayerRule rule;
    rule.min_numel = static_cast<std::size_t>(o.min_numel);
    rule.patterns = o.exclude;
    w.dense_numel = static_cast<double>(dense_numel(rule, probe->tensors, o.model));
    std::erase_if(w.method_tensors, [&](const LayerSpan& t) { return rule.matches(t); });
    std::vector<std::string> options;
    if (o.min_numel > 0) options.push_back(fmt::format("--min-numel {}", o.min_numel));
    for (const std::string& pattern : o.exclude) {
      options.push_back(fmt::format("--exclude '{}'", pattern));
    }
    w.dense_rule = fmt::format("{}", fmt::join(options, " "));
  }
}

Workload workload_of(const PlanOptions& o) {
  if (o.model.empty() == o.params.empty()) {
    throw InvalidArgument(
        "give the model: --model NAME (one of `sparsecomm train`'s) or --params N");
  }
  if (o.compute_ms && (!std::isfinite(*o.compute_ms) || *o.compute_ms < 0)) {
    throw InvalidArgument(
        fmt::format("--compute-ms must be a finite number >= 0, got {}", *o.compute_ms));
  }
  Workload w;
  if (!o.params.empty()) {
    if (!o.compute_ms) {
      throw InvalidArgument(
          "--params needs --compute-ms (forward + backward per step on one rank): it cannot be "
          "measured without a model; or name one of the tool's models with --model");
    }
    w.numel = parse_count(o.params, "--params");
    w.what = fmt::format("{:.4g} parameters", w.numel);
    w.compute_s = *o.compute_ms / 1e3;
    w.compute_source = "given";
    set_dense_part(o, nullptr, w);
    return w;
  }
  // With --compute-ms, the sizes alone: probe with one timed pass.
  const ModelProbe probe =
      o.compute_ms ? probe_model(o.model, 1, 1, 1) : probe_model(o.model, o.batch, o.threads, 5);
  w.numel = static_cast<double>(probe.numel);
  if (o.compute_ms) {
    w.compute_s = *o.compute_ms / 1e3;
    w.compute_source = "given";
  } else {
    w.compute_s = probe.compute_s;
    w.compute_source =
        fmt::format("measured here: batch {}, {} thread(s), median of 5", o.batch, o.threads);
  }
  w.what = fmt::format("{} ({} parameters)", o.model, static_cast<long long>(w.numel));
  w.method_tensors = probe.tensors;
  set_dense_part(o, &probe, w);
  return w;
}

// The options' checks; the methods to plan.
std::vector<std::string> check_plan_options(const PlanOptions& o) {
  check_format(o.format);
  if (!(o.density > 0 && o.density <= 1)) {
    throw InvalidArgument(fmt::format("--density must be in (0, 1], got {}", o.density));
  }
  if (o.servers < 0)
    throw InvalidArgument(fmt::format("--servers must be >= 0, got {}", o.servers));
  if (!(o.compute_spread_ms >= 0) || !std::isfinite(o.compute_spread_ms)) {
    throw InvalidArgument(fmt::format(
        "--compute-spread-ms must be a finite number >= 0 (the standard deviation of one rank's "
        "compute time per step), got {}",
        o.compute_spread_ms));
  }
  if (!(o.bucket_mb >= 0) || !std::isfinite(o.bucket_mb)) {
    throw InvalidArgument(fmt::format("--bucket-mb must be >= 0, got {}", o.bucket_mb));
  }
  if (o.local_steps < 0) {
    throw InvalidArgument(fmt::format(
        "--local-steps must be >= 0 (0: synchronize every step), got {}", o.local_steps));
  }
  if (o.outer_overlap && o.local_steps == 0) {
    throw InvalidArgument(
        "--outer-overlap hides a round's exchange behind the next round: give --local-steps H");
  }
  if (o.local_steps > 0 && o.bucket_mb > 0) {
    throw InvalidArgument(
        "--local-steps and --bucket-mb: a round's pseudo-gradient exists only after its last "
        "step, so nothing overlaps backward; drop --bucket-mb");
  }
  if (o.powersgd_rank < 1) {
    throw InvalidArgument(fmt::format("--powersgd-rank must be >= 1, got {}", o.powersgd_rank));
  }
  if (std::ranges::count(value_encoding_names(), o.values) == 0) {
    throw InvalidArgument(fmt::format("--values must be one of {}, got '{}'",
                                      fmt::join(value_encoding_names(), ", "), o.values));
  }
  std::vector<std::string> methods;
  if (o.methods.empty()) {
    // ps runs on hosts of its own (the servers): planned only when asked
    // for; PowerSGD's cost needs the tensors' shapes (--model); rounds of
    // --local-steps only with the methods that can synchronize them.
    for (const std::string& m : perf::modeled_methods()) {
      if ((m != "ps" || o.servers > 0) && (!perf::needs_tensor_shapes(m) || !o.model.empty()) &&
          (o.local_steps == 0 || perf::takes_local_steps(m))) {
        methods.push_back(m);
      }
    }
  } else {
    methods = split_list(o.methods, "--methods");
  }
  const bool asks_ps = std::find(methods.begin(), methods.end(), "ps") != methods.end();
  if (o.local_steps > 0 && asks_ps) {
    throw InvalidArgument(
        "--local-steps: parameter-server workers push every step; drop ps from --methods");
  }
  if (o.servers == 0 && asks_ps) {
    throw InvalidArgument(
        "ps needs --servers S: the parameter servers run on S hosts besides the ranks");
  }
  return methods;
}

// The scenario of the options at `ranks`.
perf::Scenario scenario_of(const PlanOptions& o, int ranks, const Workload& work,
                           const perf::MeasuredScaling& measured) {
  return {.ranks = ranks,
          .numel = work.numel,
          .dense_numel = work.dense_numel,
          .density = o.density,
          .compute_s = work.compute_s,
          .compute_spread_s = o.compute_spread_ms / 1e3,
          .bucket_bytes = o.bucket_mb * 1024 * 1024,
          .servers = std::max(1, o.servers),
          .local_steps = o.local_steps,
          .overlap_rounds = o.outer_overlap,
          .values = parse_value_encoding(o.values),
          .tensors = work.method_tensors,
          .low_rank = o.powersgd_rank,
          .statistics = o.stats.empty() ? nullptr : &measured.table,
          .exchange = o.exchange.empty()
                          ? std::nullopt
                          : std::optional<ExchangePattern>(parse_exchange_pattern(o.exchange))};
}

// The target of --target-loss / --target-accuracy; checks them against
// --convergence.
std::optional<perf::Target> target_of(const PlanOptions& o) {
  if (o.convergence.empty()) {
    if (o.target_loss || o.target_accuracy) {
      throw InvalidArgument(
          "--target-loss and --target-accuracy need --convergence PROFILE (the steps each "
          "configuration takes to the target; `sparsecomm convergence --help`)");
    }
    return std::nullopt;
  }
  return perf::target_from_flags(o.target_loss, o.target_accuracy, "--convergence");
}

// The predicted step of each method at each world size.
std::vector<Row> predict_rows(const PlanOptions& o, const std::vector<int>& ranks,
                              const std::vector<std::string>& methods,
                              const perf::CostProfile& profile, const perf::CostProfile& host_link,
                              const Workload& work, const perf::MeasuredScaling& measured) {
  std::vector<Row> rows;
  for (const int n : ranks) {
    Row row;
    row.ranks = n;
    const perf::Scenario scenario = scenario_of(o, n, work, measured);
    for (const std::string& method : methods) {
      row.methods.push_back(perf::predict_step(method, scenario, profile));
      if (o.local_steps > 0) {
        row.methods.back().method +=
            fmt::format("@h{}{}", o.local_steps, o.outer_overlap ? "o" : "");
      }
    }
    if (o.ranks_per_host > 1) {
      perf::Scenario two_level = scenario;
      two_level.ranks_per_host = o.ranks_per_host;
      two_level.host_link = &host_link;
      for (const std::string& method : methods) {
        if (method == "ps") continue;  // one level only
        perf::StepPrediction p = perf::predict_step(method, two_level, profile);
        p.method += fmt::format("/host{}", o.ranks_per_host);
        row.methods.push_back(std::move(p));
      }
    }
    // With local steps "dense" is the reference of every step's ring
    // all-reduce (DDP); dense@hH is dense outer synchronization (DiLoCo).
    if (o.local_steps > 0 && std::find(methods.begin(), methods.end(), "dense") != methods.end()) {
      perf::Scenario every_step = scenario;
      every_step.local_steps = 0;
      every_step.overlap_rounds = false;
      row.methods.push_back(perf::predict_step("dense", every_step, profile));
    }
    rows.push_back(std::move(row));
  }
  for (Row& row : rows) {
    for (const perf::StepPrediction& p : row.methods) {
      if (p.method == "dense") row.dense = &p;
    }
  }
  return rows;
}

void print_plan_json(const PlanOptions& o, const Workload& work, const perf::CostProfile& profile,
                     const std::vector<Row>& rows, nlohmann::ordered_json time_to_target) {
  nlohmann::ordered_json j;
  j["model"] = work.what;
  j["numel"] = work.numel;
  j["dense_numel"] = work.dense_numel;
  j["compute_s"] = work.compute_s;
  j["compute_source"] = work.compute_source;
  j["compute_spread_s"] = o.compute_spread_ms / 1e3;
  j["density"] = o.density;
  j["servers"] = o.servers;
  j["bucket_mb"] = o.bucket_mb;
  j["local_steps"] = o.local_steps;
  j["outer_overlap"] = o.outer_overlap;
  j["values"] = o.values;
  j["exchange"] = o.exchange.empty() ? "own" : o.exchange;
  j["powersgd_rank"] = o.powersgd_rank;
  j["profile"] = perf::to_json(profile);
  j["statistics_files"] = o.stats;
  for (const Row& row : rows) {
    nlohmann::ordered_json r;
    r["ranks"] = row.ranks;
    for (const perf::StepPrediction& p : row.methods) r["methods"].push_back(to_json(p, row));
    r["verdict"] = verdict(row);
    j["predictions"].push_back(r);
  }
  j["crossovers"] = crossovers(rows);
  j["two_levels_against_flat"] = level_winners(rows);
  if (!time_to_target.is_null()) j["time_to_target"] = std::move(time_to_target);
  std::cout << j.dump(2) << "\n";
}

void print_plan_text(const PlanOptions& o, const Workload& work, const perf::CostProfile& profile,
                     const perf::MeasuredScaling& measured, const std::vector<Row>& rows) {
  const std::vector<std::string> measured_schemes = measured.table.schemes();
  fmt::print(
      "plan: {}, compute {:.2f} ms per step ({}{}), c = {:g}{}, {}\n", work.what,
      work.compute_s * 1e3, work.compute_source,
      o.compute_spread_ms > 0 ? fmt::format("; spread {:g} ms: the step waits for the slowest rank",
                                            o.compute_spread_ms)
                              : "",
      o.density,
      std::ranges::any_of(rows.front().methods,
                          [](const perf::StepPrediction& p) { return p.method == "powersgd"; })
          ? fmt::format(", powersgd rank {}", o.powersgd_rank)
          : std::string(),
      o.local_steps > 0
          ? fmt::format("local steps: rounds of {}{} (per inner step; dense syncs every step)",
                        o.local_steps,
                        o.outer_overlap ? ", each exchanged during the next (METHOD@hHo)" : "")
      : o.bucket_mb > 0 ? fmt::format("buckets of {:g} MiB", o.bucket_mb)
                        : "not pipelined");
  if (work.dense_numel > 0) {
    fmt::print(
        "dense beside the method: {:.0f} of the {:.0f} parameters ({}), ring all-reduced; the "
        "sparse methods and Skip-Reduce run on the other {:.0f} (dgc's default momentum "
        "correction refuses them: train it with memory=ef)\n",
        work.dense_numel, work.numel, work.dense_rule, work.numel - work.dense_numel);
  }
  fmt::print("network: {} (alpha {:.3g} us, {:.3g} Gbit/s per direction; {})\n", profile.name,
             profile.alpha_s * 1e6, 8.0 / profile.beta_s_per_byte / 1e9,
             profile.source.empty() ? "no source given" : profile.source);
  const std::string statistics =
      measured_schemes.empty()
          ? std::string("built-in (synthetic stream)")
          : fmt::format("measured for {} ({}), built-in (synthetic stream) for the others{}",
                        fmt::join(measured_schemes, ", "), fmt::join(o.stats, ", "),
                        measured.unused.empty() ? std::string()
                                                : fmt::format("; not used by the model: {}",
                                                              fmt::join(measured.unused, ", ")));
  fmt::print(
      "{}statistics of the sparse schemes: {}\n{}\n",
      o.servers == 0 ? std::string()
                     : fmt::format("ps: BSP, {} server(s) on hosts of their own; ", o.servers),
      statistics, o.exchange.empty() ? "" : "per-rank schemes' exchange: " + o.exchange + "\n");
  if (rows.size() == 1) {
    print_one(rows.front());
  } else {
    print_curve(rows);
    fmt::print("\nbreakdown at {} ranks:\n", rows.back().ranks);
    print_one(rows.back());
    fmt::print("\ncrossovers:\n");
    for (const std::string& line : crossovers(rows)) fmt::print("  {}\n", line);
  }
  if (const std::vector<std::string> levels = level_winners(rows); !levels.empty()) {
    fmt::print("\ntwo levels against flat (faster where named):\n");
    for (const std::string& line : levels) fmt::print("  {}\n", line);
  }
  fmt::print("\n{}\n", verdict(rows.back()));
}

void run_plan(const PlanOptions& o) {
  const std::vector<std::string> methods = check_plan_options(o);
  const std::vector<int> ranks = parse_ranks(o.ranks);
  const std::optional<perf::Target> target = target_of(o);
  std::optional<perf::ConvergenceProfile> convergence;
  if (target) {
    convergence = perf::load_convergence_profile(o.convergence);
    if (!o.model.empty() && o.model != convergence->model) {
      throw InvalidArgument(fmt::format(
          "--convergence {} was measured on '{}', not --model {}: steps to a target belong to "
          "one model; profile this one, or plan --model {}",
          o.convergence, convergence->model, o.model, convergence->model));
    }
  }
  perf::CostProfile profile = profile_of(o);
  // The network-only bound: only bytes and messages remain (the best case
  // for compression).
  if (o.no_host_costs) profile = perf::without_host_costs(profile);
  const Workload work = workload_of(o);
  const perf::MeasuredScaling measured =
      o.stats.empty() ? perf::MeasuredScaling{} : perf::load_bench_statistics(o.stats);
  const std::vector<std::string> measured_schemes = measured.table.schemes();
  if (!o.stats.empty() && measured_schemes.empty()) {
    throw InvalidArgument(
        "--stats: the files hold no statistics the model uses (it scales topk, dgc, gaussiank, "
        "micro, exdyna and deft)");
  }

  const perf::CostProfile host_link = host_link_of(o, ranks);
  const std::vector<Row> rows = predict_rows(o, ranks, methods, profile, host_link, work, measured);
  std::vector<TargetRow> target_rows;
  if (target) {
    target_rows = predict_time_to_target(perf::outcomes(*convergence, *target), ranks,
                                         scenario_of(o, ranks.front(), work, measured), profile);
  }
  if (o.format == "json") {
    print_plan_json(o, work, profile, rows,
                    target ? time_to_target_json(target_rows, *convergence, o.convergence, *target)
                           : nlohmann::ordered_json());
  } else {
    print_plan_text(o, work, profile, measured, rows);
    if (o.ranks_per_host > 1) print_levels(rows.back(), host_link);
    if (target) print_time_to_target(target_rows, *convergence, o.convergence, *target);
  }
  if (!o.plot_dir.empty()) {
    write_plan_plots(rows, o.plot_dir,
                     fmt::format("{}, c = {:g}, {}", work.what, o.density, profile.name));
  }
}

}  // namespace
}  // namespace plan_impl

void add_plan_command(CLI::App& app) {
  using namespace plan_impl;
  auto options = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Rank the synchronization methods by predicted step time on a network, with the "
      "breakdown, bytes per rank and speedup over dense (the performance model)");
  cmd->add_option("--model", options->model,
                  "one of the tool's models (its size; its compute time measured here unless "
                  "--compute-ms is given)");
  cmd->add_option("--params", options->params, "a parameter count instead (e.g. 25M, 350M, 1.3B)");
  cmd->add_option("--min-numel", options->min_numel,
                  "with --model: tensors with fewer elements are averaged densely beside the "
                  "method, as train's --min-numel does");
  cmd->add_option("--exclude", options->exclude,
                  "with --model: tensors whose name matches one of these shell patterns are "
                  "averaged densely beside the method, as train's --exclude does");
  cmd->add_option("--dense-params", options->dense_params,
                  "parameters averaged densely beside the method, as a count (e.g. 50K; for "
                  "--params)");
  cmd->add_option("--compute-ms", options->compute_ms,
                  "forward + backward per step on one rank, in ms");
  cmd->add_option("--compute-spread-ms", options->compute_spread_ms,
                  "standard deviation of one rank's compute time per step, in ms (a run's "
                  "summary.json: compute_spread_s): a synchronous step waits for the slowest of n "
                  "ranks, about spread x sqrt(2 ln n) longer")
      ->capture_default_str();
  cmd->add_option("--batch", options->batch, "batch of the measured compute time")
      ->capture_default_str();
  cmd->add_option("--threads", options->threads, "threads of the measured compute time")
      ->capture_default_str();
  cmd->add_option("--profile", options->profile,
                  "a cost profile (JSON) from `sparsecomm calibrate`");
  cmd->add_option("--link-gbit", options->link_gbit,
                  "link rate per direction in Gbit/s (default 10)");
  cmd->add_option("--latency-us", options->latency_us, "per-message latency in us (default 5)");
  cmd->add_option("-n,--ranks", options->ranks,
                  "world sizes: 64, 4,16,64 or a range 2-4096 (powers of two)")
      ->capture_default_str();
  cmd->add_option("--ranks-per-host", options->ranks_per_host,
                  "train's --ranks-per-host R: also every method on two levels (METHOD/hostR: "
                  "the host's all-reduce on the link inside it, the method among one leader per "
                  "host, the broadcast), with the level that bounds its step")
      ->capture_default_str();
  cmd->add_option("--host-link-gbit", options->host_link_gbit,
                  "with --ranks-per-host: the link inside a host in Gbit/s per direction")
      ->capture_default_str();
  cmd->add_option("--host-latency-us", options->host_latency_us,
                  "with --ranks-per-host: its per-message latency in us")
      ->capture_default_str();
  cmd->add_option("--host-profile", options->host_profile,
                  "with --ranks-per-host: a cost profile of the link inside a host from "
                  "`sparsecomm calibrate` on one host's ranks (instead of --host-link-gbit)");
  cmd->add_option("-c,--density", options->density, "target density c")->capture_default_str();
  cmd->add_option("--methods", options->methods,
                  "comma-separated methods (default: every modeled one)");
  cmd->add_option("--servers", options->servers,
                  "also plan ps (BSP, dense pushes) with S servers on hosts of their own")
      ->capture_default_str();
  cmd->add_flag("--no-host-costs", options->no_host_costs,
                "the network-only bound: host costs (selection, accumulate, update, reduction) 0");
  cmd->add_option("--bucket-mb", options->bucket_mb, "pipelining: bucket size in MiB (0: off)")
      ->capture_default_str();
  cmd->add_option("--local-steps", options->local_steps,
                  "train's --local-steps H: one synchronization per H steps, times per inner step "
                  "(methods as METHOD@hH; dense stays every step for reference; 0: off)")
      ->capture_default_str();
  cmd->add_flag("--outer-overlap", options->outer_overlap,
                "with --local-steps: train's --outer-overlap, a round's exchange hidden behind the "
                "next round's compute (METHOD@hHo)");
  cmd->add_option("--values", options->values,
                  "value encoding on the wire: fp32, fp16, bf16, int8, int4, int2 (-sr: "
                  "stochastic rounding), sign, nat, lloyd2; dense's ring takes fp16 and bf16 and "
                  "stays fp32 for the others")
      ->capture_default_str();
  cmd->add_option("--exchange", options->exchange,
                  "exchange pattern of the schemes that select per rank (train's -o exchange=): "
                  "union, allgather, sparse-allreduce or ok-topk (default: each scheme's own)");
  cmd->add_option("--powersgd-rank", options->powersgd_rank,
                  "PowerSGD's rank r (train's -m powersgd -o rank=R); powersgd is planned with "
                  "--model, whose tensors' shapes set its cost")
      ->capture_default_str();
  cmd->add_option("--stats", options->stats,
                  "measured statistics instead of the built-in ones: `bench sparsifiers --trace "
                  "TRACE -n N --format json` outputs, one per world size N (K/k, per-rank "
                  "selection, imbalance; extended past the largest N by the model's laws)");
  cmd->add_option("--convergence", options->convergence,
                  "a convergence profile (`sparsecomm convergence`): also rank its "
                  "configurations by predicted time to the target, their measured steps to it "
                  "times their predicted step");
  cmd->add_option("--target-loss", options->target_loss,
                  "with --convergence: the target is a held-out loss at or below this");
  cmd->add_option("--target-accuracy", options->target_accuracy,
                  "with --convergence: the target is a test accuracy at or above this percentage");
  cmd->add_option("--format", options->format, "table | json")->capture_default_str();
  cmd->add_option("--plot", options->plot_dir,
                  "write PNGs here: speedup and bytes versus ranks, the breakdown");
  cmd->footer(
      "Time to a target: pilot runs make a convergence profile. With the tool's models, run "
      "`sparsecomm train` a few times (the schedule you will use, --eval-every a few steps; dense "
      "and the methods and densities you would consider), then `sparsecomm convergence "
      "RUN_DIR... -o conv.json`. With a PyTorch model of your own, record your loop's pilot runs "
      "with sparsecomm.PilotRun and write_convergence_profile (docs/python.md, \"Choosing the "
      "density\") and plan it with --params N --compute-ms M. Then `plan --convergence conv.json "
      "--target-accuracy P` (or --target-loss X). docs/algorithms.md, \"Time to accuracy\".");
  cmd->callback([options] { run_plan(*options); });
}

}  // namespace sparsecomm::cli
