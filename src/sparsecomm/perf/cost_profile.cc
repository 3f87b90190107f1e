#include "sparsecomm/perf/cost_profile.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sparsecomm/core/atomic_file.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/perf/json_file.h"

namespace sparsecomm::perf {
namespace {

// Host costs used when a profile only names a network: `sparsecomm
// calibrate --host-only -n 1` (d = 4M floats, c = 1%) run twice on a quiet
// 2-core AMD EPYC (Zen 4, AVX-512 path), 2026-11-25, rounded; gamma 0.26
// and 0.42, update 0.50 and 0.70 ns in the two runs. A profile from
// `calibrate` on the machines at hand replaces all of them.
constexpr double kDefaultGamma = 0.35e-9;
constexpr double kDefaultAccumulate = 0.28e-9;
constexpr double kDefaultUpdate = 0.6e-9;
const std::map<std::string, double, std::less<>>& default_select_costs() {
  static const std::map<std::string, double, std::less<>> costs = {
      {"default", 0.36e-9},   {"topk", 0.36e-9},    {"dgc", 0.31e-9},
      {"gaussiank", 0.76e-9}, {"randomk", 0.39e-9}, {"cltk", 0.34e-9},
      {"micro", 0.25e-9},     {"exdyna", 0.23e-9},  {"deft", 1.45e-9}};
  return costs;
}

// Decoding, measured the same way on the same machine, 2026-11-26: zeroing
// a 128 MiB gradient 0.06 and 0.13 ns per element, adding entries at sorted
// random indices of it (beyond the 32 MiB last-level cache) 7.5 and 10.5 ns
// each.
constexpr double kDefaultFill = 0.1e-9;
constexpr double kDefaultScatter = 9e-9;
constexpr double kDefaultCacheBytes = 32.0 * 1024 * 1024;
// The sparse exchange's other host work, the same way, 2026-11-26: taking
// values out of that gradient 18.8 and 22.9 ns each, decoding a varint
// index 2.9 and 3.8 ns, merging 3.3 and 3.8 ns per entry and level.
constexpr double kDefaultPack = 20e-9;
constexpr double kDefaultIndexDecode = 3.3e-9;
constexpr double kDefaultMerge = 3.5e-9;
// PowerSGD's arithmetic per matrix element, fixed and per unit of rank:
// `calibrate --host-only --workers 1`, 2-core Xeon (AVX-512 path),
// 2026-11-29, three runs while a training run used the other core: 0.80 +
// 0.56 r, 0.46 + 0.60 r and 0.38 + 0.63 r ns.
constexpr double kDefaultLowRank = 0.5e-9;
// The value codecs, ns per value to encode (with the nonce's hash) and to
// decode: `calibrate --host-only --workers 1`, the same machine and day,
// one run (a training run on the other core). lloyd2 (added 2026-12-06) is
// int2's figure times their ratio on a like Xeon that day, both measured
// idle: 18.7 against 3.9 ns to encode, 0.71 against 0.81 to decode.
const std::map<std::string, double, std::less<>>& default_encode_costs() {
  static const std::map<std::string, double, std::less<>> costs = {
      {"fp16", 12.3e-9}, {"bf16", 4.2e-9},     {"int8", 8.3e-9},     {"int4", 8.4e-9},
      {"int2", 8.7e-9},  {"int8-sr", 15.2e-9}, {"int4-sr", 14.8e-9}, {"int2-sr", 15.3e-9},
      {"sign", 7.7e-9},  {"nat", 34.6e-9},    {"lloyd2", 42e-9}};
  return costs;
}
const std::map<std::string, double, std::less<>>& default_decode_costs() {
  static const std::map<std::string, double, std::less<>> costs = {
      {"fp16", 3.0e-9}, {"bf16", 1.7e-9},    {"int8", 1.7e-9},    {"int4", 1.7e-9},
      {"int2", 1.8e-9}, {"int8-sr", 1.9e-9}, {"int4-sr", 1.9e-9}, {"int2-sr", 2.0e-9},
      {"sign", 0.8e-9}, {"nat", 11.0e-9},    {"lloyd2", 1.6e-9}};
  return costs;
}
constexpr double kDefaultLowRankPerRank = 0.6e-9;

double checked_field(const nlohmann::json& json, std::string_view key, std::string_view origin,
                     bool positive) {
  const auto it = json.find(key);
  if (it == json.end() || !it->is_number()) {
    throw InvalidArgument(fmt::format("{}: '{}' is missing or not a number", origin, key));
  }
  const double value = it->get<double>();
  if (!std::isfinite(value) || value < 0 || (positive && value == 0)) {
    throw InvalidArgument(fmt::format("{}: '{}' must be a finite number {} 0, got {}", origin, key,
                                      positive ? ">" : ">=", value));
  }
  return value;
}

// A field that older profiles lack: 0 when absent, else checked.
double optional_field(const nlohmann::json& json, std::string_view key, std::string_view origin) {
  return json.contains(key) ? checked_field(json, key, origin, false) : 0.0;
}

}  // namespace

double CostProfile::scatter_cost(double numel) const {
  const bool outgrows_cache = cache_bytes > 0 && 4.0 * numel > cache_bytes;
  return outgrows_cache && scatter_s_per_element > 0 ? scatter_s_per_element : gamma_s_per_element;
}

double CostProfile::pack_cost(double numel) const {
  if (pack_s_per_element <= 0) return 0.0;
  const bool outgrows_cache = cache_bytes > 0 && 4.0 * numel > cache_bytes;
  return outgrows_cache ? pack_s_per_element : 2.0 * gamma_s_per_element;
}

double CostProfile::select_cost(std::string_view scheme) const {
  if (const auto it = select_s_per_element.find(scheme); it != select_s_per_element.end()) {
    return it->second;
  }
  const auto fallback = select_s_per_element.find("default");
  return fallback == select_s_per_element.end() ? 0.0 : fallback->second;
}

namespace {

double cost_in(const std::map<std::string, double, std::less<>>& costs, std::string_view codec) {
  const auto it = costs.find(codec);
  return it == costs.end() ? 0.0 : it->second;
}

}  // namespace

double CostProfile::encode_cost(std::string_view encoding) const {
  return cost_in(encode_s_per_value, encoding);
}

double CostProfile::decode_cost(std::string_view encoding) const {
  return cost_in(decode_s_per_value, encoding);
}

CostProfile network_profile(double link_gbit_per_s, double latency_us) {
  if (!std::isfinite(link_gbit_per_s) || link_gbit_per_s <= 0) {
    throw InvalidArgument(fmt::format("the link rate must be a finite number of Gbit/s > 0, got {}",
                                      link_gbit_per_s));
  }
  if (!std::isfinite(latency_us) || latency_us < 0) {
    throw InvalidArgument(fmt::format(
        "the latency must be a finite number of microseconds >= 0, got {}", latency_us));
  }
  CostProfile profile;
  profile.name = fmt::format("{:g} Gbit/s, {:g} us", link_gbit_per_s, latency_us);
  profile.source = "given link rate and latency; host costs: built-in defaults";
  profile.alpha_s = latency_us * 1e-6;
  profile.beta_s_per_byte = 8.0 / (link_gbit_per_s * 1e9);
  profile.gamma_s_per_element = kDefaultGamma;
  profile.accumulate_s_per_element = kDefaultAccumulate;
  profile.update_s_per_element = kDefaultUpdate;
  profile.select_s_per_element = default_select_costs();
  profile.fill_s_per_element = kDefaultFill;
  profile.scatter_s_per_element = kDefaultScatter;
  profile.cache_bytes = kDefaultCacheBytes;
  profile.pack_s_per_element = kDefaultPack;
  profile.index_decode_s_per_element = kDefaultIndexDecode;
  profile.merge_s_per_element = kDefaultMerge;
  profile.low_rank_s_per_element = kDefaultLowRank;
  profile.encode_s_per_value = default_encode_costs();
  profile.decode_s_per_value = default_decode_costs();
  profile.low_rank_s_per_element_rank = kDefaultLowRankPerRank;
  return profile;
}

CostProfile without_host_costs(const CostProfile& profile) {
  CostProfile network;
  network.name = profile.name + ", no host costs";
  network.source = profile.source;
  network.alpha_s = profile.alpha_s;
  network.beta_s_per_byte = profile.beta_s_per_byte;
  network.wire_bytes_per_message = profile.wire_bytes_per_message;
  network.wire_overhead_per_byte = profile.wire_overhead_per_byte;
  network.select_s_per_element = {{"default", 0.0}};
  return network;
}

nlohmann::json to_json(const CostProfile& profile) {
  nlohmann::json select = nlohmann::json::object();
  for (const auto& [scheme, cost] : profile.select_s_per_element) select[scheme] = cost;
  nlohmann::json encode = nlohmann::json::object();
  for (const auto& [codec, cost] : profile.encode_s_per_value) encode[codec] = cost;
  nlohmann::json decode = nlohmann::json::object();
  for (const auto& [codec, cost] : profile.decode_s_per_value) decode[codec] = cost;
  return {{"name", profile.name},
          {"source", profile.source},
          {"alpha_s", profile.alpha_s},
          {"beta_s_per_byte", profile.beta_s_per_byte},
          {"link_gbit_per_s", 8.0 / profile.beta_s_per_byte / 1e9},
          {"gamma_s_per_element", profile.gamma_s_per_element},
          {"accumulate_s_per_element", profile.accumulate_s_per_element},
          {"update_s_per_element", profile.update_s_per_element},
          {"select_s_per_element", select},
          {"fill_s_per_element", profile.fill_s_per_element},
          {"scatter_s_per_element", profile.scatter_s_per_element},
          {"cache_bytes", profile.cache_bytes},
          {"pack_s_per_element", profile.pack_s_per_element},
          {"index_decode_s_per_element", profile.index_decode_s_per_element},
          {"merge_s_per_element", profile.merge_s_per_element},
          {"low_rank_s_per_element", profile.low_rank_s_per_element},
          {"low_rank_s_per_element_rank", profile.low_rank_s_per_element_rank},
          {"encode_s_per_value", encode},
          {"decode_s_per_value", decode},
          {"wire_bytes_per_message", profile.wire_bytes_per_message},
          {"wire_overhead_per_byte", profile.wire_overhead_per_byte}};
}

CostProfile profile_from_json(const nlohmann::json& json, std::string_view origin) {
  if (!json.is_object())
    throw InvalidArgument(fmt::format("{}: a profile is a JSON object", origin));
  CostProfile profile;
  if (const auto it = json.find("name"); it != json.end() && it->is_string()) {
    profile.name = it->get<std::string>();
  }
  if (const auto it = json.find("source"); it != json.end() && it->is_string()) {
    profile.source = it->get<std::string>();
  }
  profile.alpha_s = checked_field(json, "alpha_s", origin, false);
  profile.beta_s_per_byte = checked_field(json, "beta_s_per_byte", origin, true);
  profile.gamma_s_per_element = checked_field(json, "gamma_s_per_element", origin, false);
  profile.accumulate_s_per_element = checked_field(json, "accumulate_s_per_element", origin, false);
  profile.update_s_per_element = checked_field(json, "update_s_per_element", origin, false);
  profile.fill_s_per_element = optional_field(json, "fill_s_per_element", origin);
  profile.scatter_s_per_element = optional_field(json, "scatter_s_per_element", origin);
  profile.cache_bytes = optional_field(json, "cache_bytes", origin);
  profile.pack_s_per_element = optional_field(json, "pack_s_per_element", origin);
  profile.index_decode_s_per_element = optional_field(json, "index_decode_s_per_element", origin);
  profile.merge_s_per_element = optional_field(json, "merge_s_per_element", origin);
  profile.low_rank_s_per_element = optional_field(json, "low_rank_s_per_element", origin);
  profile.low_rank_s_per_element_rank = optional_field(json, "low_rank_s_per_element_rank", origin);
  profile.wire_bytes_per_message = optional_field(json, "wire_bytes_per_message", origin);
  profile.wire_overhead_per_byte = optional_field(json, "wire_overhead_per_byte", origin);
  // The codecs' costs: absent from older profiles (every codec 0).
  for (auto [key, costs] : {std::pair{"encode_s_per_value", &profile.encode_s_per_value},
                            std::pair{"decode_s_per_value", &profile.decode_s_per_value}}) {
    const auto it = json.find(key);
    if (it == json.end()) continue;
    if (!it->is_object()) {
      throw InvalidArgument(
          fmt::format("{}: '{}' is not an object of codec: seconds per value", origin, key));
    }
    for (const auto& [codec, value] : it->items()) {
      (*costs)[codec] = checked_field(*it, codec, fmt::format("{}: {}", origin, key), false);
    }
  }
  const auto select = json.find("select_s_per_element");
  if (select == json.end() || !select->is_object()) {
    throw InvalidArgument(fmt::format(
        "{}: 'select_s_per_element' is missing or not an object of scheme: seconds", origin));
  }
  for (const auto& [scheme, value] : select->items()) {
    profile.select_s_per_element[scheme] =
        checked_field(*select, scheme, fmt::format("{}: select_s_per_element", origin), false);
  }
  return profile;
}

CostProfile load_profile(const std::string& path) {
  return profile_from_json(
      read_json_file(path, "the cost profile", "write one with `sparsecomm calibrate --out FILE`"),
      path);
}

void save_profile(const CostProfile& profile, const std::string& path) {
  atomic_write(path, to_json(profile).dump(2) + "\n");
}

}  // namespace sparsecomm::perf
