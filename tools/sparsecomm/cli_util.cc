#include "cli_util.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm::cli {

std::size_t parse_bytes(std::string_view text, std::string_view what) {
  const auto invalid = [&](std::string_view why) {
    return InvalidArgument(
        fmt::format("{} '{}' {}: give a byte count such as 4096, 64K, 16M or 1G (binary units)",
                    what, text, why));
  };
  if (text.empty()) throw invalid("is empty");
  if (text.front() == '-') throw invalid("is negative");
  std::size_t multiplier = 1;
  std::string_view digits = text;
  switch (std::toupper(static_cast<unsigned char>(text.back()))) {
    case 'K':
      multiplier = std::size_t{1} << 10;
      break;
    case 'M':
      multiplier = std::size_t{1} << 20;
      break;
    case 'G':
      multiplier = std::size_t{1} << 30;
      break;
    default:
      break;
  }
  if (multiplier != 1) digits.remove_suffix(1);
  std::size_t value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
    throw invalid("is not a byte count");
  }
  if (value > std::numeric_limits<std::size_t>::max() / multiplier) throw invalid("is too large");
  return value * multiplier;
}

std::vector<std::string> split_list(std::string_view text, std::string_view what) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string_view item = text.substr(start, comma - start);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front())))
      item.remove_prefix(1);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back())))
      item.remove_suffix(1);
    if (item.empty()) {
      throw InvalidArgument(
          fmt::format("{} '{}' has an empty item: give a comma-separated list", what, text));
    }
    items.emplace_back(item);
    start = comma + 1;
  }
  return items;
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  if (bytes == static_cast<double>(static_cast<long long>(bytes))) {
    return fmt::format("{} {}", static_cast<long long>(bytes), kUnits[unit]);
  }
  return fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

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

}  // namespace sparsecomm::cli
