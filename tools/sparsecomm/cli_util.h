#pragma once
// Parsing and formatting helpers shared by the CLI's subcommands.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/report/statistics.h"

namespace sparsecomm::cli {

// "4096", "64K", "1M", "2G" (binary units) -> bytes. Throws InvalidArgument
// naming `what` for anything else (negative numbers, junk, overflow).
std::size_t parse_bytes(std::string_view text, std::string_view what);

// Comma-separated list, whitespace trimmed, empty items rejected.
std::vector<std::string> split_list(std::string_view text, std::string_view what);

// 65536 -> "64 KiB", 1536 -> "1.5 KiB".
std::string format_bytes(double bytes);

// Medians of timings: the one definition, shared with the trainer's summaries.
using report::median;

}  // namespace sparsecomm::cli
