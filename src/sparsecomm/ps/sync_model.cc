#include "sparsecomm/ps/sync_model.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

std::int64_t parse_bound(std::string_view spec, std::string_view text, std::string_view what) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto result = std::from_chars(text.data(), end, value);
  if (text.empty() || result.ec != std::errc() || result.ptr != end) {
    throw InvalidArgument(
        fmt::format("[ps] sync model '{}': {} '{}' is not an integer; valid models: {}", spec, what,
                    text, sync_model_names()));
  }
  return value;
}

std::vector<std::string_view> split(std::string_view spec) {
  std::vector<std::string_view> parts;
  for (;;) {
    const auto colon = spec.find(':');
    parts.push_back(spec.substr(0, colon));
    if (colon == std::string_view::npos) return parts;
    spec.remove_prefix(colon + 1);
  }
}

}  // namespace

SyncModel SyncModel::ssp(std::int64_t staleness) {
  if (staleness < 0) {
    throw InvalidArgument(fmt::format(
        "[ps] SSP staleness bound s = {} must be >= 0 (s = 0 is BSP's gating)", staleness));
  }
  return {SyncModelKind::kSsp, staleness, staleness};
}

SyncModel SyncModel::dssp(std::int64_t lower, std::int64_t upper) {
  if (lower < 0) {
    throw InvalidArgument(fmt::format("[ps] DSSP lower bound s_L = {} must be >= 0", lower));
  }
  if (upper < lower) {
    throw InvalidArgument(fmt::format(
        "[ps] DSSP upper bound s_U = {} is below the lower bound s_L = {}; need s_U >= s_L", upper,
        lower));
  }
  return {SyncModelKind::kDssp, lower, upper};
}

std::string SyncModel::name() const {
  switch (kind) {
    case SyncModelKind::kBsp:
      return "bsp";
    case SyncModelKind::kAsp:
      return "asp";
    case SyncModelKind::kSsp:
      return fmt::format("ssp:{}", staleness);
    case SyncModelKind::kDssp:
      return fmt::format("dssp:{}:{}", staleness, staleness_upper);
  }
  return "?";
}

SyncModel make_sync_model(std::string_view name, std::int64_t staleness,
                          std::int64_t staleness_upper) {
  if (name == "bsp" || name == "asp") {
    if (staleness != 0 || staleness_upper != 0) {
      throw InvalidArgument(fmt::format(
          "[ps] sync model '{}' takes no staleness bounds (got {} and {}); use ssp or dssp", name,
          staleness, staleness_upper));
    }
    return name == "bsp" ? SyncModel::bsp() : SyncModel::asp();
  }
  if (name == "ssp") return SyncModel::ssp(staleness);
  if (name == "dssp") return SyncModel::dssp(staleness, staleness_upper);
  throw InvalidArgument(
      fmt::format("[ps] unknown sync model '{}'; valid models: {}", name, sync_model_names()));
}

SyncModel parse_sync_model(std::string_view spec) {
  const std::vector<std::string_view> parts = split(spec);
  const std::string_view name = parts[0];
  const std::size_t bounds = parts.size() - 1;
  const std::size_t expected = name == "ssp" ? 1 : name == "dssp" ? 2 : 0;
  if (name != "bsp" && name != "asp" && name != "ssp" && name != "dssp") {
    throw InvalidArgument(
        fmt::format("[ps] unknown sync model '{}'; valid models: {}", spec, sync_model_names()));
  }
  if (bounds != expected) {
    throw InvalidArgument(
        fmt::format("[ps] sync model '{}': {} takes {} bound(s), got {}; valid "
                    "models: {}",
                    spec, name, expected, bounds, sync_model_names()));
  }
  if (name == "ssp") return SyncModel::ssp(parse_bound(spec, parts[1], "staleness"));
  if (name == "dssp") {
    return SyncModel::dssp(parse_bound(spec, parts[1], "lower bound s_L"),
                           parse_bound(spec, parts[2], "upper bound s_U"));
  }
  return name == "bsp" ? SyncModel::bsp() : SyncModel::asp();
}

std::string sync_model_names() { return "bsp, asp, ssp:S, dssp:L:U (S, L >= 0, U >= L)"; }

std::int64_t dssp_grant(double fast_last, double fast_interval, double slow_last,
                        double slow_interval, std::int64_t r_max) {
  if (r_max < 0) {
    throw InvalidArgument(fmt::format("[ps] dssp_grant: r_max = {} must be >= 0", r_max));
  }
  if (!(fast_interval >= 0.0) || !(slow_interval >= 0.0) || !std::isfinite(fast_interval) ||
      !std::isfinite(slow_interval) || !std::isfinite(fast_last) || !std::isfinite(slow_last)) {
    throw InvalidArgument(fmt::format(
        "[ps] dssp_grant: push times must be finite and intervals >= 0 (fast: last {}, interval "
        "{}; slow: last {}, interval {})",
        fast_last, fast_interval, slow_last, slow_interval));
  }
  std::int64_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i <= r_max; ++i) {
    const double f = fast_last + static_cast<double>(i) * fast_interval;
    double distance = std::numeric_limits<double>::infinity();
    for (std::int64_t j = 1; j <= r_max; ++j) {
      distance =
          std::min(distance, std::abs(f - (slow_last + static_cast<double>(j) * slow_interval)));
    }
    if (distance < best_distance) {
      best_distance = distance;
      best = i;
    }
  }
  return best;
}

}  // namespace sparsecomm
