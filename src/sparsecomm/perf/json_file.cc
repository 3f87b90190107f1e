#include "sparsecomm/perf/json_file.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm::perf {

nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              std::string_view how_to_make) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(fmt::format("cannot read {} '{}'; {}", what, path, how_to_make));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw InvalidArgument(fmt::format("{} '{}' is not JSON: {}", what, path, e.what()));
  }
}

}  // namespace sparsecomm::perf
