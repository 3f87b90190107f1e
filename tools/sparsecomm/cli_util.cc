#include "cli_util.h"

#include <algorithm>
#include <cctype>
#include <charconv>
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

}  // namespace sparsecomm::cli
