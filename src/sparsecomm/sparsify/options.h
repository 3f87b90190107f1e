#pragma once
// Options of a scheme, as key=value strings from the command line or a
// config file, read through typed getters that validate. Every key must be
// declared by the scheme; an unknown key is an error listing the valid ones.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace sparsecomm {

// What a scheme declares about one of its options (for validation and help).
struct OptionSpec {
  std::string name;
  std::string default_value;
  std::string help;
};

class SchemeOptions {
 public:
  SchemeOptions() = default;
  explicit SchemeOptions(std::map<std::string, std::string> values) : values_(std::move(values)) {}

  // Parses "key=value" (InvalidArgument on a missing '=' or empty key).
  void set(std::string_view key_equals_value);
  void set(std::string key, std::string value) { values_[std::move(key)] = std::move(value); }
  bool has(std::string_view key) const { return values_.count(std::string(key)) != 0; }
  const std::map<std::string, std::string>& values() const { return values_; }

  // Typed getters: the value if set (validated), else `fallback`. Each
  // names `scheme` and the key in its error messages.
  double number(std::string_view scheme, std::string_view key, double fallback, double min,
                double max, bool min_exclusive = false) const;
  std::int64_t integer(std::string_view scheme, std::string_view key, std::int64_t fallback,
                       std::int64_t min, std::int64_t max) const;
  bool flag(std::string_view scheme, std::string_view key, bool fallback) const;
  std::string choice(std::string_view scheme, std::string_view key, std::string_view fallback,
                     const std::vector<std::string>& allowed) const;

  // InvalidArgument when a key is not in `specs`, listing the valid keys.
  void check_known(std::string_view scheme, const std::vector<OptionSpec>& specs) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace sparsecomm
