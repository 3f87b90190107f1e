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

// "421642", "25M", "1.3B" (decimal units K, M, B or G) -> a count >= 1;
// InvalidArgument naming `option` otherwise.
double parse_count(const std::string& text, std::string_view option);

// `--ranks`: "4", "4,16,64" or "2-4096" (powers of two from the first to the
// last, both ends included) -> ascending world sizes in 1..2^20;
// InvalidArgument otherwise.
std::vector<int> parse_ranks(const std::string& text);

// 65536 -> "64 KiB", 1536 -> "1.5 KiB".
std::string format_bytes(double bytes);

// Medians of timings: the one definition, shared with the trainer's summaries.
using report::median;

}  // namespace sparsecomm::cli
