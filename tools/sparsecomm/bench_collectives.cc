#include "bench_collectives.h"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cli_util.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/skip_reduce.h"
#include "sparsecomm/comm/backend.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"
#include "sparsecomm/core/timer.h"
#include "world_flags.h"

namespace sparsecomm::cli {
// Named so that the tool's sources can compile as one unit (UNITY_BUILD).
namespace bench_collectives_impl {
namespace {

struct Options {
  WorldFlags world;
  std::string sizes = "64K,1M,16M,64M";
  std::string algorithms = "ring,native,skipreduce";
  std::string skips;  // default: 0, n/4, n/2
  int iters = 10;
  int warmup = 2;
  std::string segment = "1M";
  std::size_t skip_min_elements = 100000;
  std::uint64_t seed = 1;
  std::string format = "table";
};

// The all-reduces; two allgathers of the same total size (each rank
// contributes 1/n of the buffer): the Communicator's own ring and the
// backend's native one (MPI_Iallgatherv; the MPI backend's allgatherv is
// the ring); and two broadcasts of the whole buffer from rank 0: the
// Communicator's binomial tree and the native one (MPI_Ibcast; the MPI
// backend's broadcast is the tree).
enum class Algorithm {
  kRing,
  kNative,
  kSkipReduce,
  kAllgatherRing,
  kAllgatherNative,
  kBroadcastTree,
  kBroadcastNative
};

bool is_allgather(Algorithm algorithm) {
  return algorithm == Algorithm::kAllgatherRing || algorithm == Algorithm::kAllgatherNative;
}
bool is_broadcast(Algorithm algorithm) {
  return algorithm == Algorithm::kBroadcastTree || algorithm == Algorithm::kBroadcastNative;
}
bool is_allreduce(Algorithm algorithm) {
  return !is_allgather(algorithm) && !is_broadcast(algorithm);
}

constexpr std::string_view kAlgorithmNames =
    "ring, native, skipreduce, allgather-ring, allgather-native, broadcast-tree, "
    "broadcast-native";

struct Case {
  Algorithm algorithm;
  int skip = 0;
};

// One measured (algorithm, skip, size); times are per-iteration maxima over
// ranks, then the median over iterations.
struct Row {
  std::string algorithm;
  int skip = 0;
  bool skip_applied = false;  // false when the buffer was protected
  std::size_t bytes = 0;
  double time_ms = 0;
  std::optional<double> rs_time_ms;
  std::optional<double> ag_time_ms;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
};

std::string_view algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kNative:
      return "native";
    case Algorithm::kSkipReduce:
      return "skipreduce";
    case Algorithm::kAllgatherRing:
      return "allgather-ring";
    case Algorithm::kAllgatherNative:
      return "allgather-native";
    case Algorithm::kBroadcastTree:
      return "broadcast-tree";
    case Algorithm::kBroadcastNative:
      return "broadcast-native";
  }
  return "?";
}

// Input of `rank` at element i; exact small integers, so every partial sum a
// schedule can produce is exact in float.
float input_value(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}

// Rank q's part of a buffer of `numel` elements in the allgather cases.
struct Block {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};
Block allgather_block(std::size_t numel, int n, int q) {
  return {numel * static_cast<std::size_t>(q) / static_cast<std::size_t>(n),
          numel * static_cast<std::size_t>(q + 1) / static_cast<std::size_t>(n)};
}

// What an allgather case sends, made once per size (outside the timing):
// every rank's block size in bytes and a copy of this rank's block (MPI
// forbids a send buffer inside the receive buffer).
struct AllgatherInput {
  std::vector<std::size_t> counts;
  std::vector<float> mine;
};
AllgatherInput allgather_input(std::span<const float> pristine, int n, int rank) {
  AllgatherInput input;
  for (int q = 0; q < n; ++q) {
    input.counts.push_back(allgather_block(pristine.size(), n, q).size() * sizeof(float));
  }
  const Block block = allgather_block(pristine.size(), n, rank);
  input.mine.assign(pristine.begin() + block.begin, pristine.begin() + block.end);
  return input;
}

std::vector<int> parse_skips(const Options& options, int world) {
  std::vector<int> skips;
  if (options.skips.empty()) {
    skips = {0, world / 4, world / 2};
  } else {
    for (const std::string& item : split_list(options.skips, "--skips")) {
      try {
        std::size_t used = 0;
        skips.push_back(std::stoi(item, &used));
        if (used != item.size()) throw std::invalid_argument(item);
      } catch (const std::logic_error&) {
        throw InvalidArgument(fmt::format("--skips: '{}' is not an integer", item));
      }
    }
  }
  for (int s : skips) {
    if (s < 0 || s > world - 1) {
      throw InvalidArgument(fmt::format(
          "--skips: skip {} is outside [0, {}] for a world of {} ranks (Skip-Reduce drops s of n "
          "contributions, so s must be at most n-1)",
          s, world - 1, world));
    }
  }
  std::sort(skips.begin(), skips.end());
  skips.erase(std::unique(skips.begin(), skips.end()), skips.end());
  return skips;
}

std::vector<Case> parse_cases(const Options& options, Communicator& comm, bool announce) {
  std::vector<Case> cases;
  // A backend's native collective is measured where it has one, and
  // skipped with a note where it has not.
  const auto native = [&](bool available, Algorithm algorithm, std::string_view what) {
    if (available) {
      cases.push_back({algorithm});
    } else if (announce) {
      logger().info(
          "the {} backend has no native {}; '{}' is measured only with --backend mpi under "
          "mpirun",
          comm.backend(), what, algorithm_name(algorithm));
    }
  };
  for (const std::string& name : split_list(options.algorithms, "--algorithms")) {
    if (name == "ring") {
      cases.push_back({Algorithm::kRing});
    } else if (name == "native") {
      native(comm.has_native_allreduce(), Algorithm::kNative, "all-reduce");
    } else if (name == "skipreduce") {
      for (int s : parse_skips(options, comm.size())) cases.push_back({Algorithm::kSkipReduce, s});
    } else if (name == "allgather-ring") {
      cases.push_back({Algorithm::kAllgatherRing});
    } else if (name == "allgather-native") {
      native(comm.has_native_allgatherv(), Algorithm::kAllgatherNative, "allgatherv");
    } else if (name == "broadcast-tree") {
      cases.push_back({Algorithm::kBroadcastTree});
    } else if (name == "broadcast-native") {
      native(comm.has_native_broadcast(), Algorithm::kBroadcastNative, "broadcast");
    } else {
      throw InvalidArgument(
          fmt::format("--algorithms: unknown algorithm '{}': valid are {}", name, kAlgorithmNames));
    }
  }
  return cases;
}

// Runs one all-reduce of `data`; returns whether skipping was applied.
bool run_case(Communicator& comm, const Case& c, const Options& options, std::size_t segment_bytes,
              std::int64_t step, std::span<float> data, const AllgatherInput& gather,
              AllreduceReport& phases, SkipSchedule* schedule) {
  if (is_broadcast(c.algorithm)) {
    // Rank 0's buffer ends up everywhere.
    const auto all = std::as_writable_bytes(data);
    if (c.algorithm == Algorithm::kBroadcastTree) {
      comm.broadcast(all, 0);
    } else {
      comm.native_broadcast(all, 0);
    }
    phases = {};
    return false;
  }
  if (is_allgather(c.algorithm)) {
    // Rank r's block lands at [r * d / n, (r + 1) * d / n) of `data`.
    const auto mine = std::as_bytes(std::span(gather.mine));
    const auto all = std::as_writable_bytes(data);
    if (c.algorithm == Algorithm::kAllgatherRing) {
      comm.allgatherv(mine, all, gather.counts);
    } else {
      comm.native_allgatherv(mine, all, gather.counts);
    }
    phases = {};
    return false;
  }
  if (c.algorithm == Algorithm::kSkipReduce) {
    SkipReduceOptions skip_options;
    skip_options.skip = c.skip;
    skip_options.seed = options.seed;
    skip_options.step = step;
    skip_options.min_elements = options.skip_min_elements;
    skip_options.segment_bytes = segment_bytes;
    SkipReduceReport report;
    skip_reduce(comm, data, skip_options, &report);
    phases = report.phases;
    if (schedule != nullptr) *schedule = report.schedule;
    return !report.schedule.protected_buffer;
  }
  AllreduceOptions allreduce_options;
  allreduce_options.algorithm =
      c.algorithm == Algorithm::kNative ? AllreduceAlgorithm::kNative : AllreduceAlgorithm::kRing;
  allreduce_options.segment_bytes = segment_bytes;
  allreduce(comm, data, allreduce_options, &phases);
  return false;
}

// Checks one reduced buffer against the closed-form sum; every rank learns
// whether any rank failed.
void verify(Communicator& comm, const Case& c, std::span<const float> data,
            const SkipSchedule& schedule, bool skipped) {
  const int n = comm.size();
  std::size_t wrong = 0;
  const auto check_range = [&](std::size_t begin, std::size_t end, double rank_weight_sum) {
    for (std::size_t i = begin; i < end; ++i) {
      const double expected = rank_weight_sum * static_cast<double>(i % 13 + 1);
      if (static_cast<double>(data[i]) != expected) ++wrong;
    }
  };
  if (is_broadcast(c.algorithm)) {
    for (std::size_t i = 0; i < data.size(); ++i) {
      if (data[i] != input_value(0, i)) ++wrong;
    }
  } else if (is_allgather(c.algorithm)) {
    for (int q = 0; q < n; ++q) {  // element i of rank q's block: rank q's input
      const Block block = allgather_block(data.size(), n, q);
      for (std::size_t i = block.begin; i < block.end; ++i) {
        if (data[i] != input_value(q, i)) ++wrong;
      }
    }
  } else if (skipped) {
    for (const SkipChunk& chunk : schedule.chunks) {
      double weights = 0;
      for (int k = 0; k < chunk.contributors; ++k) weights += (chunk.first_contributor + k) % n + 1;
      check_range(chunk.begin, chunk.end, weights);
    }
  } else {
    check_range(0, data.size(), n * (n + 1) / 2.0);
  }
  const std::vector<std::uint64_t> wrong_per_rank =
      allgather_value<std::uint64_t>(comm, static_cast<std::uint64_t>(wrong));
  for (int r = 0; r < n; ++r) {
    if (wrong_per_rank[static_cast<std::size_t>(r)] != 0) {
      throw Error(fmt::format(
          "[bench] verification failed for {} (skip {}) on {} elements: rank {} has {} wrong "
          "elements; no timing is reported for a wrong result",
          algorithm_name(c.algorithm), c.skip, data.size(), r,
          wrong_per_rank[static_cast<std::size_t>(r)]));
    }
  }
}

std::vector<Row> measure(Communicator& comm, const Options& options) {
  const int n = comm.size();
  const std::size_t segment_bytes = parse_bytes(options.segment, "--segment-bytes");
  std::vector<std::size_t> sizes;
  for (const std::string& item : split_list(options.sizes, "--sizes")) {
    const std::size_t bytes = parse_bytes(item, "--sizes");
    if (bytes % sizeof(float) != 0) {
      throw InvalidArgument(fmt::format(
          "--sizes: {} bytes is not a whole number of float32 elements (a multiple of 4)", bytes));
    }
    sizes.push_back(bytes);
  }
  const std::vector<Case> cases = parse_cases(options, comm, comm.rank() == 0);
  std::vector<Row> rows;
  for (std::size_t bytes : sizes) {
    const std::size_t numel = bytes / sizeof(float);
    std::vector<float> pristine(numel);
    for (std::size_t i = 0; i < numel; ++i) pristine[i] = input_value(comm.rank(), i);
    std::vector<float> work(numel);
    const AllgatherInput gather = allgather_input(pristine, comm.size(), comm.rank());
    for (const Case& c : cases) {
      AllreduceReport phases;
      SkipSchedule schedule;
      std::int64_t step = 0;
      work = pristine;
      const bool skipped =
          run_case(comm, c, options, segment_bytes, step++, work, gather, phases, &schedule);
      verify(comm, c, work, schedule, skipped);
      for (int i = 0; i < options.warmup; ++i) {
        run_case(comm, c, options, segment_bytes, step++, work, gather, phases, nullptr);
      }
      std::vector<double> total_ms, rs_ms, ag_ms;
      for (int i = 0; i < options.iters; ++i) {
        std::copy(pristine.begin(), pristine.end(), work.begin());
        comm.barrier();
        Stopwatch clock;
        run_case(comm, c, options, segment_bytes, step++, work, gather, phases, nullptr);
        total_ms.push_back(clock.seconds() * 1e3);
        rs_ms.push_back(phases.reduce_scatter_s * 1e3);
        ag_ms.push_back(phases.allgather_s * 1e3);
      }
      Row row;
      row.algorithm = std::string(algorithm_name(c.algorithm));
      row.skip = c.skip;
      row.skip_applied = skipped;
      row.bytes = bytes;
      row.time_ms = median_of_rank_max(comm, total_ms);
      const double rs = median_of_rank_max(comm, rs_ms);
      const double ag = median_of_rank_max(comm, ag_ms);
      if (c.algorithm != Algorithm::kNative && is_allreduce(c.algorithm)) {
        row.rs_time_ms = rs;
        row.ag_time_ms = ag;
      }
      row.algbw_gbps = row.time_ms > 0 ? static_cast<double>(bytes) / (row.time_ms * 1e6) : 0.0;
      // What crosses each link: 2(n-1)/n of the buffer for an all-reduce,
      // (n-1)/n for an allgather, the buffer for a broadcast.
      row.busbw_gbps = is_broadcast(c.algorithm)
                           ? row.algbw_gbps
                           : row.algbw_gbps * (is_allgather(c.algorithm) ? 1.0 : 2.0) * (n - 1) / n;
      rows.push_back(row);
    }
  }
  return rows;
}

nlohmann::json to_json(const Row& row, std::string_view backend, int world,
                       const Options& options) {
  nlohmann::json j = {{"algorithm", row.algorithm},
                      {"backend", backend},
                      {"world", world},
                      {"bytes", row.bytes},
                      {"skip", row.skip},
                      {"skip_applied", row.skip_applied},
                      {"time_ms", row.time_ms},
                      {"algbw_gbps", row.algbw_gbps},
                      {"busbw_gbps", row.busbw_gbps},
                      {"iters", options.iters},
                      {"segment_bytes", parse_bytes(options.segment, "--segment-bytes")}};
  j["rs_time_ms"] = row.rs_time_ms ? nlohmann::json(*row.rs_time_ms) : nlohmann::json(nullptr);
  j["ag_time_ms"] = row.ag_time_ms ? nlohmann::json(*row.ag_time_ms) : nlohmann::json(nullptr);
  return j;
}

void print_table(const std::vector<Row>& rows, std::string_view backend, int world,
                 const Options& options) {
  fmt::print(
      "all-reduce (allgather, broadcast: the same total size) on the {} backend, {} ranks, median "
      "of {} runs (max over ranks)\n",
      backend, world, options.iters);
  fmt::print("{:<16} {:>4} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11}\n", "algorithm", "skip",
             "size", "time ms", "rs ms", "ag ms", "algbw GB/s", "busbw GB/s");
  const auto optional_ms = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.3f}", *v) : std::string("-");
  };
  for (const Row& row : rows) {
    const std::string skip = row.algorithm != "skipreduce"
                                 ? "-"
                                 : fmt::format("{}{}", row.skip, row.skip_applied ? "" : "*");
    fmt::print("{:<16} {:>4} {:>10} {:>10.3f} {:>10} {:>10} {:>11.3f} {:>11.3f}\n", row.algorithm,
               skip, format_bytes(static_cast<double>(row.bytes)), row.time_ms,
               optional_ms(row.rs_time_ms), optional_ms(row.ag_time_ms), row.algbw_gbps,
               row.busbw_gbps);
  }
  if (std::any_of(rows.begin(), rows.end(), [](const Row& r) {
        return r.algorithm == "skipreduce" && !r.skip_applied && r.skip > 0;
      })) {
    fmt::print("* buffer below --skip-min-elements ({}): reduced in full\n",
               options.skip_min_elements);
  }
}

void run(const Options& options) {
  check_iterations(options.iters, options.warmup);
  check_format(options.format);
  std::vector<Row> rows;
  std::string backend;
  int size = 0;
  run_world(world_options(options.world), [&](Communicator& comm) {
    std::vector<Row> measured = measure(comm, options);
    if (comm.rank() == 0) {
      rows = std::move(measured);
      backend = std::string(comm.backend());
      size = comm.size();
    }
  });
  if (backend.empty()) return;  // not rank 0 of an MPI job
  if (options.format == "json") {
    nlohmann::json out = nlohmann::json::array();
    for (const Row& row : rows) out.push_back(to_json(row, backend, size, options));
    std::cout << out.dump(2) << std::endl;
  } else {
    print_table(rows, backend, size, options);
  }
}

}  // namespace
}  // namespace bench_collectives_impl

void add_bench_collectives_command(CLI::App& bench) {
  using namespace bench_collectives_impl;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "collectives",
      "All-reduce time and bandwidth: our ring, the native one (MPI), Skip-Reduce; allgather: "
      "our ring against the backend's (MPI); broadcast: our tree against the backend's (MPI)");
  add_world_flags(*cmd, options->world);
  cmd->add_option("--sizes", options->sizes, "buffer sizes in bytes (K/M/G suffixes)")
      ->capture_default_str();
  cmd->add_option("--algorithms", options->algorithms, std::string(kAlgorithmNames))
      ->capture_default_str();
  cmd->add_option("--skips", options->skips, "Skip-Reduce skips s (default: 0, n/4, n/2)");
  cmd->add_option("--iters", options->iters, "timed runs per measurement (median reported)")
      ->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "untimed runs before timing")->capture_default_str();
  cmd->add_option("--segment-bytes", options->segment, "ring segment size")->capture_default_str();
  cmd->add_option("--skip-min-elements", options->skip_min_elements,
                  "Skip-Reduce reduces smaller buffers in full")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Skip-Reduce rotation seed")->capture_default_str();
  cmd->add_option("--format", options->format, "table | json")->capture_default_str();
  cmd->callback([options] { run(*options); });
}

}  // namespace sparsecomm::cli
