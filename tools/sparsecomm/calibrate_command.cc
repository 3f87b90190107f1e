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
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cli_util.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/codec.h"
#include "sparsecomm/comm/backend.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/optim/sgd.h"
#include "sparsecomm/perf/collective_cost.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/report/statistics.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sync/sparsify_exchange_step.h"
#include "sparsecomm/traces/gradient_stream.h"

namespace sparsecomm::cli {
namespace {

struct CalibrateOptions {
  std::string backend = "auto";
  int workers = 2;
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

// One round of the model: every rank sends `out` to rank r+1 while
// receiving `in` from r-1 (full duplex, every link busy).
void ring_round(Communicator& comm, std::span<const std::byte> out, std::span<std::byte> in) {
  constexpr int kTag = 7001;
  const int n = comm.size(), r = comm.rank();
  Request recv = comm.irecv(in, (r + n - 1) % n, kTag);
  Request send = comm.isend(out, (r + 1) % n, kTag);
  recv.wait();
  send.wait();
}

// `rounds` ring rounds of `bytes` back to back after a barrier: the slowest
// rank's time per round, median over iterations. A collective's rounds
// follow one another like this, so a chain gives the per-round latency the
// model charges. One round alone (rounds = 1) also pays every rank's wake-up
// from the barrier, which where ranks share cores costs more than a round
// (docs/benchmarks.md, "Alpha from a chain of rounds").
double ring_round_seconds(Communicator& comm, std::size_t bytes, int rounds, int iters) {
  std::vector<std::byte> out(bytes, std::byte{1}), in(bytes);
  std::vector<double> mine;
  for (int it = 0; it <= iters; ++it) {  // iteration 0 warms up
    comm.barrier();
    Stopwatch clock;
    for (int round = 0; round < rounds; ++round) ring_round(comm, out, in);
    if (it > 0) mine.push_back(clock.seconds() / rounds);
  }
  return median_of_rank_max(comm, mine);
}

// The chain that measures alpha: about as many rounds as a sparse step's
// collectives take on a few hosts.
constexpr int kAlphaChainRounds = 16;

// What this host's NICs have sent, and which host this is. Hosts are told
// apart by their interfaces' names and hardware addresses, not by hostname:
// the emulated cluster's namespaces share one.
struct NicReading {
  std::uint64_t host = 0;
  double tx_bytes = 0.0;
  bool readable = false;
};

NicReading read_nic() {
  namespace fs = std::filesystem;
  NicReading reading;
  std::string identity;
  std::error_code error;
  for (const fs::directory_entry& device : fs::directory_iterator("/sys/class/net", error)) {
    const std::string name = device.path().filename().string();
    if (name == "lo") continue;
    std::ifstream tx(device.path() / "statistics" / "tx_bytes");
    std::ifstream address(device.path() / "address");
    double bytes = 0.0;
    std::string mac;
    if (!(tx >> bytes) || !(address >> mac)) continue;
    reading.tx_bytes += bytes;
    reading.readable = true;
    identity += name + "=" + mac + ";";
  }
  reading.host = std::hash<std::string>{}(identity);
  return reading;
}

// The wire bytes per rank while `body` runs on every rank: what all hosts'
// NICs sent, over the ranks (ranks sharing a host share its counter).
// nullopt when a rank cannot read its NIC counters.
std::optional<double> wire_bytes_per_rank(Communicator& comm, const std::function<void()>& body) {
  comm.barrier();
  const NicReading before = read_nic();
  body();
  comm.barrier();
  const NicReading after = read_nic();
  const std::vector<NicReading> all =
      allgather_value(comm, NicReading{.host = after.host,
                                       .tx_bytes = after.tx_bytes - before.tx_bytes,
                                       .readable = before.readable && after.readable});
  std::map<std::uint64_t, double> by_host;
  for (const NicReading& rank : all) {
    if (!rank.readable) return std::nullopt;
    by_host[rank.host] = rank.tx_bytes;
  }
  double total = 0.0;
  for (const auto& [host, bytes] : by_host) total += bytes;
  return total / comm.size();
}

// Framing on the wire, from the NIC counters: bytes per short message
// beyond its payload, from 8-byte ring rounds (a run of `kRounds` against
// one of a fifth as many, so that the barriers around them cancel), and
// per payload byte, from ring all-reduces of `bulk_bytes` (the median of
// three). The model charges a message the larger of the two
// (perf/collective_cost.cc), so the bulk figure keeps its messages' own. nullopt when a rank cannot
// read its NIC counters.
struct WireFraming {
  double per_message = 0.0;
  double per_byte = 0.0;
};

std::optional<WireFraming> measure_wire_framing(Communicator& comm, std::size_t bulk_bytes) {
  constexpr int kRounds = 250;
  const int n = comm.size();
  std::array<std::byte, 8> out{}, in{};
  auto rounds = [&](int count) {
    return [&, count] {
      for (int round = 0; round < count; ++round) ring_round(comm, out, in);
    };
  };
  const std::optional<double> few = wire_bytes_per_rank(comm, rounds(kRounds / 5));
  const std::optional<double> many = wire_bytes_per_rank(comm, rounds(kRounds));
  if (!few || !many) return std::nullopt;
  WireFraming framing;
  framing.per_message =
      std::max(0.0, (*many - *few) / (kRounds - kRounds / 5) - static_cast<double>(out.size()));
  // The bulk overhead is mostly headers and acknowledgements, and how many
  // acknowledgements TCP sends depends on timing (delayed or immediate):
  // one all-reduce on a busy host can count 8% where the next counts 5%.
  // The median of three all-reduces keeps one such outlier out.
  constexpr int kBulkRepeats = 3;
  std::vector<float> data(bulk_bytes / sizeof(float), 1.0f);
  const AllreduceOptions ring;
  const double payload = 2.0 * (n - 1) * static_cast<double>(bulk_bytes) / n;
  std::vector<double> per_byte;
  for (int repeat = 0; repeat < kBulkRepeats; ++repeat) {
    const std::optional<double> bulk =
        wire_bytes_per_rank(comm, [&] { allreduce(comm, std::span<float>(data), ring); });
    if (!bulk) return std::nullopt;
    per_byte.push_back(std::max(0.0, (*bulk - payload) / payload));
  }
  std::ranges::nth_element(per_byte, per_byte.begin() + kBulkRepeats / 2);
  framing.per_byte = per_byte[kBulkRepeats / 2];
  return framing;
}

// Our ring all-reduce of `bytes` of floats (the collective the dense and
// union methods run, with its 1 MiB segments): slowest rank, median.
double ring_allreduce_seconds(Communicator& comm, std::size_t bytes, int iters) {
  std::vector<float> data(bytes / sizeof(float), 1.0f);
  std::vector<double> mine;
  for (int it = 0; it <= iters; ++it) {
    comm.barrier();
    Stopwatch clock;
    allreduce(comm, std::span<float>(data), AllreduceOptions{});
    if (it > 0) mine.push_back(clock.seconds());
  }
  return median_of_rank_max(comm, mine);
}

// Keeps the timed additions from being optimized away.
volatile float sink_ = 0.0f;

// Host costs per element on this rank, each measured while every rank
// measures the same (so ranks sharing a machine share it as in training).
struct HostCosts {
  double gamma = 0.0, accumulate = 0.0, update = 0.0;
  double fill = 0.0, scatter = 0.0;  // decoding into a gradient beyond the cache
  double pack = 0.0;                 // taking selected values out of it
  double index_decode = 0.0;         // one varint index
  double merge = 0.0;                // one entry through one level of a pairwise merge
  std::vector<double> select;        // per scheme, in the order asked
};

// The decoding measurement's gradient: 128 MiB, beyond the last-level
// cache of the machines at hand (a model's gradient of that size misses on
// every scattered entry).
constexpr std::size_t kDecodeFloats = std::size_t{32} << 20;

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
  });
  costs.accumulate = report::median(accumulate);
  return costs;
}

void run_calibrate(const CalibrateOptions& o) {
  check_iterations(o.iters, 0);
  check_format(o.format);
  if (o.steps < 3) throw InvalidArgument(fmt::format("--steps must be >= 3, got {}", o.steps));
  if (!(o.density > 0 && o.density <= 1)) {
    throw InvalidArgument(fmt::format("--density must be in (0, 1], got {}", o.density));
  }
  const std::size_t d = parse_bytes(o.numel, "--numel");
  if (d < 1000) throw InvalidArgument(fmt::format("--numel must be >= 1000, got {}", d));
  const std::vector<std::string> schemes = split_list(o.schemes, "--schemes");
  std::vector<std::size_t> sizes;
  for (const std::string& s : split_list(o.sizes, "--sizes"))
    sizes.push_back(parse_bytes(s, "--sizes"));
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()),
              sizes.end());  // the slope needs distinct sizes
  if (!o.host_only && sizes.size() < 2) {
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

  WorldOptions world;
  world.backend = parse_backend(o.backend);
  world.ranks = resolve_backend(world.backend) == BackendKind::kMpi ? 0 : o.workers;
  run_world(world, [&](Communicator& comm) {
    if (comm.size() < 2 && !o.host_only) {
      throw InvalidArgument(
          "calibrating the network needs at least 2 ranks (--workers, or mpirun -np N); "
          "--host-only measures the host costs alone");
    }
    std::vector<SizeRow> rows;
    perf::CostProfile profile;
    bool beta_is_upper_bound = false;
    double lone_round_s = 0.0;  // one 8-byte round alone, for the log
    std::optional<WireFraming> framing;
    comm.barrier();
    const HostCosts mine = measure_host(o, d, schemes);
    // The slowest rank of each cost: a step waits for it.
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
    // Unknown: 0, which the model reads as "the gradient fits".
    profile.cache_bytes = static_cast<double>(last_level_cache_bytes().value_or(0));
    double select_default = 0.0;
    for (std::size_t i = 0; i < schemes.size(); ++i) {
      profile.select_s_per_element[schemes[i]] = slowest(mine.select[i]);
      select_default = std::max(select_default, profile.select_s_per_element[schemes[i]]);
    }
    profile.select_s_per_element["default"] = select_default;
    if (!o.host_only) {
      // alpha: a ring round of 8 bytes within a chain of rounds. beta: the
      // slope of our ring all-reduce between the two largest buffers, less
      // its reduction: t(N) = 2(n-1) alpha + N (2(n-1)/n beta + (n-1)/n gamma/4).
      profile.alpha_s = ring_round_seconds(comm, 8, kAlphaChainRounds, o.iters);
      lone_round_s = ring_round_seconds(comm, 8, 1, o.iters);
      for (const std::size_t bytes : sizes) {
        rows.push_back(
            {.bytes = bytes, .measured_s = ring_allreduce_seconds(comm, bytes, o.iters)});
      }
      const double n = comm.size();
      const SizeRow& big = rows.back();
      const SizeRow& before = rows[rows.size() - 2];
      const double slope =
          (big.measured_s - before.measured_s) / static_cast<double>(big.bytes - before.bytes);
      const double bytes_per_buffer_byte = 2 * (n - 1) / n;  // each rank sends and receives
      profile.beta_s_per_byte =
          (slope - (n - 1) / n * profile.gamma_s_per_element / 4) / bytes_per_buffer_byte;
      if (!(profile.beta_s_per_byte > 0)) {
        // The times did not grow with the buffer: noise exceeds the transfer.
        // Charge the largest buffer's whole time to bandwidth, an upper bound.
        beta_is_upper_bound = true;
        profile.beta_s_per_byte =
            big.measured_s / (static_cast<double>(big.bytes) * bytes_per_buffer_byte);
      }
      for (SizeRow& row : rows) {
        row.fitted_s =
            perf::ring_allreduce(profile, comm.size(), static_cast<double>(row.bytes)).seconds;
      }
      // Threads share memory: no NIC carries their messages.
      if (comm.backend() != "thread") {
        framing = measure_wire_framing(comm, sizes.back());
        if (framing) {
          profile.wire_bytes_per_message = framing->per_message;
          profile.wire_overhead_per_byte = framing->per_byte;
        }
      }
    }
    if (comm.rank() != 0) return;

    const Machine machine = describe_machine();
    profile.name =
        o.name.empty() ? fmt::format("{} backend, {} ranks", comm.backend(), comm.size()) : o.name;
    profile.source = fmt::format(
        "sparsecomm calibrate on {} ({} cores), {} backend, {} ranks, d = {}, c = {}, {}{}{}",
        machine.cpu, machine.cores, comm.backend(), comm.size(), d, o.density, machine.date,
        o.host_only ? "; host costs only" : "",
        beta_is_upper_bound ? "; beta is an upper bound (the all-reduce time did not grow)" : "");
    if (beta_is_upper_bound) {
      spdlog::warn(
          "calibrate: the all-reduce took no longer on {} than on {}, so noise hides the "
          "transfer time; beta is bounded from above by the largest buffer's time alone. "
          "Measure larger buffers (--sizes) or more iterations (--iters) for a slope.",
          format_bytes(double(rows.back().bytes)),
          format_bytes(double(rows[rows.size() - 2].bytes)));
    }
    if (const SizeRow* row = off_the_line(rows)) {
      spdlog::warn(
          "calibrate: the all-reduce of {} took {:.1f} ms where the fitted alpha and beta give "
          "{:.1f} ms: the rate depends on the message size, and predictions for other sizes "
          "will be off.{}",
          format_bytes(double(row->bytes)), row->measured_s * 1e3, row->fitted_s * 1e3,
          comm.size() == 2 && comm.backend() == "mpi"
              ? " Between two hosts over OpenMPI's TCP transport the usual cause is the "
                "rendezvous reply of each 1 MiB segment queueing behind the bulk data flowing "
                "the other way on the same connection: run with --mca btl_tcp_eager_limit "
                "2097152 --mca btl_tcp_max_send_size 2097152 (docs/benchmarks.md, \"Two "
                "hosts\")."
              : "");
    }
    if (!o.out.empty()) perf::save_profile(profile, o.out);
    if (o.format == "json") {
      nlohmann::json j = perf::to_json(profile);
      for (const SizeRow& row : rows) {
        j["rounds"].push_back(
            {{"bytes", row.bytes}, {"measured_s", row.measured_s}, {"fitted_s", row.fitted_s}});
      }
      std::cout << j.dump(2) << "\n";
      return;
    }
    fmt::print("calibration: {}\n", profile.source);
    if (!rows.empty()) {
      fmt::print(
          "\nour ring all-reduce (1 MiB segments), slowest rank, median of {}, against the "
          "model with the fitted profile:\n{:>12} {:>12} {:>12} {:>8}\n",
          o.iters, "buffer", "measured us", "model us", "error");
      for (const SizeRow& row : rows) {
        fmt::print("{:>12} {:>12.1f} {:>12.1f} {:>7.1f}%\n", format_bytes(double(row.bytes)),
                   row.measured_s * 1e6, row.fitted_s * 1e6,
                   100.0 * (row.fitted_s / row.measured_s - 1.0));
      }
      fmt::print(
          "alpha {:.2f} us (a ring round of 8 bytes in a chain of {}; one round alone after a "
          "barrier: {:.2f} us), beta {}{:.4g} ns/byte ({:.3g} Gbit/s per direction; {})\n",
          profile.alpha_s * 1e6, kAlphaChainRounds, lone_round_s * 1e6,
          beta_is_upper_bound ? "<= " : "", profile.beta_s_per_byte * 1e9,
          8.0 / profile.beta_s_per_byte / 1e9,
          beta_is_upper_bound ? "the largest buffer's time, all of it charged to bandwidth"
                              : "the all-reduce's slope between the two largest buffers");
      if (framing) {
        fmt::print(
            "wire framing (NIC counters): {:.0f} bytes per message, {:.2f}% of the payload of "
            "a {} all-reduce\n",
            profile.wire_bytes_per_message, 100.0 * profile.wire_overhead_per_byte,
            format_bytes(double(rows.back().bytes)));
      } else {
        fmt::print("wire framing: not measured ({}); wire bytes will count the payload alone\n",
                   comm.backend() == "thread" ? "threads send no bytes on a NIC"
                                              : "a rank could not read /sys/class/net");
      }
    }
    fmt::print(
        "\nhost, per element (slowest rank; all ranks measuring at once):\n"
        "  gamma (add)        {:.3f} ns\n  accumulate (g+e)   {:.3f} ns\n"
        "  update (SGD)       {:.3f} ns\n"
        "  zero (decoding)    {:.3f} ns\n"
        "  scatter (decoding) {:.3f} ns per entry into {} (last-level cache {})\n"
        "  pack (sending)     {:.3f} ns per value taken out of it\n"
        "  index decode       {:.3f} ns per varint index\n"
        "  merge              {:.3f} ns per entry per level of a union of runs\n",
        profile.gamma_s_per_element * 1e9, profile.accumulate_s_per_element * 1e9,
        profile.update_s_per_element * 1e9, profile.fill_s_per_element * 1e9,
        profile.scatter_s_per_element * 1e9, format_bytes(4.0 * kDecodeFloats),
        profile.cache_bytes > 0 ? format_bytes(profile.cache_bytes) : "unknown: taken as no limit",
        profile.pack_s_per_element * 1e9, profile.index_decode_s_per_element * 1e9,
        profile.merge_s_per_element * 1e9);
    for (const std::string& scheme : schemes) {
      fmt::print("  select {:<11} {:.3f} ns\n", scheme, profile.select_s_per_element[scheme] * 1e9);
    }
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
  cmd->add_option("--backend", options->backend, "auto | thread | mpi (auto: mpi under mpirun)")
      ->capture_default_str();
  cmd->add_option("-n,--workers", options->workers, "ranks for the thread backend")
      ->capture_default_str();
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
