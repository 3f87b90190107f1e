// The report of `sparsecomm bench sparsifiers` (bench_sparsifiers_report.h).

#include "bench_sparsifiers_report.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli_util.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/report/statistics.h"
#include "sparsecomm/sync/load_balance.h"

namespace sparsecomm::cli {

SchemeRow summarize(const SchemeRun& run, const Baselines& baselines,
                    const SparsifierBenchOptions& options) {
  const auto n = static_cast<std::size_t>(run.workers);
  SchemeRow row;
  row.scheme = run.scheme;
  row.exchange = run.exchange;
  row.skipped = run.skipped;
  if (!row.skipped.empty()) return row;
  std::vector<double> slowest, ratio, error, imbalance, floors, floor_ratios, fractions;
  double bytes = 0.0, selected = 0.0, raw = 0.0, encoded = 0.0, union_sum = 0.0, rounds = 0.0,
         rescans = 0.0;
  std::size_t steady = 0;
  for (std::size_t t = 0; t < static_cast<std::size_t>(run.steps); ++t) {
    if (timed_step(options, static_cast<std::int64_t>(t))) {
      double slow = 0.0;
      std::size_t with_floor = 0;
      for (std::size_t r = 0; r < n; ++r) {
        const std::size_t slot = t * n + r;
        slow = std::max(slow, run.select_ms[slot]);
        if (run.elements[slot] == 0) continue;  // no floor on this rank
        ++with_floor;
        // Footnote classes: a rank reading part of the vector (partition
        // schemes), or only one rank per step with a floor (CLT-k's leader).
        if (run.elements[slot] != run.numel) row.partitioned = true;
        floors.push_back(run.floor_ms[slot]);
        floor_ratios.push_back(run.select_ms[slot] / run.floor_ms[slot]);
        fractions.push_back(static_cast<double>(run.elements[slot]) /
                            static_cast<double>(run.numel));
      }
      if (n > 1 && with_floor == 1 && !row.partitioned) row.leader_only = true;
      slowest.push_back(slow);
    }
    if (t < static_cast<std::size_t>(options.warmup_steps)) continue;  // steady state only
    ++steady;
    const StepMetrics& m = run.metrics[t * n];  // K/k and imbalance are the same on every rank
    ratio.push_back(m.density_ratio);
    error.push_back(std::abs(m.density_ratio - 1.0));
    imbalance.push_back(m.imbalance);
    union_sum += static_cast<double>(m.union_size);
    rounds += m.selection_collectives;
    rescans += m.candidate_passes > 1 ? 1.0 : 0.0;
    for (std::size_t r = 0; r < n; ++r) {
      const StepMetrics& mr = run.metrics[t * n + r];
      bytes += static_cast<double>(mr.bytes_sent);
      selected += static_cast<double>(mr.selected);
      raw += static_cast<double>(mr.index_bytes_raw);
      encoded += static_cast<double>(mr.index_bytes_encoded);
    }
  }
  row.select_ms = report::median(slowest);
  if (!floors.empty()) {
    row.floor_ms = report::median(floors);
    row.floor_ratio = report::median(floor_ratios);
    row.read_fraction = report::median(fractions);
  }
  row.nth_element_speedup = baselines.nth_element_ms / row.select_ms;
  if (baselines.torch_topk_ms) row.torch_topk_speedup = *baselines.torch_topk_ms / row.select_ms;
  row.density_ratio_mean = report::mean(ratio);
  row.density_error_p95 = report::percentile(error, 95);
  row.imbalance_mean = report::mean(imbalance);
  row.imbalance_floor = imbalance_floor(
      run.workers, std::llround(union_sum / static_cast<double>(std::max<std::size_t>(steady, 1))));
  row.rounds_mean = rounds / static_cast<double>(std::max<std::size_t>(steady, 1));
  row.rescans = rescans / static_cast<double>(std::max<std::size_t>(steady, 1));
  row.bytes_per_rank = bytes / static_cast<double>(n * steady);
  row.selected_mean = selected / static_cast<double>(n * steady);
  if (raw > 0.0) row.index_bytes_saved = 1.0 - encoded / raw;
  return row;
}

// One object per scheme, keys in a fixed order.
nlohmann::ordered_json to_json(const SchemeRow& row, const SparsifierBenchOptions& options) {
  const auto optional = [](const std::optional<double>& v) {
    return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  nlohmann::ordered_json j;
  j["scheme"] = row.scheme;

  j["numel"] = options.numel;
  j["density"] = options.density;
  j["workers"] = options.workers;
  j["steps"] = options.steps;
  j["select_ms"] = row.select_ms;
  j["floor_ms"] = optional(row.floor_ms);
  j["floor_ratio"] = optional(row.floor_ratio);
  j["nth_element_speedup"] = row.nth_element_speedup;
  j["torch_topk_speedup"] = optional(row.torch_topk_speedup);
  j["density_ratio_mean"] = row.density_ratio_mean;
  j["density_error_p95"] = row.density_error_p95;
  j["imbalance_mean"] = row.imbalance_mean;
  j["imbalance_floor"] = row.imbalance_floor;
  j["read_share"] = row.read_fraction ? nlohmann::ordered_json(*row.read_fraction * options.workers)
                                      : nlohmann::ordered_json(nullptr);
  j["selection_collectives_mean"] = row.rounds_mean;
  j["rescan_share"] = row.rescans;
  j["bytes_per_rank"] = row.bytes_per_rank;
  j["selected_mean"] = row.selected_mean;
  j["index_bytes_saved"] = optional(row.index_bytes_saved);
  j["source"] = options.source;
  if (!row.skipped.empty()) {  // not measured: every measurement is null
    nlohmann::ordered_json skipped;
    for (auto it = j.begin(); it != j.end(); ++it) {
      skipped[it.key()] = it.value().is_number() && it.key() != "numel" && it.key() != "density" &&
                                  it.key() != "workers" && it.key() != "steps"
                              ? nlohmann::ordered_json(nullptr)
                              : it.value();
    }
    skipped["skipped"] = row.skipped;
    return skipped;
  }
  return j;
}

void print_table(const std::vector<SchemeRow>& rows, const Baselines& b, const Machine& machine,
                 const SparsifierBenchOptions& options) {
  const std::size_t k = target_count(options.density, options.numel);
  fmt::print(
      "sparsifier selection: d = {}, c = {} (k = {}), {} rank{} simulated in one process, "
      "{} steps ({} warm-up), seed {}\n",
      options.numel, options.density, k, options.workers, options.workers == 1 ? "" : "s",
      options.steps, options.warmup_steps, options.seed);
  fmt::print("source: {}\n", options.source);
  fmt::print("machine: {}, {} cores, {:.1f} GiB memory, load average {} at start; {}\n",
             machine.cpu, machine.cores, machine.memory_gib, machine.load, machine.date);
  fmt::print(
      "read bandwidth {:.1f} GB/s (1 thread, read pass over d floats: {:.2f} ms); "
      "std::nth_element {:.1f} ms; torch::topk {} (1 thread)\n",
      b.bandwidth_gbps, b.floor_ms, b.nth_element_ms,
      b.torch_topk_ms ? fmt::format("{:.1f} ms", *b.torch_topk_ms) : std::string("skipped"));
  const auto optional = [](const std::optional<double>& v, std::string_view suffix, int digits) {
    return v ? fmt::format("{:.{}f}{}", *v, digits, suffix) : std::string("-");
  };
  fmt::print(
      "{:<16} {:<16} {:>9} {:>9} {:>7} {:>6} {:>6} {:>8} {:>8} {:>8} {:>9} {:>7} {:>6} {:>6} "
      "{:>11} {:>9}\n",
      "scheme", "exchange", "select ms", "floor ms", "x floor", "read/d", "x d/n", "vs nth",
      "vs torch", "K/k mean", "|K/k-1|95", "imbal", "floor", "rounds", "bytes/rank", "idx saved");
  for (const SchemeRow& row : rows) {
    if (!row.skipped.empty()) {
      fmt::print("{:<16} {:<16} not measured: {}\n", row.scheme, row.exchange, row.skipped);
      continue;
    }
    fmt::print(
        "{:<16} {:<16} {:>9.3f} {:>9} {:>7} {:>6} {:>6} {:>7.1f}x {:>8} {:>8.3f} {:>9.3f} "
        "{:>7.3f} {:>6.3f} {:>6.2f} {:>11} {:>9}\n",
        row.scheme, row.exchange, row.select_ms, optional(row.floor_ms, "", 3),
        optional(row.floor_ratio, "", 2), optional(row.read_fraction, "", 3),
        row.read_fraction ? fmt::format("{:.2f}", *row.read_fraction * options.workers)
                          : std::string("-"),
        row.nth_element_speedup, optional(row.torch_topk_speedup, "x", 1), row.density_ratio_mean,
        row.density_error_p95, row.imbalance_mean, row.imbalance_floor, row.rounds_mean,
        format_bytes(row.bytes_per_rank),
        row.index_bytes_saved ? fmt::format("{:.1f}%", 100.0 * *row.index_bytes_saved)
                              : std::string("-"));
  }
  std::vector<std::string> timed;
  for (std::int64_t t = 0; t < options.steps; ++t) {
    if (timed_step(options, t)) timed.push_back(fmt::format("{}", t));
  }
  fmt::print(
      "select ms: each rank's select() re-run alone from its saved state (fastest of {} runs; "
      "what it receives from other ranks is replayed), caches evicted first; the slowest rank "
      "per step, median over the timed steps {} (every {}{} step from {}; every step runs, is "
      "verified and counted).\n",
      options.reps, fmt::join(timed, ", "), options.time_every,
      options.time_every == 1   ? "st"
      : options.time_every == 2 ? "nd"
      : options.time_every == 3 ? "rd"
                                : "th",
      first_timed_step(options));
  std::string partitioned, leader, unbounded;
  for (const SchemeRow& row : rows) {
    if (!row.skipped.empty()) continue;
    std::string* list = !row.floor_ms     ? &unbounded
                        : row.leader_only ? &leader
                        : row.partitioned ? &partitioned
                                          : nullptr;  // the whole vector
    if (list != nullptr) *list += fmt::format("{}{}", list->empty() ? "" : ", ", row.scheme);
  }
  std::string floor_note =
      "floor ms: a read pass over exactly the elements that rank's select() read, timed in the "
      "same turn on the same vector (caches evicted first), median over (rank, timed step); "
      "x floor: median over (rank, timed step) of that rank's select ms / its own floor; "
      "read/d: median elements read per (rank, step) / d; x d/n: the same in units of d/n "
      "(read_share in the JSON). Whole vector: the other schemes";
  if (!partitioned.empty()) {
    floor_note += fmt::format(
        "; {}: the rank's own partition (ExDyna: its block-cyclic blocks) or DEFT "
        "bin's pieces (+ the whole vector on the leader)",
        partitioned);
  }
  if (!leader.empty())
    floor_note += fmt::format("; {}: the leader only (the others gather k values)", leader);
  if (!unbounded.empty()) floor_note += fmt::format("; {}: none, k scattered values", unbounded);
  fmt::print("{}.\n", floor_note);
  fmt::print(
      "K/k, |K/k-1|95, imbal, floor, rounds, bytes/rank, idx saved: steady state, steps {}..{} "
      "(the first {} are warm-up). floor: the imbalance of the mean K elements dropped on the "
      "ranks uniformly at random (simulated), which no balancer beats. rounds: select()'s own "
      "collectives per step (the partition schemes' histogram rounds). vs nth / vs torch: baseline "
      "time / select ms, for the same k on |a| of rank "
      "0's first gradient. bytes/rank: sent per rank per step. idx saved: 1 - encoded / raw "
      "index bytes.\n",
      options.warmup_steps, options.steps - 1, options.warmup_steps);
}

}  // namespace sparsecomm::cli
