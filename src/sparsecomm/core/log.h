#pragma once
// The library's one logging mechanism: spdlog, one logger named
// "sparsecomm", to stderr. Everything that is a log line (warnings,
// notes, the CLI's final error) goes through it; what a command prints as
// its output (tables, progress, summaries) does not.
//
// Lines read "sparsecomm: <level>: <message>", or
// "sparsecomm [rank r]: <level>: <message>" once a rank is set: the thread
// backend sets it per rank thread, the MPI backend once for the process, so
// lines from several ranks can be told apart.
//
// SPARSECOMM_LOG_LEVEL=trace|debug|info|warn|error|off (default info) sets
// the level when the logger is first used; an unknown value is reported
// once (as a warning) and ignored.

#include <optional>
#include <string_view>

#include <spdlog/logger.h>

namespace sparsecomm {

// The logger, created on first use. Thread-safe.
spdlog::logger& logger();

// Tags this thread's log lines with `rank` (-1: no tag; the thread backend's
// rank threads).
void set_thread_log_rank(int rank);
// Tags the log lines of every thread without a thread rank (the MPI
// backend: one rank per process).
void set_process_log_rank(int rank);

// "trace", "debug", "info", "warn" (or "warning"), "error", "off"; nullopt
// for anything else.
std::optional<spdlog::level::level_enum> parse_log_level(std::string_view name);

}  // namespace sparsecomm
