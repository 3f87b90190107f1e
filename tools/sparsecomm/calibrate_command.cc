#include "calibrate_command.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "calibrate_network.h"
#include "cli_util.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/index_codec.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/comm/backend.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/hash.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/optim/sgd.h"
#include "sparsecomm/perf/collective_cost.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/report/statistics.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sync/powersgd.h"
#include "sparsecomm/sync/sparsify_exchange_step.h"
#include "sparsecomm/traces/gradient_stream.h"
#include "world_flags.h"

namespace sparsecomm::cli {
namespace {

struct CalibrateOptions {
  WorldFlags world{.workers = 2};
  std::string out;
  std::string name;
  std::string numel = "4M";
  double density = 0.01;
  std::string schemes = "topk,dgc,gaussiank,randomk,cltk,micro,exdyna,deft";
  std::string sizes = "64K,1M,4M,16M";  // ring all-reduce buffers
  int iters = 10;
  int steps = 12;
  bool host_only = false;
  std::string format = "table";
};

// One all-reduce buffer size: the measured time of our ring all-reduce
// (slowest rank, median over iterations) and the model's prediction from
// the fitted profile (perf::ring_allreduce).
struct SizeRow {
  std::size_t bytes = 0;
  double measured_s = 0.0;
  double fitted_s = 0.0;
};

// The buffer of at least 1 MiB (where the transfer dwarfs the latency)
// whose time is furthest from the fitted line, when that is more than a
// quarter of its measured time: beta, fitted on the two largest buffers,
// then does not hold for smaller ones. nullptr when the line holds.
const SizeRow* off_the_line(const std::vector<SizeRow>& rows) {
  constexpr std::size_t kTransferBound = std::size_t{1} << 20;
  constexpr double kTolerance = 0.25;
  const SizeRow* worst = nullptr;
  double worst_error = kTolerance;
  for (const SizeRow& row : rows) {
    const double error = std::abs(row.fitted_s / row.measured_s - 1.0);
    if (row.bytes >= kTransferBound && error > worst_error) {
      worst = &row;
      worst_error = error;
    }
  }
  return worst;
}

// Keeps the timed additions from being optimized away.
volatile float sink_ = 0.0f;

// Host costs per element on this rank, each measured while every rank
// measures the same (so ranks sharing a machine share it as in training).
struct HostCosts {
  double gamma = 0.0, accumulate = 0.0, update = 0.0;
  double fill = 0.0, scatter = 0.0;    // decoding into a gradient beyond the cache
  double pack = 0.0;                   // taking selected values out of it
  double index_decode = 0.0;           // one varint index
  double merge = 0.0;                  // one entry through one level of a pairwise merge
  double low_rank = 0.0;               // PowerSGD's arithmetic per matrix element,
  double low_rank_per_rank = 0.0;      // and per element and unit of rank
  std::vector<double> encode, decode;  // per value, per codec (value_encoding_names())
  std::vector<double> select;          // per scheme, in the order asked
};

// The decoding measurement's gradient: 128 MiB, beyond the last-level
// cache of the machines at hand (a model's gradient of that size misses on
// every scattered entry).
constexpr std::size_t kDecodeFloats = std::size_t{32} << 20;

// The value codecs per value: encoding c d values (with the rounding's
// nonce, as the exchanges do) and decoding them, each codec but fp32.
void measure_codecs(const CalibrateOptions& o, HostCosts& costs) {
  const std::size_t count = std::max<std::size_t>(
      kQuantizationBlock, static_cast<std::size_t>(o.density * static_cast<double>(kDecodeFloats)));
  std::vector<float> source(count);
  std::mt19937_64 random(99);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (float& v : source) v = normal(random);
  std::vector<float> values(count), decoded(count);
  for (const std::string& name : value_encoding_names()) {
    const ValueEncoding encoding = parse_value_encoding(name);
    std::vector<std::byte> bytes(encoded_value_bytes(encoding, count));
    std::vector<double> encode, decode;
    for (int it = 0; it <= o.iters; ++it) {
      std::copy(source.begin(), source.end(), values.begin());
      Stopwatch clock;
      const std::uint64_t nonce =
          is_stochastic(encoding) ? hash_bytes(std::as_bytes(std::span<const float>(values))) : 0;
      encode_values(values, encoding, bytes, nonce);
      const double encode_s = clock.seconds();
      clock.restart();
      decode_values(bytes, encoding, decoded);
      const double decode_s = clock.seconds();
      sink_ = decoded[count / 2];
      if (it == 0) continue;
      encode.push_back(encode_s / static_cast<double>(count));
      decode.push_back(decode_s / static_cast<double>(count));
    }
    const bool copy = encoding == ValueEncoding::kFloat32;  // a copy: the model's 0
    costs.encode.push_back(copy ? 0.0 : report::median(encode));
    costs.decode.push_back(copy ? 0.0 : report::median(decode));
  }
}

// PowerSGD's arithmetic per matrix element at rank r, from the method's own
// metrics (selection_s) on a world of one rank: one factorized 1024 x d/1024
// tensor at ranks 1 and 4, the line through the two (the products grow with
// r, the passes over the matrix do not): {per element, per element and
// unit of rank}.
std::pair<double, double> measure_low_rank(const CalibrateOptions& o, std::size_t d,
                                           Communicator& self) {
  constexpr std::size_t kRows = 1024;
  constexpr std::size_t kLow = 1;
  constexpr std::size_t kHigh = 4;
  const std::size_t numel = kRows * std::max<std::size_t>(2 * kHigh + 1, d / kRows);
  const auto stream = make_synthetic_stream(SyntheticStreamOptions{.numel = numel});
  const std::vector<LayerSpan> matrix = {{"matrix", 0, numel, kRows}};
  UninitVector<float> gradient(numel);
  auto per_element = [&](std::size_t rank) {
    const auto powersgd =
        make_powersgd(SchemeOptions({{"rank", std::to_string(rank)}}), NonFinitePolicy::kStop);
    std::vector<double> seconds;
    for (int t = 0; t < o.steps; ++t) {
      stream->fill(0, t, gradient);
      StepContext ctx;
      ctx.step = t;
      ctx.layers = matrix;
      const StepMetrics m = powersgd->synchronize(gradient, ctx, self);
      if (t < 2) continue;  // warm-up: first allocations
      seconds.push_back(m.selection_s / static_cast<double>(numel));
    }
    return report::median(seconds);
  };
  const double low = per_element(kLow);
  const double high = per_element(kHigh);
  const double per_rank = std::max(0.0, (high - low) / static_cast<double>(kHigh - kLow));
  return {std::max(0.0, low - per_rank * kLow), per_rank};
}

HostCosts measure_host(const CalibrateOptions& o, std::size_t d,
                       const std::vector<std::string>& schemes) {
  HostCosts costs;
  // gamma: adding a received buffer into another, as the ring's reduction does.
  {
    std::vector<float> a(d, 1.0f), b(d, 2.0f);
    std::vector<double> seconds;
    for (int it = 0; it <= o.iters; ++it) {
      Stopwatch clock;
      for (std::size_t i = 0; i < d; ++i) a[i] += b[i];
      if (it > 0) seconds.push_back(clock.seconds());
    }
    sink_ = a[d / 2];
    costs.gamma = report::median(seconds) / static_cast<double>(d);
  }
  // update: the optimizer (momentum 0.9, Nesterov) over d parameters.
  {
    FlatSgd sgd(SgdOptions{.momentum = 0.9, .nesterov = true, .weight_decay = 0.0});
    std::vector<float> p(d, 0.5f), g(d, 0.01f);
    std::vector<double> seconds;
    for (int it = 0; it <= o.iters; ++it) {
      Stopwatch clock;
      sgd.step(p, g, 0.1);
      if (it > 0) seconds.push_back(clock.seconds());
    }
    costs.update = report::median(seconds) / static_cast<double>(d);
  }
  // Decoding: zeroing the gradient, then adding c d entries at sorted
  // random indices (as one rank's block arrives), as the sparse patterns
  // end (perf::CostProfile::fill_s_per_element, scatter_s_per_element).
  {
    std::vector<float> dense(kDecodeFloats, 1.0f);
    std::vector<Index> where(std::max<std::size_t>(
        1, static_cast<std::size_t>(o.density * static_cast<double>(kDecodeFloats))));
    std::mt19937_64 random(12345);
    std::uniform_int_distribution<Index> pick(0, static_cast<Index>(kDecodeFloats - 1));
    for (Index& i : where) i = pick(random);
    std::sort(where.begin(), where.end());
    where.erase(std::unique(where.begin(), where.end()), where.end());  // as a selection is
    const std::size_t entries = where.size();
    std::vector<double> fill, scatter;
    for (int it = 0; it <= o.iters; ++it) {
      Stopwatch zero;
      std::fill(dense.begin(), dense.end(), 0.0f);
      const double zero_s = zero.seconds();
      Stopwatch add;
      for (const Index i : where) dense[i] += 0.5f;
      const double add_s = add.seconds();
      if (it == 0) continue;  // warm-up: first touch of the pages
      fill.push_back(zero_s / static_cast<double>(kDecodeFloats));
      scatter.push_back(add_s / static_cast<double>(entries));
    }
    sink_ = dense[where[entries / 2]];
    costs.fill = report::median(fill);
    costs.scatter = report::median(scatter);

    // Packing: the sender reads each selected value and subtracts it from
    // the memory (two passes over the same positions), per entry.
    // Index runs: decoding a varint-encoded list, per index, and
    // std::set_union of two such lists (what the union of n runs does at
    // each of its log2 n levels), per entry in.
    std::vector<float> values(entries);
    UninitVector<std::byte> encoded;
    encode_indices(where, encoded);
    std::vector<Index> decoded(entries), other(entries), merged(2 * entries);
    for (Index& i : other) i = pick(random);
    std::sort(other.begin(), other.end());
    other.erase(std::unique(other.begin(), other.end()), other.end());
    std::vector<double> pack, index_decode, merge;
    for (int it = 0; it <= o.iters; ++it) {
      Stopwatch take;
      for (std::size_t j = 0; j < entries; ++j) values[j] = dense[where[j]];
      for (std::size_t j = 0; j < entries; ++j) dense[where[j]] -= values[j];
      const double take_s = take.seconds();
      Stopwatch decode;
      decode_indices(encoded, std::span<Index>(decoded));
      const double decode_s = decode.seconds();
      Stopwatch unite;
      const auto end = std::set_union(decoded.begin(), decoded.end(), other.begin(), other.end(),
                                      merged.begin());
      const double unite_s = unite.seconds();
      sink_ = static_cast<float>(end - merged.begin());
      if (it == 0) continue;
      pack.push_back(take_s / static_cast<double>(entries));
      index_decode.push_back(decode_s / static_cast<double>(entries));
      merge.push_back(unite_s / static_cast<double>(entries + other.size()));
    }
    costs.pack = report::median(pack);
    costs.index_decode = report::median(index_decode);
    costs.merge = report::median(merge);
  }
  measure_codecs(o, costs);
  // Selection and the memory's accumulate, per scheme, from the step's own
  // metrics on a world of one rank (every scheme then reads all of d).
  const auto stream = make_synthetic_stream(SyntheticStreamOptions{.numel = d});
  std::vector<double> accumulate;
  run_thread_world(1, [&](Communicator& self) {
    for (const std::string& scheme : schemes) {
      SparsifyExchangeStep step(
          make_scheme(scheme, SchemeOptions({{"density", fmt::format("{}", o.density)}})));
      UninitVector<float> gradient(d);
      std::vector<double> select;
      for (int t = 0; t < o.steps; ++t) {
        stream->fill(0, t, gradient);
        StepContext ctx;
        ctx.step = t;
        ctx.layers = stream->layers();
        const StepMetrics m = step.synchronize(gradient, ctx, self);
        if (t < 2) continue;  // warm-up: first allocations, the controllers' first steps
        select.push_back(m.selection_s / static_cast<double>(d));
        accumulate.push_back(m.accumulate_s / static_cast<double>(d));
      }
      costs.select.push_back(report::median(select));
    }
    std::tie(costs.low_rank, costs.low_rank_per_rank) = measure_low_rank(o, d, self);
  });
  costs.accumulate = report::median(accumulate);
  return costs;
}

// The options after their checks: the gradient's length, the schemes, and
// the all-reduce buffer sizes (ascending, distinct).
struct CalibrateInputs {
  std::size_t d = 0;
  std::vector<std::string> schemes;
  std::vector<std::size_t> sizes;
};

CalibrateInputs check_calibrate_options(const CalibrateOptions& o) {
  check_iterations(o.iters, 0);
  check_format(o.format);
  if (o.steps < 3) throw InvalidArgument(fmt::format("--steps must be >= 3, got {}", o.steps));
  if (!(o.density > 0 && o.density <= 1)) {
    throw InvalidArgument(fmt::format("--density must be in (0, 1], got {}", o.density));
  }
  CalibrateInputs in;
  in.d = parse_bytes(o.numel, "--numel");
  if (in.d < 1000) throw InvalidArgument(fmt::format("--numel must be >= 1000, got {}", in.d));
  in.schemes = split_list(o.schemes, "--schemes");
  for (const std::string& s : split_list(o.sizes, "--sizes"))
    in.sizes.push_back(parse_bytes(s, "--sizes"));
  std::sort(in.sizes.begin(), in.sizes.end());
  // The slope needs distinct sizes.
  in.sizes.erase(std::unique(in.sizes.begin(), in.sizes.end()), in.sizes.end());
  if (!o.host_only && in.sizes.size() < 2) {
    throw InvalidArgument("--sizes needs at least two different buffer sizes (beta is a slope)");
  }
  if (o.host_only && !o.out.empty()) {
    throw InvalidArgument(
        "--host-only measures no network, and a profile needs one: drop --out or --host-only");
  }
  if (!o.out.empty()) {
    // Fail before measuring: the directory must exist.
    const auto parent = std::filesystem::path(o.out).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent)) {
      throw InvalidArgument(
          fmt::format("--out '{}': directory '{}' does not exist", o.out, parent.string()));
    }
  }
  return in;
}

// What a calibration measured: the profile, and for the printout the
// all-reduce rounds against the fit (none with --host-only).
struct Calibration {
  perf::CostProfile profile;
  std::vector<SizeRow> rows;
  bool beta_is_upper_bound = false;
  double lone_round_s = 0.0;  // one 8-byte round alone, for the log
  std::optional<WireFraming> framing;
};

// The host costs of the profile: each the slowest rank's (a step waits for it).
void take_host_costs(Communicator& comm, const HostCosts& mine,
                     const std::vector<std::string>& schemes, perf::CostProfile& profile) {
  auto slowest = [&](double value) {
    const std::vector<double> all = allgather_value(comm, value);
    return *std::max_element(all.begin(), all.end());
  };
  profile.gamma_s_per_element = slowest(mine.gamma);
  profile.accumulate_s_per_element = slowest(mine.accumulate);
  profile.update_s_per_element = slowest(mine.update);
  profile.fill_s_per_element = slowest(mine.fill);
  profile.scatter_s_per_element = slowest(mine.scatter);
  profile.pack_s_per_element = slowest(mine.pack);
  profile.index_decode_s_per_element = slowest(mine.index_decode);
  profile.merge_s_per_element = slowest(mine.merge);
  profile.low_rank_s_per_element = slowest(mine.low_rank);
  profile.low_rank_s_per_element_rank = slowest(mine.low_rank_per_rank);
  for (std::size_t i = 0; i < value_encoding_names().size(); ++i) {
    profile.encode_s_per_value[value_encoding_names()[i]] = slowest(mine.encode[i]);
    profile.decode_s_per_value[value_encoding_names()[i]] = slowest(mine.decode[i]);
  }
  // Unknown: 0, which the model reads as "the gradient fits".
  profile.cache_bytes = static_cast<double>(last_level_cache_bytes().value_or(0));
  double select_default = 0.0;
  for (std::size_t i = 0; i < schemes.size(); ++i) {
    profile.select_s_per_element[schemes[i]] = slowest(mine.select[i]);
    select_default = std::max(select_default, profile.select_s_per_element[schemes[i]]);
  }
  profile.select_s_per_element["default"] = select_default;
}

// alpha: a ring round of 8 bytes within a chain of rounds. beta: the slope
// of our ring all-reduce between the two largest buffers, less its
// reduction: t(N) = 2(n-1) alpha + N (2(n-1)/n beta + (n-1)/n gamma/4).
// Then the wire's framing where the ranks' messages cross a NIC.
void fit_network(Communicator& comm, const CalibrateOptions& o,
                 const std::vector<std::size_t>& sizes, Calibration& c) {
  perf::CostProfile& profile = c.profile;
  profile.alpha_s = ring_round_seconds(comm, 8, kAlphaChainRounds, o.iters);
  c.lone_round_s = ring_round_seconds(comm, 8, 1, o.iters);
  for (const std::size_t bytes : sizes) {
    c.rows.push_back({.bytes = bytes, .measured_s = ring_allreduce_seconds(comm, bytes, o.iters)});
  }
  const double n = comm.size();
  const SizeRow& big = c.rows.back();
  const SizeRow& before = c.rows[c.rows.size() - 2];
  const double slope =
      (big.measured_s - before.measured_s) / static_cast<double>(big.bytes - before.bytes);
  const double bytes_per_buffer_byte = 2 * (n - 1) / n;  // each rank sends and receives
  profile.beta_s_per_byte =
      (slope - (n - 1) / n * profile.gamma_s_per_element / 4) / bytes_per_buffer_byte;
  if (!(profile.beta_s_per_byte > 0)) {
    // The times did not grow with the buffer: noise exceeds the transfer.
    // Charge the largest buffer's whole time to bandwidth, an upper bound.
    c.beta_is_upper_bound = true;
    profile.beta_s_per_byte =
        big.measured_s / (static_cast<double>(big.bytes) * bytes_per_buffer_byte);
  }
  for (SizeRow& row : c.rows) {
    row.fitted_s =
        perf::ring_allreduce(profile, comm.size(), static_cast<double>(row.bytes)).seconds;
  }
  // Threads share memory: no NIC carries their messages.
  if (comm.backend() != "thread") {
    c.framing = measure_wire_framing(comm, sizes.back());
    if (c.framing) {
      profile.wire_bytes_per_message = c.framing->per_message;
      profile.wire_overhead_per_byte = c.framing->per_byte;
    }
  }
}

// Warnings about a fit that will mispredict: beta only bounded, or a buffer
// size far off the fitted line.
void warn_about_fit(const Communicator& comm, const Calibration& c) {
  if (c.beta_is_upper_bound) {
    spdlog::warn(
        "calibrate: the all-reduce took no longer on {} than on {}, so noise hides the "
        "transfer time; beta is bounded from above by the largest buffer's time alone. "
        "Measure larger buffers (--sizes) or more iterations (--iters) for a slope.",
        format_bytes(double(c.rows.back().bytes)),
        format_bytes(double(c.rows[c.rows.size() - 2].bytes)));
  }
  if (const SizeRow* row = off_the_line(c.rows)) {
    spdlog::warn(
        "calibrate: the all-reduce of {} took {:.1f} ms where the fitted alpha and beta give "
        "{:.1f} ms: the rate depends on the message size, and predictions for other sizes "
        "will be off.{}",
        format_bytes(double(row->bytes)), row->measured_s * 1e3, row->fitted_s * 1e3,
        comm.size() == 2 && comm.backend() == "mpi"
            ? " Between two hosts over OpenMPI's TCP transport the usual cause is the "
              "rendezvous reply of each 1 MiB segment queueing behind the bulk data flowing "
              "the other way on the same connection: run with --mca btl_tcp_eager_limit "
              "2097152 --mca btl_tcp_max_send_size 2097152 (docs/benchmarks/methodology.md, "
              "\"Two hosts\")."
            : "");
  }
}

// The table of rounds against the fit, alpha, beta and the framing.
void print_network(const Communicator& comm, const CalibrateOptions& o, const Calibration& c) {
  const perf::CostProfile& profile = c.profile;
  fmt::print(
      "\nour ring all-reduce (1 MiB segments), slowest rank, median of {}, against the "
      "model with the fitted profile:\n{:>12} {:>12} {:>12} {:>8}\n",
      o.iters, "buffer", "measured us", "model us", "error");
  for (const SizeRow& row : c.rows) {
    fmt::print("{:>12} {:>12.1f} {:>12.1f} {:>7.1f}%\n", format_bytes(double(row.bytes)),
               row.measured_s * 1e6, row.fitted_s * 1e6,
               100.0 * (row.fitted_s / row.measured_s - 1.0));
  }
  fmt::print(
      "alpha {:.2f} us (a ring round of 8 bytes in a chain of {}; one round alone after a "
      "barrier: {:.2f} us), beta {}{:.4g} ns/byte ({:.3g} Gbit/s per direction; {})\n",
      profile.alpha_s * 1e6, kAlphaChainRounds, c.lone_round_s * 1e6,
      c.beta_is_upper_bound ? "<= " : "", profile.beta_s_per_byte * 1e9,
      8.0 / profile.beta_s_per_byte / 1e9,
      c.beta_is_upper_bound ? "the largest buffer's time, all of it charged to bandwidth"
                            : "the all-reduce's slope between the two largest buffers");
  if (c.framing) {
    fmt::print(
        "wire framing (NIC counters): {:.0f} bytes per message, {:.2f}% of the payload of "
        "a {} all-reduce\n",
        profile.wire_bytes_per_message, 100.0 * profile.wire_overhead_per_byte,
        format_bytes(double(c.rows.back().bytes)));
  } else {
    fmt::print("wire framing: not measured ({}); wire bytes will count the payload alone\n",
               comm.backend() == "thread" ? "threads send no bytes on a NIC"
                                          : "a rank could not read /sys/class/net");
  }
}

void print_host_costs(const perf::CostProfile& profile, const std::vector<std::string>& schemes) {
  fmt::print(
      "\nhost, per element (slowest rank; all ranks measuring at once):\n"
      "  gamma (add)        {:.3f} ns\n  accumulate (g+e)   {:.3f} ns\n"
      "  update (SGD)       {:.3f} ns\n"
      "  zero (decoding)    {:.3f} ns\n"
      "  scatter (decoding) {:.3f} ns per entry into {} (last-level cache {})\n"
      "  pack (sending)     {:.3f} ns per value taken out of it\n"
      "  index decode       {:.3f} ns per varint index\n"
      "  merge              {:.3f} ns per entry per level of a union of runs\n"
      "  low rank (PowerSGD) {:.3f} + {:.3f} r ns per matrix element at rank r\n",
      profile.gamma_s_per_element * 1e9, profile.accumulate_s_per_element * 1e9,
      profile.update_s_per_element * 1e9, profile.fill_s_per_element * 1e9,
      profile.scatter_s_per_element * 1e9, format_bytes(4.0 * kDecodeFloats),
      profile.cache_bytes > 0 ? format_bytes(profile.cache_bytes) : "unknown: taken as no limit",
      profile.pack_s_per_element * 1e9, profile.index_decode_s_per_element * 1e9,
      profile.merge_s_per_element * 1e9, profile.low_rank_s_per_element * 1e9,
      profile.low_rank_s_per_element_rank * 1e9);
  for (const std::string& codec : value_encoding_names()) {
    fmt::print("  codec {:<12} {:.3f} ns to encode a value, {:.3f} ns to decode one\n", codec,
               profile.encode_cost(codec) * 1e9, profile.decode_cost(codec) * 1e9);
  }
  for (const std::string& scheme : schemes) {
    fmt::print("  select {:<11} {:.3f} ns\n", scheme,
               profile.select_s_per_element.at(scheme) * 1e9);
  }
}

void run_calibrate(const CalibrateOptions& o) {
  const CalibrateInputs in = check_calibrate_options(o);
  run_world(world_options(o.world), [&](Communicator& comm) {
    if (comm.size() < 2 && !o.host_only) {
      throw InvalidArgument(
          "calibrating the network needs at least 2 ranks (--workers, or mpirun -np N); "
          "--host-only measures the host costs alone");
    }
    Calibration c;
    comm.barrier();
    take_host_costs(comm, measure_host(o, in.d, in.schemes), in.schemes, c.profile);
    if (!o.host_only) fit_network(comm, o, in.sizes, c);
    if (comm.rank() != 0) return;

    const Machine machine = describe_machine();
    c.profile.name =
        o.name.empty() ? fmt::format("{} backend, {} ranks", comm.backend(), comm.size()) : o.name;
    c.profile.source = fmt::format(
        "sparsecomm calibrate on {} ({} cores), {} backend, {} ranks, d = {}, c = {}, {}{}{}",
        machine.cpu, machine.cores, comm.backend(), comm.size(), in.d, o.density, machine.date,
        o.host_only ? "; host costs only" : "",
        c.beta_is_upper_bound ? "; beta is an upper bound (the all-reduce time did not grow)" : "");
    warn_about_fit(comm, c);
    if (!o.out.empty()) perf::save_profile(c.profile, o.out);
    if (o.format == "json") {
      nlohmann::json j = perf::to_json(c.profile);
      for (const SizeRow& row : c.rows) {
        j["rounds"].push_back(
            {{"bytes", row.bytes}, {"measured_s", row.measured_s}, {"fitted_s", row.fitted_s}});
      }
      std::cout << j.dump(2) << "\n";
      return;
    }
    fmt::print("calibration: {}\n", c.profile.source);
    if (!c.rows.empty()) print_network(comm, o, c);
    print_host_costs(c.profile, in.schemes);
    if (!o.out.empty()) fmt::print("\nwrote {}\n", o.out);
  });
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto options = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "Measure the performance model's constants here (alpha, beta, per-element host costs) "
      "and write them as a JSON cost profile for `sparsecomm plan --profile`");
  add_world_flags(*cmd, options->world);
  cmd->add_option("-o,--out", options->out, "write the profile (JSON) here");
  cmd->add_option("--name", options->name, "the profile's name (default: backend and ranks)");
  cmd->add_option("-d,--numel", options->numel, "elements of the host measurements")
      ->capture_default_str();
  cmd->add_option("-c,--density", options->density, "density of the selection measurements")
      ->capture_default_str();
  cmd->add_option("--schemes", options->schemes, "schemes whose selection cost is measured")
      ->capture_default_str();
  cmd->add_option("--sizes", options->sizes, "all-reduce buffer sizes (beta: the two largest)")
      ->capture_default_str();
  cmd->add_option("--iters", options->iters, "timed iterations per message size and host cost")
      ->capture_default_str();
  cmd->add_option("--steps", options->steps, "sparsification steps per scheme (2 warm up)")
      ->capture_default_str();
  cmd->add_flag("--host-only", options->host_only, "skip the network; host costs only");
  cmd->add_option("--format", options->format, "table | json")->capture_default_str();
  cmd->callback([options] { run_calibrate(*options); });
}

}  // namespace sparsecomm::cli
