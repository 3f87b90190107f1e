#include "bench_exchange.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cli_util.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/index_codec.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/comm/backend.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/timer.h"
#include "world_flags.h"

namespace sparsecomm::cli {
// Named so that the tool's sources can compile as one unit (UNITY_BUILD).
namespace bench_exchange_impl {
namespace {

struct Options {
  WorldFlags world;  // backend and timeout: --workers is a list of world sizes here
  std::string workers = "2,4,8";
  std::string numel = "1M";
  std::string densities = "0.001,0.01";
  std::string patterns = "union,allgather,sparse-allreduce";
  std::string algorithms = "recursive-doubling,split";
  std::string values = "fp32";
  std::string selection = "random";
  bool raw_indices = false;
  int iters = 10;
  int warmup = 2;
  std::uint64_t seed = 1;
  std::string format = "table";
};

// One measured configuration.
struct Case {
  ExchangePattern pattern;
  SparseAllreduceAlgorithm algorithm = SparseAllreduceAlgorithm::kAuto;
};

// Per-iteration maximum over ranks, then the median over iterations; bytes
// are the maximum over ranks (they do not change between iterations).
struct Row {
  std::string pattern;
  std::string algorithm;
  int world = 0;
  std::size_t numel = 0;
  double density = 0;
  std::string values;
  std::size_t union_size = 0;
  std::size_t selected_total = 0;
  double time_ms = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  double index_bytes_saved = 0;  // mean over ranks of raw - encoded
  double index_saved_fraction = 0;
};

std::vector<double> parse_densities(const Options& options) {
  std::vector<double> densities;
  for (const std::string& item : split_list(options.densities, "--densities")) {
    double value = 0;
    try {
      std::size_t used = 0;
      value = std::stod(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::logic_error&) {
      throw InvalidArgument(fmt::format("--densities: '{}' is not a number", item));
    }
    if (!(value > 0.0 && value <= 1.0)) {
      throw InvalidArgument(fmt::format("--densities: {} is outside (0, 1]", item));
    }
    densities.push_back(value);
  }
  return densities;
}

std::vector<int> parse_workers(const Options& options) {
  std::vector<int> workers;
  for (const std::string& item : split_list(options.workers, "--workers")) {
    int value = 0;
    try {
      std::size_t used = 0;
      value = std::stoi(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::logic_error&) {
      throw InvalidArgument(fmt::format("--workers: '{}' is not an integer", item));
    }
    if (value < 1) throw InvalidArgument(fmt::format("--workers: {} must be >= 1", value));
    workers.push_back(value);
  }
  return workers;
}

std::vector<Case> parse_cases(const Options& options) {
  std::vector<Case> cases;
  for (const std::string& name : split_list(options.patterns, "--patterns")) {
    const ExchangePattern pattern = parse_exchange_pattern(name);
    if (pattern == ExchangePattern::kSharedIndices) {
      throw InvalidArgument(
          "--patterns: 'shared' needs identical selections on all ranks; it is the value "
          "all-reduce of 'union' without the index exchange (valid: union, allgather, "
          "sparse-allreduce, ok-topk)");
    }
    if (pattern == ExchangePattern::kSparseAllreduce) {
      for (const std::string& algorithm : split_list(options.algorithms, "--algorithms")) {
        cases.push_back({pattern, parse_sparse_allreduce_algorithm(algorithm)});
      }
    } else {
      cases.push_back({pattern});
    }
  }
  return cases;
}

// Exactly representable inputs (multiples of 1/4 in [-1.75, 1.75]): every
// encoding carries them unchanged and every sum is exact, so the result can
// be compared with the reference bit for bit.
float input_value(const Philox& rng, int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>(rng.below(15, static_cast<std::uint64_t>(rank), i)) -
                            7) /
         4.0f;
}

// `count` distinct ascending uniform indices in [lo, hi), from sorted
// exponential spacings: O(count), no O(hi - lo) pass.
std::vector<Index> sorted_sample(const Philox& rng, std::uint64_t stream, std::size_t count,
                                 std::size_t lo, std::size_t hi) {
  const std::size_t len = hi - lo;
  count = std::min(count, len);
  std::vector<double> points(count + 1);
  double x = 0;
  for (std::size_t j = 0; j <= count; ++j) {
    const double u = (static_cast<double>(rng.u64(stream, j) >> 11) + 0.5) * 0x1p-53;
    x -= std::log(u);
    points[j] = x;
  }
  std::vector<Index> indices(count);
  std::size_t next = 0;  // smallest offset still free
  for (std::size_t j = 0; j < count; ++j) {
    auto offset = static_cast<std::size_t>(points[j] / x * static_cast<double>(len));
    offset = std::min(std::max(offset, next), len - (count - j));
    indices[j] = static_cast<Index>(lo + offset);
    next = offset + 1;
  }
  return indices;
}

// Rank `rank`'s selection: k random indices over [0, d) ("random", like
// Top-k: the union grows up to n*k), or k/n in its own n-th of the vector
// ("disjoint", like MiCRO: the union is k).
std::vector<Index> selection_of(const Options& options, const Philox& rng, int n, int rank,
                                std::size_t numel, double density) {
  const std::size_t k = target_count(density, numel);
  const auto stream = static_cast<std::uint64_t>(1000 + rank);
  if (options.selection == "disjoint") {
    const std::size_t lo = chunk_begin(numel, n, rank);
    const std::size_t hi = chunk_begin(numel, n, rank + 1);
    const std::size_t share =
        k / static_cast<std::size_t>(n) +
        (static_cast<std::size_t>(rank) < k % static_cast<std::size_t>(n) ? 1 : 0);
    return sorted_sample(rng, stream, share, lo, hi);
  }
  return sorted_sample(rng, stream, k, 0, numel);
}

// The expected `out` of both pattern families (union: every rank's a_r on U;
// sparse: a_q on I_q only), identical on all ranks.
struct Reference {
  std::vector<float> union_out;
  std::vector<float> sparse_out;
  std::size_t union_size = 0;
  std::size_t selected_total = 0;
};

Reference reference(const Options& options, const Philox& rng, int n, std::size_t numel,
                    double density) {
  Reference ref;
  std::vector<char> in_union(numel, 0);
  ref.sparse_out.assign(numel, 0.0f);
  for (int q = 0; q < n; ++q) {
    const std::vector<Index> selected = selection_of(options, rng, n, q, numel, density);
    ref.selected_total += selected.size();
    for (const Index i : selected) {
      in_union[i] = 1;
      ref.sparse_out[i] += input_value(rng, q, i);
    }
  }
  ref.union_out.assign(numel, 0.0f);
  const auto divisor = static_cast<float>(n);
  for (std::size_t i = 0; i < numel; ++i) {
    ref.sparse_out[i] /= divisor;
    if (in_union[i] == 0) continue;
    ++ref.union_size;
    float sum = 0.0f;
    for (int q = 0; q < n; ++q) sum += input_value(rng, q, i);
    ref.union_out[i] = sum / divisor;
  }
  return ref;
}

std::string algorithm_label(const Case& c, ValueEncoding values, int n, std::size_t numel,
                            std::size_t selected_total) {
  switch (c.pattern) {
    case ExchangePattern::kUnionAllreduce:
    case ExchangePattern::kSharedIndices:
      // The value sum: the ring, or an allgather of the encoded values when
      // that moves fewer bytes (exchange_internal.cc).
      return values != ValueEncoding::kFloat32 && n * wire_bits_per_value(values) < 64.0
                 ? "allgatherv"
                 : "ring";
    case ExchangePattern::kSparseAllgather:
      return "allgatherv";
    case ExchangePattern::kSparseAllreduce:
      if (c.algorithm == SparseAllreduceAlgorithm::kAuto) {
        // The rule of ExchangeOptions::sparse_switch_factor, for the label.
        const bool doubling =
            static_cast<double>(selected_total) * ExchangeOptions{}.sparse_switch_factor <
            static_cast<double>(numel);
        return doubling ? "auto:rec-doubling" : "auto:split";
      }
      return std::string(sparse_allreduce_algorithm_name(c.algorithm));
    case ExchangePattern::kOkTopk:
      return "balanced";
  }
  return "?";
}

template <class T>
std::vector<T> gather(Communicator& comm, const std::vector<T>& mine) {
  std::vector<T> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(bytes_of(std::span<const T>(mine)), writable_bytes_of(std::span<T>(all)));
  return all;
}

// Checks one result against the reference; every rank learns whether any failed.
void verify(Communicator& comm, const Case& c, ValueEncoding values, double density,
            std::span<const float> out, std::span<const float> expected,
            const ExchangeResult& result, std::size_t expected_union) {
  std::uint64_t wrong = 0;
  if (c.pattern == ExchangePattern::kOkTopk) {
    // The global selection keeps part of the sum: each element is the sum
    // or 0, and no more survive than the union holds.
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      wrong += out[i] != expected[i] && out[i] != 0.0f ? 1 : 0;
      nonzero += out[i] != 0.0f ? 1 : 0;
    }
    if (result.union_size > expected_union || nonzero > result.union_size) ++wrong;
  } else {
    for (std::size_t i = 0; i < out.size(); ++i) wrong += out[i] != expected[i] ? 1 : 0;
    if (result.union_size != expected_union) ++wrong;
  }
  const std::vector<std::uint64_t> all = gather(comm, std::vector<std::uint64_t>{wrong});
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r] != 0) {
      throw Error(fmt::format(
          "[bench] verification failed for {} ({}, {} values) at density {}: rank {} has {} wrong "
          "elements or a wrong union size; no timing is reported for a wrong result",
          exchange_pattern_name(c.pattern), sparse_allreduce_algorithm_name(c.algorithm),
          value_encoding_name(values), density, r, all[r]));
    }
  }
}

std::vector<Row> measure(Communicator& comm, const Options& options, std::size_t numel) {
  const int n = comm.size();
  const int r = comm.rank();
  const std::vector<double> densities = parse_densities(options);
  const std::vector<Case> cases = parse_cases(options);
  std::vector<ValueEncoding> encodings;
  for (const std::string& name : split_list(options.values, "--values")) {
    encodings.push_back(parse_value_encoding(name));
  }
  const Philox rng(options.seed);
  std::vector<float> pristine(numel);
  for (std::size_t i = 0; i < numel; ++i) pristine[i] = input_value(rng, r, i);
  std::vector<float> accumulated(numel), out(numel);
  std::vector<Row> rows;
  for (const double density : densities) {
    SparseSelection selection;
    for (const Index i : selection_of(options, rng, n, r, numel, density))
      selection.indices.push_back(i);
    const Reference ref = reference(options, rng, n, numel, density);
    for (const ValueEncoding values : encodings) {
      for (const Case& c : cases) {
        ExchangeOptions exchange_options;
        exchange_options.values = values;
        exchange_options.encode_indices = !options.raw_indices;
        exchange_options.sparse_algorithm = c.algorithm;
        const auto exchanger = make_sparse_exchange(c.pattern, exchange_options);
        ExchangeResult result;
        const bool union_like = c.pattern == ExchangePattern::kUnionAllreduce;
        accumulated = pristine;
        exchanger->exchange(comm, selection, accumulated, out, result);
        verify(comm, c, values, density, out, union_like ? ref.union_out : ref.sparse_out, result,
               ref.union_size);
        for (int i = 0; i < options.warmup; ++i) {
          std::copy(pristine.begin(), pristine.end(), accumulated.begin());
          exchanger->exchange(comm, selection, accumulated, out, result);
        }
        std::vector<double> times;
        for (int i = 0; i < options.iters; ++i) {
          std::copy(pristine.begin(), pristine.end(), accumulated.begin());
          comm.barrier();
          Stopwatch clock;
          exchanger->exchange(comm, selection, accumulated, out, result);
          times.push_back(clock.seconds() * 1e3);
        }
        const double time_ms = median_of_rank_max(comm, times);
        const std::vector<std::uint64_t> bytes = gather(
            comm, std::vector<std::uint64_t>{result.bytes_sent, result.bytes_received,
                                             result.index_bytes_raw, result.index_bytes_encoded});
        Row row;
        row.pattern = std::string(exchange_pattern_name(c.pattern));
        row.algorithm = algorithm_label(c, values, n, numel, ref.selected_total);
        row.world = n;
        row.numel = numel;
        row.density = density;
        row.values = std::string(value_encoding_name(values));
        row.union_size = result.union_size;
        row.selected_total = ref.selected_total;
        row.time_ms = time_ms;
        std::uint64_t raw = 0, encoded = 0;
        for (std::size_t q = 0; q < static_cast<std::size_t>(n); ++q) {
          row.bytes_sent = std::max(row.bytes_sent, bytes[4 * q]);
          row.bytes_received = std::max(row.bytes_received, bytes[4 * q + 1]);
          raw += bytes[4 * q + 2];
          encoded += bytes[4 * q + 3];
        }
        row.index_bytes_saved = static_cast<double>(raw - encoded) / n;
        row.index_saved_fraction =
            raw > 0 ? 1.0 - static_cast<double>(encoded) / static_cast<double>(raw) : 0.0;
        rows.push_back(row);
      }
    }
  }
  return rows;
}

nlohmann::json to_json(const Row& row, std::string_view backend, const Options& options) {
  return {{"pattern", row.pattern},
          {"algorithm", row.algorithm},
          {"backend", backend},
          {"world", row.world},
          {"numel", row.numel},
          {"density", row.density},
          {"values", row.values},
          {"encode_indices", !options.raw_indices},
          {"selection", options.selection},
          {"selected_total", row.selected_total},
          {"union_size", row.union_size},
          {"time_ms", row.time_ms},
          {"bytes_sent_per_rank", row.bytes_sent},
          {"bytes_received_per_rank", row.bytes_received},
          {"index_bytes_saved", row.index_bytes_saved},
          {"index_bytes_saved_fraction", row.index_saved_fraction},
          {"iters", options.iters}};
}

void print_table(const std::vector<Row>& rows, std::string_view backend, const Options& options) {
  fmt::print(
      "sparse exchange on the {} backend, {} selections, indices {}, median of {} runs\n"
      "(time: max over ranks per run; bytes: max over ranks; idx saved: index bytes saved by the "
      "varint encoding)\n",
      backend, options.selection, options.raw_indices ? "raw" : "varint-encoded", options.iters);
  fmt::print("{:<17} {:<19} {:>3} {:>8} {:>8} {:>6} {:>8} {:>9} {:>11} {:>11} {:>9}\n", "pattern",
             "algorithm", "n", "numel", "density", "values", "K", "time ms", "sent/rank",
             "recv/rank", "idx saved");
  for (const Row& row : rows) {
    fmt::print("{:<17} {:<19} {:>3} {:>8} {:>8} {:>6} {:>8} {:>9.3f} {:>11} {:>11} {:>8.0f}%\n",
               row.pattern, row.algorithm, row.world, row.numel, row.density, row.values,
               row.union_size, row.time_ms, format_bytes(static_cast<double>(row.bytes_sent)),
               format_bytes(static_cast<double>(row.bytes_received)),
               100.0 * row.index_saved_fraction);
  }
}

void run(const Options& options) {
  check_iterations(options.iters, options.warmup);
  check_format(options.format);
  if (options.selection != "random" && options.selection != "disjoint") {
    throw InvalidArgument(
        fmt::format("--selection '{}': valid are random, disjoint", options.selection));
  }
  const std::size_t numel = parse_bytes(options.numel, "--numel (elements)");
  if (numel > std::size_t{1} << 32) {
    throw InvalidArgument(fmt::format("--numel {} exceeds 2^32 (32-bit indices)", numel));
  }
  // Validate the lists before starting any world.
  parse_densities(options);
  parse_cases(options);
  for (const std::string& name : split_list(options.values, "--values")) parse_value_encoding(name);

  const bool mpi = resolve_backend(parse_backend(options.world.backend)) == BackendKind::kMpi;
  const std::vector<int> worlds = mpi ? std::vector<int>{0} : parse_workers(options);
  std::vector<Row> rows;
  std::string backend;
  for (const int ranks : worlds) {
    run_world(world_options(options.world, ranks), [&](Communicator& comm) {
      std::vector<Row> measured = measure(comm, options, numel);
      if (comm.rank() == 0) {
        rows.insert(rows.end(), measured.begin(), measured.end());
        backend = std::string(comm.backend());
      }
    });
  }
  if (backend.empty()) return;  // not rank 0 of an MPI job
  if (options.format == "json") {
    nlohmann::json out = nlohmann::json::array();
    for (const Row& row : rows) out.push_back(to_json(row, backend, options));
    std::cout << out.dump(2) << std::endl;
  } else {
    print_table(rows, backend, options);
  }
}

}  // namespace
}  // namespace bench_exchange_impl

void add_bench_exchange_command(CLI::App& bench) {
  using namespace bench_exchange_impl;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "exchange",
      "Sparse exchange patterns: union all-reduce, sparse allgather, sparse all-reduce");
  add_backend_flag(*cmd, options->world.backend);
  cmd->add_option("--workers,-n", options->workers,
                  "world sizes for the thread backend (list; under MPI the job's size)")
      ->capture_default_str();
  cmd->add_option("--numel", options->numel, "vector length in elements (K/M suffixes, binary)")
      ->capture_default_str();
  cmd->add_option("--densities", options->densities, "selected fraction per rank (list)")
      ->capture_default_str();
  cmd->add_option("--patterns", options->patterns,
                  "union, allgather, sparse-allreduce, ok-topk (list)")
      ->capture_default_str();
  cmd->add_option("--algorithms", options->algorithms,
                  "sparse all-reduce algorithms: recursive-doubling, split, auto (list)")
      ->capture_default_str();
  cmd->add_option("--values", options->values, "value encodings: fp32, fp16, bf16 (list)")
      ->capture_default_str();
  cmd->add_option("--selection", options->selection,
                  "random (k per rank anywhere, like Top-k) | disjoint (k/n per rank in its own "
                  "range, like MiCRO)")
      ->capture_default_str();
  cmd->add_flag("--raw-indices", options->raw_indices, "send indices as raw uint32 (no varints)");
  cmd->add_option("--iters", options->iters, "timed runs per measurement (median reported)")
      ->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "untimed runs before timing")->capture_default_str();
  cmd->add_option("--seed", options->seed, "seed of the inputs and selections")
      ->capture_default_str();
  cmd->add_option("--format", options->format, "table | json")->capture_default_str();
  add_timeout_flag(*cmd, options->world.timeout_ms);
  cmd->callback([options] { run(*options); });
}

}  // namespace sparsecomm::cli
