#include "sparsecomm/perf/scheme_scaling.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm::perf {
namespace {

double lerp(double a, double b, double t) { return a + (b - a) * t; }

// Sum of squared log errors of `law` over the points.
double fit_error(const UnionLaw& law, std::span<const double> ranks,
                 std::span<const double> ratios) {
  double error = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const double e = std::log(law.ratio(ranks[i])) - std::log(ratios[i]);
    error += e * e;
  }
  return error;
}

}  // namespace

double UnionLaw::ratio(double n) const {
  if (n <= 1 || pool <= 0) return 1.0;
  const double draw = (1.0 - shared) / pool;  // a pool coordinate's chance on one rank
  return shared + pool * (1.0 - std::pow(1.0 - draw, n));
}

UnionLaw fit_union_law(std::span<const double> ranks, std::span<const double> ratios) {
  if (ranks.empty() || ranks.size() != ratios.size()) {
    throw InvalidArgument("fitting a union law needs one K/k per world size, and at least one");
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (!(ranks[i] >= 1) || !(ratios[i] >= 1 - 1e-9) || ratios[i] > ranks[i] * (1 + 1e-9)) {
      throw InvalidArgument(fmt::format(
          "a union of n selections holds 1 to n times one selection; got K/k = {} at n = {}",
          ratios[i], ranks[i]));
    }
  }
  // Grid over shared in [0, 1] and log-spaced pool sizes, then one
  // refinement around the best cell: two parameters, a smooth error.
  UnionLaw best{.shared = 1.0, .pool = 0.0};
  double best_error = fit_error(best, ranks, ratios);
  auto search = [&](double shared_lo, double shared_hi, double log_pool_lo, double log_pool_hi) {
    constexpr int kSteps = 80;
    for (int i = 0; i <= kSteps; ++i) {
      const double shared = std::clamp(lerp(shared_lo, shared_hi, double(i) / kSteps), 0.0, 1.0);
      for (int j = 0; j <= kSteps; ++j) {
        const double pool =
            std::max(1.0 - shared, std::exp(lerp(log_pool_lo, log_pool_hi, double(j) / kSteps)));
        const UnionLaw law{.shared = shared, .pool = pool};
        if (const double error = fit_error(law, ranks, ratios); error < best_error) {
          best_error = error;
          best = law;
        }
      }
    }
  };
  search(0.0, 1.0, std::log(1e-3), std::log(1e6));
  const double log_pool = std::log(std::max(best.pool, 1e-3));
  search(best.shared - 0.02, best.shared + 0.02, log_pool - 0.2, log_pool + 0.2);
  return best;
}

double counting_imbalance(double n, double total) {
  if (n <= 1 || total <= 0) return 0.0;
  return std::sqrt(2.0 * std::log(n) * n / total);
}

SchemeScaling::SchemeScaling(std::string scheme, bool independent, double selected_total,
                             std::vector<ScalingPoint> points)
    : scheme_(std::move(scheme)),
      independent_(independent),
      selected_total_(selected_total),
      points_(std::move(points)) {
  if (points_.empty()) throw InvalidArgument(fmt::format("{}: no measured world size", scheme_));
  for (std::size_t i = 0; i < points_.size(); ++i) {
    if (points_[i].ranks < 1 || (i > 0 && points_[i].ranks <= points_[i - 1].ranks)) {
      throw InvalidArgument(fmt::format("{}: world sizes must ascend from 1", scheme_));
    }
  }
  if (independent_) {
    std::vector<double> ranks{1.0};
    std::vector<double> ratios{1.0};
    for (const ScalingPoint& point : points_) {
      ranks.push_back(point.ranks);
      ratios.push_back(
          std::clamp(point.density_ratio / point.selected_ratio, 1.0, double(point.ranks)));
    }
    union_law_ = fit_union_law(ranks, ratios);
  }
}

ScalingPoint SchemeScaling::at(int n, double k) const {
  if (n < 1) throw InvalidArgument(fmt::format("a world has at least 1 rank, got {}", n));
  ScalingPoint result;
  result.ranks = n;
  const ScalingPoint& first = points_.front();
  const ScalingPoint& last = points_.back();
  if (n <= first.ranks) {
    // Between n = 1 (one rank: no union, no imbalance, reads d) and the first point.
    const double t = first.ranks == 1 ? 1.0 : std::log(double(n)) / std::log(double(first.ranks));
    result.selected_ratio = first.selected_ratio;
    result.density_ratio = independent_ ? result.selected_ratio * union_law_.ratio(n)
                                        : lerp(1.0, first.density_ratio, t);
    result.imbalance = lerp(0.0, first.imbalance, t);
    result.read_share = lerp(1.0, first.read_share, t);
    result.rounds = first.rounds;
  } else if (n <= last.ranks) {
    const auto upper = std::find_if(points_.begin(), points_.end(),
                                    [n](const ScalingPoint& p) { return p.ranks >= n; });
    const ScalingPoint& hi = *upper;
    const ScalingPoint& lo = *(upper - 1);
    const double t = std::log(double(n) / lo.ranks) / std::log(double(hi.ranks) / lo.ranks);
    result.density_ratio = lerp(lo.density_ratio, hi.density_ratio, t);
    result.selected_ratio = lerp(lo.selected_ratio, hi.selected_ratio, t);
    result.imbalance = lerp(lo.imbalance, hi.imbalance, t);
    result.read_share = lerp(lo.read_share, hi.read_share, t);
    result.rounds = lerp(lo.rounds, hi.rounds, t);
  } else {
    result.selected_ratio = last.selected_ratio;
    result.density_ratio =
        independent_ ? result.selected_ratio * union_law_.ratio(n) : last.density_ratio;
    const double law_now = counting_imbalance(n, k * result.density_ratio);
    const double law_then = counting_imbalance(last.ranks, selected_total_ * last.density_ratio);
    result.imbalance = law_then > 0 ? last.imbalance * law_now / law_then : last.imbalance;
    // Read share: the growth exponent of the last two points, clamped to
    // [0, 1] (1: every rank reads the whole vector; 0: a fixed share of d/n).
    double exponent = 0.0;
    if (points_.size() >= 2) {
      const ScalingPoint& before = points_[points_.size() - 2];
      exponent = std::log(last.read_share / before.read_share) /
                 std::log(double(last.ranks) / before.ranks);
    }
    exponent = std::clamp(exponent, 0.0, 1.0);
    result.read_share = last.read_share * std::pow(double(n) / last.ranks, exponent);
    result.rounds = last.rounds;
  }
  return result;
}

void ScalingTable::add(double density, SchemeScaling scaling) {
  if (!(density > 0 && density <= 1)) {
    throw InvalidArgument(
        fmt::format("{}: statistics need a density in (0, 1], got {}", scaling.scheme(), density));
  }
  entries_.emplace_back(density, std::move(scaling));
}

const SchemeScaling* ScalingTable::find(std::string_view scheme, double density) const {
  const SchemeScaling* best = nullptr;
  double best_distance = 0.0;
  for (const auto& [measured_at, scaling] : entries_) {
    if (scaling.scheme() != scheme) continue;
    const double distance = std::abs(std::log(measured_at / density));
    if (best == nullptr || distance < best_distance) {
      best = &scaling;
      best_distance = distance;
    }
  }
  return best;
}

std::vector<std::string> ScalingTable::schemes() const {
  std::vector<std::string> out;
  for (const auto& entry : entries_) out.push_back(entry.second.scheme());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

const SchemeScaling& builtin_scaling(const std::string& scheme, double density) {
  const SchemeScaling* found = builtin_scaling_table().find(scheme, density);
  if (found == nullptr) {
    throw InvalidArgument(
        fmt::format("the performance model has no measured statistics for '{}'", scheme));
  }
  return *found;
}

}  // namespace sparsecomm::perf
