#include "bench_util.h"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <limits>
#include <span>
#include <thread>

#include <fmt/format.h>

#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/report/statistics.h"

namespace sparsecomm::cli {

void check_iterations(int iters, int warmup) {
  if (iters < 1) throw InvalidArgument(fmt::format("--iters must be >= 1, got {}", iters));
  if (warmup < 0) throw InvalidArgument(fmt::format("--warmup must be >= 0, got {}", warmup));
}

void check_format(std::string_view format) {
  if (format != "table" && format != "json") {
    throw InvalidArgument(fmt::format("--format '{}': valid are table, json", format));
  }
}

double median_of_rank_max(Communicator& comm, const std::vector<double>& mine) {
  const std::size_t iters = mine.size();
  std::vector<double> all(iters * static_cast<std::size_t>(comm.size()));
  comm.allgather(bytes_of(std::span<const double>(mine)),
                 writable_bytes_of(std::span<double>(all)));
  std::vector<double> worst(iters, 0.0);
  for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r) {
    for (std::size_t i = 0; i < iters; ++i) worst[i] = std::max(worst[i], all[r * iters + i]);
  }
  return report::median(worst);
}

Machine describe_machine() {
  Machine m;
  m.cores = std::thread::hardware_concurrency();
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) m.cpu = line.substr(line.find_first_not_of(" \t", colon + 1));
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kib = 0.0;
    meminfo >> kib;
    if (key == "MemTotal:") m.memory_gib = kib / (1024.0 * 1024.0);
    if (key == "MemAvailable:") m.available_gib = kib / (1024.0 * 1024.0);
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  std::ifstream loadavg("/proc/loadavg");
  loadavg >> m.load;
  if (m.load.empty()) m.load.push_back('?');  // not "= \"?\"": GCC 12 -Wrestrict false positive
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M UTC", &utc);
  m.date = buffer;
  return m;
}

std::optional<std::size_t> last_level_cache_bytes() {
  std::size_t best_level = 0, bytes = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/", index);
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    std::size_t level = 0, size = 0;
    std::string unit;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    size_file >> unit;
    if (unit.starts_with("K")) size <<= 10;
    if (unit.starts_with("M")) size <<= 20;
    if (level >= best_level) {
      best_level = level;
      bytes = size;
    }
  }
  if (bytes == 0) return std::nullopt;
  return bytes;
}

}  // namespace sparsecomm::cli
