#include "sparsecomm/sparsify/options.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// "[a, b]", "(a, b]", "[a, inf)".
std::string range_text(double min, double max, bool min_exclusive) {
  return fmt::format("{}{}, {}{}", min_exclusive ? "(" : "[", min, max,
                     std::isinf(max) ? ")" : "]");
}

}  // namespace

void SchemeOptions::set(std::string_view key_equals_value) {
  const auto eq = key_equals_value.find('=');
  if (eq == std::string_view::npos) {
    throw InvalidArgument(fmt::format("[options] expected key=value, got '{}'", key_equals_value));
  }
  const auto key = trim(key_equals_value.substr(0, eq));
  const auto value = trim(key_equals_value.substr(eq + 1));
  if (key.empty()) {
    throw InvalidArgument(fmt::format("[options] empty key in '{}'", key_equals_value));
  }
  values_[std::string(key)] = std::string(value);
}

double SchemeOptions::number(std::string_view scheme, std::string_view key, double fallback,
                             double min, double max, bool min_exclusive) const {
  const auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || std::isnan(value)) {
    throw InvalidArgument(fmt::format("[{}] option {}={} is not a number", scheme, key, text));
  }
  const bool below = min_exclusive ? !(value > min) : !(value >= min);
  if (below || value > max) {
    throw InvalidArgument(fmt::format("[{}] option {}={} is outside {}", scheme, key, text,
                                      range_text(min, max, min_exclusive)));
  }
  return value;
}

std::int64_t SchemeOptions::integer(std::string_view scheme, std::string_view key,
                                    std::int64_t fallback, std::int64_t min,
                                    std::int64_t max) const {
  const auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    throw InvalidArgument(
        fmt::format("[{}] option {}={} is outside [{}, {}]", scheme, key, text, min, max));
  }
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw InvalidArgument(fmt::format("[{}] option {}={} is not an integer", scheme, key, text));
  }
  if (value < min || value > max) {
    throw InvalidArgument(
        fmt::format("[{}] option {}={} is outside [{}, {}]", scheme, key, text, min, max));
  }
  return value;
}

bool SchemeOptions::flag(std::string_view scheme, std::string_view key, bool fallback) const {
  const auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  throw InvalidArgument(fmt::format(
      "[{}] option {}={} is not a boolean (true|false|1|0|yes|no|on|off)", scheme, key, text));
}

std::string SchemeOptions::choice(std::string_view scheme, std::string_view key,
                                  std::string_view fallback,
                                  const std::vector<std::string>& allowed) const {
  const auto it = values_.find(std::string(key));
  if (it == values_.end()) return std::string(fallback);
  for (const auto& candidate : allowed) {
    if (candidate == it->second) return candidate;
  }
  throw InvalidArgument(
      fmt::format("[{}] option {}={} is not one of: {}", scheme, key, it->second, join(allowed)));
}

void SchemeOptions::check_known(std::string_view scheme,
                                const std::vector<OptionSpec>& specs) const {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : values_) {
    bool known = false;
    for (const auto& spec : specs) known = known || spec.name == key;
    if (!known) unknown.push_back("'" + key + "'");
  }
  if (unknown.empty()) return;
  std::vector<std::string> valid;
  valid.reserve(specs.size());
  for (const auto& spec : specs) valid.push_back(spec.name);
  throw InvalidArgument(fmt::format("[{}] unknown option{} {}; valid options: {}", scheme,
                                    unknown.size() > 1 ? "s" : "", join(unknown), join(valid)));
}

}  // namespace sparsecomm
