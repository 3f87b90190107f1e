#include "sparsecomm/perf/measured_scaling.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/perf/json_file.h"
#include "sparsecomm/perf/step_model.h"

namespace sparsecomm::perf {
namespace {

double number(const nlohmann::json& row, const char* field, std::string_view where) {
  const auto it = row.find(field);
  if (it == row.end() || !it->is_number() || !std::isfinite(it->get<double>())) {
    throw InvalidArgument(fmt::format(
        "{}: '{}' must be a finite number (is this `sparsecomm bench sparsifiers --format json` "
        "output? Files from before selected_mean existed need a rerun)",
        where, field));
  }
  return it->get<double>();
}

struct Series {
  double numel = 0.0;
  bool independent = false;
  std::vector<ScalingPoint> points;
};

}  // namespace

MeasuredScaling scaling_from_bench_rows(std::span<const BenchRows> inputs) {
  MeasuredScaling out;
  std::map<std::pair<std::string, double>, Series> series;
  for (const BenchRows& input : inputs) {
    if (!input.rows.is_array()) {
      throw InvalidArgument(
          fmt::format("{}: expected the JSON array of `sparsecomm bench sparsifiers --format json`",
                      input.origin));
    }
    for (std::size_t i = 0; i < input.rows.size(); ++i) {
      const nlohmann::json& row = input.rows[i];
      const std::string where = fmt::format("{}, row {}", input.origin, i);
      if (!row.is_object() || !row.contains("scheme") || !row["scheme"].is_string()) {
        throw InvalidArgument(fmt::format("{}: a bench row is an object with a 'scheme'", where));
      }
      const std::string scheme = row["scheme"].get<std::string>();
      if (row.contains("skipped") && !row["skipped"].is_null()) continue;  // not measured
      if (!has_scheme_statistics(scheme)) {
        out.unused.push_back(scheme);
        continue;
      }
      const double numel = number(row, "numel", where);
      const double density = number(row, "density", where);
      const double workers = number(row, "workers", where);
      if (!(numel >= 1) || !(density > 0 && density <= 1) || !(workers >= 1) ||
          workers != std::floor(workers)) {
        throw InvalidArgument(
            fmt::format("{}: needs numel >= 1, density in (0, 1] and a whole workers >= 1", where));
      }
      const double k = std::max(1.0, std::floor(density * numel));
      const bool independent = selects_independently(scheme);
      ScalingPoint point;
      point.ranks = static_cast<int>(workers);
      point.density_ratio = number(row, "density_ratio_mean", where);
      point.selected_ratio =
          independent ? number(row, "selected_mean", where) / k : point.density_ratio;
      point.imbalance = number(row, "imbalance_mean", where);
      point.read_share = row.contains("read_share") && row["read_share"].is_number()
                             ? row["read_share"].get<double>()
                             : (independent ? workers : 1.0);
      point.rounds = number(row, "selection_collectives_mean", where);
      if (point.density_ratio <= 0 || point.selected_ratio <= 0) {
        throw InvalidArgument(
            fmt::format("{}: {} selected nothing; no statistics to scale", where, scheme));
      }
      Series& s = series[{scheme, density}];
      if (s.points.empty()) {
        s.numel = numel;
        s.independent = independent;
      } else if (s.numel != numel) {
        throw InvalidArgument(fmt::format(
            "{}: {} at density {} was measured on d = {} here and d = {} before; one scheme's "
            "statistics come from one trace",
            where, scheme, density, numel, s.numel));
      }
      for (const ScalingPoint& other : s.points) {
        if (other.ranks == point.ranks) {
          throw InvalidArgument(fmt::format("{}: {} at density {} on {} ranks appears twice", where,
                                            scheme, density, point.ranks));
        }
      }
      s.points.push_back(point);
    }
  }
  for (auto& [key, s] : series) {
    std::sort(s.points.begin(), s.points.end(),
              [](const ScalingPoint& a, const ScalingPoint& b) { return a.ranks < b.ranks; });
    const double k = std::max(1.0, std::floor(key.second * s.numel));
    out.table.add(key.second, SchemeScaling(key.first, s.independent, k, std::move(s.points)));
  }
  std::sort(out.unused.begin(), out.unused.end());
  out.unused.erase(std::unique(out.unused.begin(), out.unused.end()), out.unused.end());
  return out;
}

MeasuredScaling load_bench_statistics(std::span<const std::string> paths) {
  std::vector<BenchRows> inputs;
  for (const std::string& path : paths) {
    inputs.push_back({path, read_json_file(path, "the statistics",
                                           "write them with `sparsecomm bench sparsifiers --trace "
                                           "TRACE -n N --format json > FILE`")});
  }
  return scaling_from_bench_rows(inputs);
}

}  // namespace sparsecomm::perf
