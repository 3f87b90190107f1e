#pragma once
// Whole numbers read from JSON that a user or a file wrote. nlohmann's
// get<T>() casts whatever number it finds: a float past T's range is
// undefined behaviour, and a large integer wraps. json_integer<T> takes only
// an integer that T can hold.

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

}  // namespace sparsecomm
