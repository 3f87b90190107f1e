#pragma once
// Numbers between JSON and C++. Whole numbers read from JSON that a user or a
// file wrote: nlohmann's get<T>() casts whatever number it finds (a float
// past T's range is undefined behaviour, and a large integer wraps), so
// json_integer<T> takes only an integer that T can hold. Doubles written to
// JSON: it has no NaN or inf, so json_number writes them as null.

#include <cmath>
#include <concepts>
#include <cstdint>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

namespace sparsecomm {

// The value as a T, or nullopt when it is not a JSON integer or T cannot hold it.
template <std::integral T>
std::optional<T> json_integer(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    if (std::in_range<T>(v)) return static_cast<T>(v);
  } else if (value.is_number_integer()) {
    const auto v = value.get<std::int64_t>();
    if (std::in_range<T>(v)) return static_cast<T>(v);
  }
  return std::nullopt;
}

// `value`, or null when it is NaN or infinite.
inline nlohmann::json json_number(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

}  // namespace sparsecomm
