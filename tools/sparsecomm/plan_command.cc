#include "plan_command.h"

#include <algorithm>
#include <bit>
#include <charconv>
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
#include "sparsecomm/core/errors.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/perf/measured_scaling.h"
#include "sparsecomm/perf/step_model.h"
#include "sparsecomm/report/plots.h"
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
  double density = 0.01;
  std::string methods;
  int servers = 0;  // ps: S servers on hosts of their own (0: ps not planned)
  bool no_host_costs = false;
  double bucket_mb = 0.0;
  std::string values = "fp32";
  std::string format = "table";
  std::string plot_dir;
  std::vector<std::string> stats;  // bench sparsifiers JSON (measured statistics)
};

// Compression must beat dense by this much to be called worth it.
constexpr double kPaysFactor = 1.05;

// "421642", "25M", "1.3B" (decimal units K, M, B or G) -> a count >= 1;
// `option` names the option in the error.
double parse_count(const std::string& text, std::string_view option) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [rest, error] = std::from_chars(text.data(), end, value);
  double scale = 1.0;
  const std::string suffix(rest, end);
  if (suffix == "K" || suffix == "k")
    scale = 1e3;
  else if (suffix == "M")
    scale = 1e6;
  else if (suffix == "B" || suffix == "G")
    scale = 1e9;
  else if (!suffix.empty())
    scale = -1.0;
  if (error != std::errc() || scale < 0 || !(value * scale >= 1) || !std::isfinite(value)) {
    throw InvalidArgument(fmt::format(
        "{} '{}' is not a parameter count (examples: 421642, 25M, 1.3B)", option, text));
  }
  return std::round(value * scale);
}

// "4", "4,16,64" or "2-4096" (powers of two from the first to the last,
// both ends included) -> ascending world sizes.
std::vector<int> parse_ranks(const std::string& text) {
  auto one = [&](std::string_view item) {
    int value = 0;
    const auto [rest, error] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (error != std::errc() || rest != item.data() + item.size() || value < 1 ||
        value > (1 << 20)) {
      throw InvalidArgument(fmt::format(
          "--ranks '{}': '{}' is not a world size in 1..1048576 (examples: 64, 4,16,64, 2-4096)",
          text, item));
    }
    return value;
  };
  std::vector<int> out;
  if (const std::size_t dash = text.find('-'); dash != std::string::npos) {
    const int first = one(std::string_view(text).substr(0, dash));
    const int last = one(std::string_view(text).substr(dash + 1));
    if (last < first) {
      throw InvalidArgument(fmt::format("--ranks '{}': the range must ascend", text));
    }
    out.push_back(first);
    for (int n = static_cast<int>(std::bit_ceil(static_cast<unsigned>(first))); n < last; n *= 2) {
      if (n > first) out.push_back(n);
    }
    if (last > first) out.push_back(last);
  } else {
    for (const std::string& item : split_list(text, "--ranks")) out.push_back(one(item));
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return out;
}

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

struct Workload {
  std::string what;  // for the header
  double numel = 0.0;
  double dense_numel = 0.0;  // averaged densely beside the method
  std::string dense_rule;    // the options that chose them, for the header ("" for none)
  double compute_s = 0.0;
  std::string compute_source;
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
  set_dense_part(o, &probe, w);
  return w;
}

struct Row {
  int ranks = 0;
  std::vector<perf::StepPrediction> methods;  // in the order asked
  const perf::StepPrediction* dense = nullptr;
};

double speedup(const Row& row, const perf::StepPrediction& p) {
  return row.dense == nullptr ? std::nan("") : row.dense->step_s / p.step_s;
}

// The sentence on which method pays at one world size.
std::string verdict(const Row& row) {
  if (row.dense == nullptr) return "dense not among --methods: no verdict";
  const perf::StepPrediction* best = nullptr;
  for (const perf::StepPrediction& p : row.methods) {
    if (p.method == "dense") continue;
    if (best == nullptr || p.step_s < best->step_s) best = &p;
  }
  if (best == nullptr) return "only dense asked for";
  const double gain = row.dense->step_s / best->step_s;
  if (gain < kPaysFactor) {
    return fmt::format(
        "no compression method pays at {} ranks: the best, {}, is {:.2f}x dense; the network "
        "is fast enough that selection and index costs eat what fewer bytes save",
        row.ranks, best->method, gain);
  }
  return fmt::format(
      "{} pays most at {} ranks: {:.2f}x dense ({:.1f} ms against {:.1f} ms per step)",
      best->method, row.ranks, gain, best->step_s * 1e3, row.dense->step_s * 1e3);
}

// For each method, the world sizes where it stops (or starts) beating
// dense, between consecutive sizes asked for.
std::vector<std::string> crossovers(const std::vector<Row>& rows) {
  std::vector<std::string> out;
  if (rows.size() < 2 || rows.front().dense == nullptr) return out;
  for (std::size_t m = 0; m < rows.front().methods.size(); ++m) {
    const std::string& name = rows.front().methods[m].method;
    if (name == "dense") continue;
    std::vector<std::string> changes;
    for (std::size_t i = 1; i < rows.size(); ++i) {
      const bool before = speedup(rows[i - 1], rows[i - 1].methods[m]) >= 1.0;
      const bool after = speedup(rows[i], rows[i].methods[m]) >= 1.0;
      if (before != after) {
        changes.push_back(fmt::format("{} dense between {} and {} ranks",
                                      after ? "starts beating" : "stops beating", rows[i - 1].ranks,
                                      rows[i].ranks));
      }
    }
    const bool first = speedup(rows.front(), rows.front().methods[m]) >= 1.0;
    out.push_back(fmt::format(
        "{}: {}", name,
        changes.empty() ? std::string(first ? "beats dense at every size" : "never beats dense")
                        : fmt::format("{}{}", first ? "beats dense at first; " : "",
                                      fmt::join(changes, "; "))));
  }
  return out;
}

nlohmann::ordered_json to_json(const perf::StepPrediction& p, const Row& row) {
  nlohmann::ordered_json j;
  j["method"] = p.method;
  j["exchange"] = p.exchange;
  j["step_s"] = p.step_s;
  j["compute_s"] = p.compute_s;
  j["accumulate_s"] = p.accumulate_s;
  j["selection_s"] = p.selection_s;
  j["exchange_s"] = p.exchange_s;
  j["agreement_s"] = p.agreement_s;
  j["arrival_wait_s"] = p.arrival_wait_s;
  j["overlap_s"] = p.overlap_s;
  j["update_s"] = p.update_s;
  j["bytes_sent_per_rank"] = p.bytes_sent;
  j["bytes_received_per_rank"] = p.bytes_received;
  j["wire_bytes_sent_per_rank"] = p.wire_bytes_sent;
  j["density_ratio"] = p.density_ratio;
  j["imbalance"] = p.imbalance;
  j["statistics"] = p.statistics;
  const double s = speedup(row, p);
  j["speedup_vs_dense"] = std::isfinite(s) ? nlohmann::ordered_json(s) : nlohmann::ordered_json();
  return j;
}

void print_one(const Row& row) {
  std::vector<const perf::StepPrediction*> order;
  for (const perf::StepPrediction& p : row.methods) order.push_back(&p);
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return a->step_s < b->step_s; });
  fmt::print("{:<11} {:<30} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>11} {:>7} {:>8}\n",
             "method", "exchange", "step ms", "compute", "accum", "select", "exchange", "(wait)",
             "overlap", "update", "bytes/rank", "K/k", "vs dense");
  for (const perf::StepPrediction* p : order) {
    const double s = speedup(row, *p);
    fmt::print(
        "{:<11} {:<30} {:>9.2f} {:>9.2f} {:>8.2f} {:>8.2f} {:>9.2f} {:>8.2f} {:>8.2f} {:>8.2f} "
        "{:>11} {:>7.2f} {:>8}\n",
        p->method, p->exchange, p->step_s * 1e3, p->compute_s * 1e3, p->accumulate_s * 1e3,
        p->selection_s * 1e3, p->exchange_s * 1e3, p->arrival_wait_s * 1e3, p->overlap_s * 1e3,
        p->update_s * 1e3, format_bytes(p->bytes_sent), p->density_ratio,
        std::isfinite(s) ? fmt::format("{:.2f}x", s) : "-");
  }
}

void print_curve(const std::vector<Row>& rows) {
  fmt::print("{:>6} {:>12}", "ranks", "dense ms");
  for (const perf::StepPrediction& p : rows.front().methods) {
    if (p.method != "dense") fmt::print(" {:>10}", p.method);
  }
  fmt::print("  best\n");
  for (const Row& row : rows) {
    fmt::print("{:>6} {:>12}", row.ranks,
               row.dense ? fmt::format("{:.2f}", row.dense->step_s * 1e3) : "-");
    const perf::StepPrediction* best = nullptr;
    for (const perf::StepPrediction& p : row.methods) {
      if (best == nullptr || p.step_s < best->step_s) best = &p;
      if (p.method == "dense") continue;
      const double s = speedup(row, p);
      fmt::print(" {:>10}", std::isfinite(s) ? fmt::format("{:.2f}x", s) : "-");
    }
    fmt::print("  {}\n", best->method);
  }
}

void write_plan_plots(const std::vector<Row>& rows, const std::string& dir,
                      const std::string& title) {
  report::GnuplotFigures figures(dir, "`sparsecomm plan`");
  std::string curve = "# ranks";
  for (const perf::StepPrediction& p : rows.front().methods) curve += " " + p.method + "_speedup";
  for (const perf::StepPrediction& p : rows.front().methods) curve += " " + p.method + "_bytes";
  curve += "\n";
  for (const Row& row : rows) {
    curve += fmt::format("{}", row.ranks);
    for (const perf::StepPrediction& p : row.methods) {
      const double s = speedup(row, p);
      curve += std::isfinite(s) ? fmt::format(" {}", s) : " NaN";
    }
    for (const perf::StepPrediction& p : row.methods) curve += fmt::format(" {}", p.bytes_sent);
    curve += "\n";
  }
  figures.write_data("plan_curve.dat", curve);
  const std::size_t m = rows.front().methods.size();
  auto lines = [&](std::size_t first_column) {
    std::vector<std::string> items;
    for (std::size_t i = 0; i < m; ++i) {
      // Twelve colours, then dashes: one line style per method.
      static constexpr const char* kColors[] = {"#000000", "#1f77b4", "#d62728", "#2ca02c",
                                                "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                                                "#17becf", "#bcbd22", "#7f7f7f", "#393b79"};
      items.push_back(
          fmt::format("'plan_curve.dat' using 1:{} with linespoints lw 2 pt {} ps 0.8 "
                      "lc rgb '{}' dt {} title '{}'",
                      first_column + i, 5 + i % 4, kColors[i % 12], 1 + i / 12,
                      rows.front().methods[i].method));
    }
    return items;
  };
  if (rows.size() > 1) {
    figures.begin_png("speedup_vs_ranks.png");
    figures += fmt::format(
        "set title '{}'\nset xlabel 'ranks'\nset ylabel 'predicted speedup over dense'\n"
        "set logscale x 2\nset key outside right top\n",
        "Predicted speedup over dense: " + title);
    figures.plot(lines(2));
    figures.begin_png("bytes_vs_ranks.png");
    figures += fmt::format(
        "set title '{}'\nset xlabel 'ranks'\nset ylabel 'bytes sent per rank per step'\n"
        "set logscale x 2\nset logscale y 10\nset key outside right top\n",
        "Predicted bytes per rank: " + title);
    figures.plot(lines(2 + m));
  }
  const Row& last = rows.back();
  std::string breakdown = "# method compute accumulate selection exchange_less_overlap update\n";
  for (const perf::StepPrediction& p : last.methods) {
    breakdown +=
        fmt::format("{} {} {} {} {} {}\n", p.method, p.compute_s * 1e3, p.accumulate_s * 1e3,
                    p.selection_s * 1e3, (p.exchange_s - p.overlap_s) * 1e3, p.update_s * 1e3);
  }
  figures.write_data("plan_breakdown.dat", breakdown);
  figures.begin_png("breakdown.png");
  figures += fmt::format(
      "set title 'Predicted step at {} ranks: {}'\nset ylabel 'ms per step'\nset yrange [0:*]\n"
      "set style data histograms\nset style histogram rowstacked\n"
      "set style fill solid 0.85 border rgb 'black'\nset boxwidth 0.6\n"
      "set key outside right top\nset grid noxtics\nset xtics rotate by -30\n",
      last.ranks, title);
  figures.plot({"'plan_breakdown.dat' using 2:xtic(1) title 'compute'",
                "'' using 3 title 'accumulate'", "'' using 4 title 'selection'",
                "'' using 5 title 'exchange (less overlap)'", "'' using 6 title 'update'"});
  for (const auto& png : figures.draw()) fmt::print(stderr, "wrote {}\n", png.string());
}

void run_plan(const PlanOptions& o) {
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
  if (o.values != "fp32" && o.values != "fp16" && o.values != "bf16") {
    throw InvalidArgument(fmt::format("--values must be fp32, fp16 or bf16, got '{}'", o.values));
  }
  const std::vector<int> ranks = parse_ranks(o.ranks);
  std::vector<std::string> methods;
  if (o.methods.empty()) {
    // ps runs on hosts of its own (the servers): planned only when asked for.
    for (const std::string& m : perf::modeled_methods()) {
      if (m != "ps" || o.servers > 0) methods.push_back(m);
    }
  } else {
    methods = split_list(o.methods, "--methods");
  }
  if (o.servers == 0 && std::find(methods.begin(), methods.end(), "ps") != methods.end()) {
    throw InvalidArgument(
        "ps needs --servers S: the parameter servers run on S hosts besides the ranks");
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

  std::vector<Row> rows;
  for (const int n : ranks) {
    Row row;
    row.ranks = n;
    const perf::Scenario scenario{.ranks = n,
                                  .numel = work.numel,
                                  .dense_numel = work.dense_numel,
                                  .density = o.density,
                                  .compute_s = work.compute_s,
                                  .compute_spread_s = o.compute_spread_ms / 1e3,
                                  .bucket_bytes = o.bucket_mb * 1024 * 1024,
                                  .servers = std::max(1, o.servers),
                                  .value_bytes = o.values == "fp32" ? 4.0 : 2.0,
                                  .statistics = o.stats.empty() ? nullptr : &measured.table};
    for (const std::string& method : methods) {
      row.methods.push_back(perf::predict_step(method, scenario, profile));
    }
    rows.push_back(std::move(row));
  }
  for (Row& row : rows) {
    for (const perf::StepPrediction& p : row.methods) {
      if (p.method == "dense") row.dense = &p;
    }
  }
  const std::string title = fmt::format("{}, c = {:g}, {}", work.what, o.density, profile.name);

  if (o.format == "json") {
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
    j["values"] = o.values;
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
    std::cout << j.dump(2) << "\n";
  } else {
    fmt::print("plan: {}, compute {:.2f} ms per step ({}{}), c = {:g}, {}\n", work.what,
               work.compute_s * 1e3, work.compute_source,
               o.compute_spread_ms > 0
                   ? fmt::format("; spread {:g} ms: the step waits for the slowest rank",
                                 o.compute_spread_ms)
                   : "",
               o.density,
               o.bucket_mb > 0 ? fmt::format("buckets of {:g} MiB", o.bucket_mb) : "not pipelined");
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
    fmt::print("{}statistics of the sparse schemes: {}\n\n",
               o.servers == 0
                   ? std::string()
                   : fmt::format("ps: BSP, {} server(s) on hosts of their own; ", o.servers),
               statistics);
    if (rows.size() == 1) {
      print_one(rows.front());
    } else {
      print_curve(rows);
      fmt::print("\nbreakdown at {} ranks:\n", rows.back().ranks);
      print_one(rows.back());
      fmt::print("\ncrossovers:\n");
      for (const std::string& line : crossovers(rows)) fmt::print("  {}\n", line);
    }
    fmt::print("\n{}\n", verdict(rows.back()));
  }
  if (!o.plot_dir.empty()) write_plan_plots(rows, o.plot_dir, title);
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
  cmd->add_option("--values", options->values, "value encoding on the wire: fp32, fp16, bf16")
      ->capture_default_str();
  cmd->add_option("--stats", options->stats,
                  "measured statistics instead of the built-in ones: `bench sparsifiers --trace "
                  "TRACE -n N --format json` outputs, one per world size N (K/k, per-rank "
                  "selection, imbalance; extended past the largest N by the model's laws)");
  cmd->add_option("--format", options->format, "table | json")->capture_default_str();
  cmd->add_option("--plot", options->plot_dir,
                  "write PNGs here: speedup and bytes versus ranks, the breakdown");
  cmd->callback([options] { run_plan(*options); });
}

}  // namespace sparsecomm::cli
