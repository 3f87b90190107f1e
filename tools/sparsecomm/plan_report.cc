#include "plan_report.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli_util.h"
#include "sparsecomm/report/plots.h"

namespace sparsecomm::cli::plan_impl {
namespace {

// Compression must beat dense by this much to be called worth it.
constexpr double kPaysFactor = 1.05;

}  // namespace

double speedup(const Row& row, const perf::StepPrediction& p) {
  return row.dense == nullptr ? std::nan("") : row.dense->step_s / p.step_s;
}

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

std::vector<std::string> level_winners(const std::vector<Row>& rows) {
  std::vector<std::string> out;
  if (rows.empty()) return out;
  const std::vector<perf::StepPrediction>& first = rows.front().methods;
  for (std::size_t flat = 0; flat < first.size(); ++flat) {
    const std::string& name = first[flat].method;
    const auto two = std::find_if(first.begin(), first.end(), [&](const perf::StepPrediction& p) {
      return p.method.starts_with(name + "/host");
    });
    if (name.find('/') != std::string::npos || two == first.end()) continue;
    const auto paired = static_cast<std::size_t>(two - first.begin());
    // Runs of consecutive sizes with the same winner: "flat at 8-64".
    std::vector<std::string> runs;
    std::size_t begin = 0;
    const auto two_wins = [&](std::size_t i) {
      return rows[i].methods[paired].step_s < rows[i].methods[flat].step_s;
    };
    for (std::size_t i = 1; i <= rows.size(); ++i) {
      if (i < rows.size() && two_wins(i) == two_wins(begin)) continue;
      const std::string sizes = i - 1 == begin
                                    ? fmt::format("{}", rows[begin].ranks)
                                    : fmt::format("{}-{}", rows[begin].ranks, rows[i - 1].ranks);
      runs.push_back(fmt::format("{} at {} ranks", two_wins(begin) ? "two levels" : "flat", sizes));
      begin = i;
    }
    const Row& last = rows.back();
    out.push_back(fmt::format("{}: {} (at {} ranks {} runs at {:.2f}x flat's speed)", name,
                              fmt::join(runs, ", "), last.ranks, two->method,
                              last.methods[flat].step_s / last.methods[paired].step_s));
  }
  return out;
}

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
  if (p.host_s > 0) {
    j["host_s"] = p.host_s;
    j["between_hosts_s"] = p.exchange_s - p.host_s - p.arrival_wait_s;
    j["bound_by"] = bounding_level(p);
  }
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

std::string bounding_level(const perf::StepPrediction& p) {
  const double between = p.exchange_s - p.host_s - p.arrival_wait_s;
  return p.host_s > between ? "inside hosts" : "between hosts";
}

void print_levels(const Row& row, const perf::CostProfile& host_link) {
  fmt::print("\ntwo levels at {} ranks (inside a host: alpha {:.3g} us, {:.3g} Gbit/s):\n",
             row.ranks, host_link.alpha_s * 1e6, 8.0 / host_link.beta_s_per_byte / 1e9);
  for (const perf::StepPrediction& p : row.methods) {
    if (p.host_s <= 0) continue;
    fmt::print("  {:<18} inside hosts {:>9.2f} ms, between hosts {:>9.2f} ms: bound {}\n", p.method,
               p.host_s * 1e3, (p.exchange_s - p.host_s - p.arrival_wait_s) * 1e3,
               bounding_level(p));
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

}  // namespace sparsecomm::cli::plan_impl
