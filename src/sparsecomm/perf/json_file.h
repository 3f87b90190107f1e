#pragma once
// The JSON files the performance model reads (cost profiles, measured
// statistics, convergence profiles): one reader, one pair of errors.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace sparsecomm::perf {

// The parsed file. InvalidArgument "cannot read WHAT 'PATH'; HOW_TO_MAKE"
// when it cannot be opened, "WHAT 'PATH' is not JSON: ..." when it does
// not parse (`what`: "the cost profile").
nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              std::string_view how_to_make);

}  // namespace sparsecomm::perf
