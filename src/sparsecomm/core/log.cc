// The "sparsecomm" logger (log.h): stderr sink, rank tag, level from
// SPARSECOMM_LOG_LEVEL.

#include "sparsecomm/core/log.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace sparsecomm {
namespace {

thread_local int thread_rank = -1;
std::atomic<int> process_rank{-1};

// %R in the pattern: " [rank r]" when a rank is set, else nothing.
class RankFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const int rank = thread_rank >= 0 ? thread_rank : process_rank.load();
    if (rank < 0) return;
    const std::string tag = " [rank " + std::to_string(rank) + "]";
    dest.append(tag.data(), tag.data() + tag.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<RankFlag>();
  }
};

std::shared_ptr<spdlog::logger> make_logger() {
  auto logger = std::make_shared<spdlog::logger>("sparsecomm",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<RankFlag>('R').set_pattern("sparsecomm%R: %l: %v");
  logger->set_formatter(std::move(formatter));
  logger->set_level(spdlog::level::info);
  logger->flush_on(spdlog::level::trace);  // stderr: every line at once
  const char* env = std::getenv("SPARSECOMM_LOG_LEVEL");
  if (env != nullptr && *env != '\0') {
    if (const auto level = parse_log_level(env)) {
      logger->set_level(*level);
    } else {
      logger->warn(
          "ignoring SPARSECOMM_LOG_LEVEL='{}' (expected trace, debug, info, warn, error or off)",
          env);
    }
  }
  return logger;
}

}  // namespace

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

void set_thread_log_rank(int rank) { thread_rank = rank; }

void set_process_log_rank(int rank) { process_rank.store(rank); }

std::optional<spdlog::level::level_enum> parse_log_level(std::string_view name) {
  if (name == "trace") return spdlog::level::trace;
  if (name == "debug") return spdlog::level::debug;
  if (name == "info") return spdlog::level::info;
  if (name == "warn" || name == "warning") return spdlog::level::warn;
  if (name == "error") return spdlog::level::err;
  if (name == "off") return spdlog::level::off;
  return std::nullopt;
}

}  // namespace sparsecomm
