// `sparsecomm bench sparsifiers` (see bench_sparsifiers.h): its options,
// their checks, and the run: every scheme through the probes
// (bench_sparsifiers_probe.h), then the report (bench_sparsifiers_report.h).
//
// How it measures (docs/benchmarks/methodology.md, "How we measure"):
//  - The gradients come from a sparsecomm::GradientStream: by default the
//    project's synthetic stream (make_synthetic_stream: skewed, heavy-tailed,
//    its scale falling --drift x over the run), or a recorded trace (--trace
//    DIR, open_trace: its numel, world, steps and layers). The synthetic
//    values are O(1), with no physical scale: schemes with absolute
//    thresholds (the reference hard threshold 1/(2 sqrt(k)), ...) select what
//    they select on it, reported as measured (pass --opt to change them).
//  - The n ranks are threads of this process (run_thread_world). Each drives
//    its own SparsifyExchangeStep, built by make_scheme, over its own
//    gradients of the stream, so K/k, imbalance and bytes come from the
//    library's own synchronization step.
//  - Selection is timed apart from that concurrent step, each rank alone, one
//    after another: the sparsifier handed to SparsifyExchangeStep is a probe
//    wrapping the scheme's. Inside select() the probe saves the scheme's
//    state, runs the real selection (recording whatever the scheme
//    communicates while selecting), verifies it, and then, on a timed step,
//    the ranks take turns: rank 0 re-runs the selection on its accumulated
//    vector while every other rank waits in a barrier, then rank 1, and so
//    on. The re-run is a second instance of the scheme loaded with the saved
//    state and talking to a replay of the recorded communication
//    (comm/recording.h), so it makes exactly the same choice (checked) with
//    the machine to itself. What it receives (CLT-k's broadcast, the
//    partition schemes' counts) arrives at once from the recording, so the
//    time is the selection's own work, not waiting for other ranks.
//  - The floor of each (rank, timed step) is a read pass over exactly the
//    elements that rank's select() read (its partition for MiCRO/ExDyna,
//    its bin's pieces for DEFT; see "Which elements one rank's select()
//    reads" in bench_sparsifiers_probe.cc), timed in the same turn on the
//    same vector. Before the floor and before the selection a pass over an
//    eviction buffer (4x the LLC) empties the caches, so a partition smaller
//    than the LLC is read from memory by both.
//  - Steps: the first --warmup-steps (default 20%, at least 10 when
//    steps >= 50) are left out of K/k, imbalance and bytes, which describe
//    the steady state. Selection is timed on every --time-every-th step from
//    the end of the warm-up (never step 0, the schemes' set-up); every step
//    runs and is verified.
//  - select_ms: per timed step the slowest rank (the step waits for it; for
//    CLT-k that is the leader, the only rank that runs a top-k), then the
//    median over timed steps. floor_ratio: the median over (rank, timed
//    step) of that rank's select time / its own floor. Each figure for a
//    rank and step is the fastest of --reps runs (on this shared machine
//    noise only ever adds time); the floor likewise.
//  - Memory: per rank its gradient, the memory's buffer(s) and
//    SparsifyExchangeStep's output (d floats each), plus the synthetic
//    stream's d-float profile and the eviction buffer; the stream is
//    generated (or read) on the fly each step. 8 ranks x d = 25M: about
//    3.5 GB.
//  - Verified before anything is reported: every selection (indices strictly
//    ascending, inside [0, d), values equal to the accumulated vector), the
//    positions each rank transmitted (ascending, covering its selection), the
//    read model (every selected index inside the elements the floor reads),
//    and conservation on a sample of positions every step (the averaged
//    gradient equals the mean over ranks of what each rank's memory gave up).

#include "bench_sparsifiers.h"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_sparsifiers_options.h"
#include "bench_sparsifiers_probe.h"
#include "bench_sparsifiers_report.h"
#include "bench_util.h"
#include "cli_util.h"
#include "sparsecomm/comm/launcher.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/traces/gradient_stream.h"

namespace sparsecomm::cli {
// Named so that the tool's sources can compile as one unit (UNITY_BUILD).
namespace bench_sparsifiers_impl {
namespace {

SchemeOptions scheme_options(const SparsifierBenchOptions& options) {
  SchemeOptions result;
  for (const std::string& item : options.opts) {
    SchemeOptions one;
    one.set(item);
    for (const auto& [key, value] : one.values()) {
      if (key == "density") {
        throw InvalidArgument(fmt::format("--opt {}: set the density with --density", item));
      }
      if (key == "seed")
        throw InvalidArgument(fmt::format("--opt {}: set the seed with --seed", item));
      result.set(key, value);
    }
  }
  result.set("density", fmt::format("{}", options.density));
  result.set("seed", fmt::format("{}", options.seed));
  return result;
}

std::vector<std::string> resolve_schemes(const SparsifierBenchOptions& options) {
  std::vector<std::string> names;
  if (options.schemes.empty()) {
    for (const SchemeInfo& info : scheme_registry()) names.push_back(info.name);
    return names;
  }
  for (const std::string& name : split_list(options.schemes, "--schemes")) {
    if (find_scheme(name) == nullptr) {
      throw InvalidArgument(
          fmt::format("--schemes: unknown scheme '{}': valid are {}", name, scheme_names()));
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

// Checks the options against each other and the stream, and fills in what
// the stream supplies (a trace's numel, world and steps).
std::unique_ptr<GradientStream> open_stream(SparsifierBenchOptions& options) {
  std::unique_ptr<GradientStream> stream;
  if (!options.trace.empty()) {
    if (options.synthetic_given) {
      throw InvalidArgument(
          "--drift, --skew and --tail shape the synthetic stream; they do not apply to --trace");
    }
    stream = open_trace(options.trace);
    const std::size_t numel = stream->numel();
    const int world = stream->world();
    const std::int64_t steps = stream->steps();
    if (options.numel_given && options.numel != numel) {
      throw InvalidArgument(fmt::format(
          "--numel {} does not match the trace {}, which has numel {} (leave --numel out to take "
          "the trace's)",
          options.numel, options.trace, numel));
    }
    if (options.workers_given && options.workers != world) {
      throw InvalidArgument(fmt::format(
          "--workers {} does not match the trace {}, recorded on {} ranks: each simulated rank "
          "replays its own recorded gradients (leave --workers out to take the trace's)",
          options.workers, options.trace, world));
    }
    if (options.steps_given && options.steps > steps) {
      throw InvalidArgument(fmt::format("--steps {} exceeds the {} steps recorded in the trace {}",
                                        options.steps, steps, options.trace));
    }
    options.numel = numel;
    options.workers = world;
    if (!options.steps_given) {
      if (steps > std::numeric_limits<int>::max()) {
        throw InvalidArgument(
            fmt::format("the trace {} has {} steps: pass --steps", options.trace, steps));
      }
      options.steps = static_cast<int>(steps);
    }
  }
  if (options.numel < 1 || options.numel > std::numeric_limits<Index>::max()) {
    throw InvalidArgument(fmt::format("--numel must be in [1, {}], got {}",
                                      std::numeric_limits<Index>::max(), options.numel));
  }
  if (options.workers < 1)
    throw InvalidArgument(fmt::format("--workers must be >= 1, got {}", options.workers));
  if (options.steps < 1)
    throw InvalidArgument(fmt::format("--steps must be >= 1, got {}", options.steps));
  if (options.warmup_steps < 0) options.warmup_steps = default_warmup(options.steps);
  if (options.time_every < 1)
    throw InvalidArgument(fmt::format("--time-every must be >= 1, got {}", options.time_every));
  if (first_timed_step(options) >= options.steps) {
    throw InvalidArgument(fmt::format(
        "--steps {} leaves no step to time: timing starts after the {} warm-up step{} and never "
        "on step 0 (the schemes' set-up); raise --steps or lower --warmup-steps",
        options.steps, options.warmup_steps, options.warmup_steps == 1 ? "" : "s"));
  }
  if (!stream) {
    SyntheticStreamOptions synthetic;
    synthetic.numel = options.numel;
    synthetic.drift_factor = options.drift;
    synthetic.drift_steps = options.steps;  // the drift spans the run
    synthetic.skew = options.skew;
    synthetic.tail = options.tail;
    synthetic.seed = options.seed;
    stream = make_synthetic_stream(synthetic);  // validates drift, skew, tail
  }
  options.source = stream->describe();
  return stream;
}

void run(SparsifierBenchOptions options) {
  if (launched_by_mpirun()) {
    throw InvalidArgument(
        "bench sparsifiers simulates its --workers ranks as threads of one process, so that each "
        "rank's selection can be timed alone on the whole machine; run it without mpirun (under "
        "mpirun every process would repeat the whole simulation)");
  }
  check_format(options.format);
  if (!(options.density > 0.0 && options.density <= 1.0)) {
    throw InvalidArgument(fmt::format("--density must be in (0, 1], got {}", options.density));
  }
  if (options.reps < 1)
    throw InvalidArgument(fmt::format("--reps must be >= 1, got {}", options.reps));
  if (!(options.epoch >= 0.0))
    throw InvalidArgument(fmt::format("--epoch must be >= 0, got {}", options.epoch));
  if (options.warmup_steps < -1) {
    throw InvalidArgument(fmt::format("--warmup-steps must be >= 0, got {}", options.warmup_steps));
  }
  const std::unique_ptr<GradientStream> stream = open_stream(options);

  const std::vector<std::string> names = resolve_schemes(options);
  const SchemeOptions scheme_opts = scheme_options(options);
  for (const std::string& name : names) {  // options errors first
    make_scheme(name, scheme_opts);
  }

  // Per rank: its gradient, the memory's accumulated buffer (DGC: two) and
  // SparsifyExchangeStep's output; plus the baselines' and the synthetic
  // stream's own d-float buffers and the eviction buffer.
  const Machine machine = describe_machine();
  const std::size_t evict_floats = eviction_floats();
  const double needed_gib = (static_cast<double>(options.numel) * (4.0 * options.workers + 3.0) +
                             static_cast<double>(evict_floats)) *
                            sizeof(float) / (1024.0 * 1024.0 * 1024.0);
  if (machine.available_gib > 0.0 && needed_gib > 0.8 * machine.available_gib) {
    throw InvalidArgument(fmt::format(
        "{} ranks x d = {} need about {:.1f} GiB (4 buffers of d floats per rank) but only {:.1f} "
        "GiB are available: lower --workers or --numel",
        options.workers, options.numel, needed_gib, machine.available_gib));
  }

  // What is left once every rank's buffers exist: the exchange's budget.
  options.exchange_budget_gib =
      machine.available_gib > 0.0 ? 0.8 * machine.available_gib - needed_gib : 0.0;
  std::vector<float> evict(evict_floats, 1.0f);  // touched: real pages, not the zero page
  const Baselines baselines = measure_baselines(*stream, options);
  std::vector<SchemeRow> rows;
  for (const std::string& name : names) {
    rows.push_back(
        summarize(run_scheme(name, scheme_opts, *stream, evict, options), baselines, options));
  }

  if (options.format == "json") {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const SchemeRow& row : rows) out.push_back(to_json(row, options));
    std::cout << out.dump(2) << std::endl;
  } else {
    print_table(rows, baselines, machine, options);
  }
}

}  // namespace
}  // namespace bench_sparsifiers_impl

void add_bench_sparsifiers_command(CLI::App& bench) {
  using namespace bench_sparsifiers_impl;
  auto options = std::make_shared<SparsifierBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "sparsifiers",
      "Selection time vs the bandwidth floor, std::nth_element and torch::topk; density, "
      "imbalance and bytes per scheme, on the synthetic gradient stream or a recorded trace");
  CLI::Option* numel =
      cmd->add_option("--numel,-d", options->numel, "gradient length d (a trace: its own)")
          ->capture_default_str();
  cmd->add_option("--density,-c", options->density, "target density c in (0, 1]")
      ->capture_default_str();
  CLI::Option* workers =
      cmd->add_option("--workers,-n", options->workers,
                      "ranks, simulated as threads of one process (a trace: its world; if given "
                      "it must match)")
          ->capture_default_str();
  CLI::Option* steps =
      cmd->add_option("--steps", options->steps,
                      "steps of the gradient stream (a trace: all its steps unless given)")
          ->capture_default_str();
  cmd->add_option("--warmup-steps", options->warmup_steps,
                  "leading steps left out of the density, imbalance and bytes statistics and "
                  "of timing (default: 20% of the steps, at least 10 when steps >= 50)");
  cmd->add_option("--time-every", options->time_every,
                  "time the selection on every N-th step after the warm-up")
      ->capture_default_str();
  cmd->add_option("--reps", options->reps,
                  "timed runs of each rank's selection per timed step (the fastest counts), and "
                  "of each baseline (median)")
      ->capture_default_str();
  cmd->add_option("--schemes", options->schemes,
                  "comma-separated schemes (default: every registered one)");
  cmd->add_option("--opt", options->opts,
                  "key=value passed to every scheme (repeatable); density and seed have their "
                  "own flags");
  cmd->add_option("--trace", options->trace,
                  "replay a recorded gradient trace directory (meta.json + rank<r>.f32) instead "
                  "of the synthetic stream");
  cmd->add_option("--seed", options->seed, "seed of the synthetic stream and the schemes")
      ->capture_default_str();
  CLI::Option* drift =
      cmd->add_option("--drift", options->drift,
                      "synthetic stream: the overall scale falls this factor over the run")
          ->capture_default_str();
  CLI::Option* skew =
      cmd->add_option("--skew", options->skew, "synthetic stream: regional skew (0: none)")
          ->capture_default_str();
  CLI::Option* tail =
      cmd->add_option("--tail", options->tail, "synthetic stream: heavy-tail strength (0: normal)")
          ->capture_default_str();
  cmd->add_option("--epoch", options->epoch,
                  "fractional epoch passed to the schemes (DGC warm-up); the default is past any "
                  "warm-up")
      ->capture_default_str();
  cmd->add_option("--format", options->format, "table | json")->capture_default_str();
  cmd->add_flag("--no-torch", options->no_torch, "skip the torch::topk baseline");
  cmd->callback([options, numel, workers, steps, drift, skew, tail] {
    SparsifierBenchOptions resolved = *options;
    resolved.numel_given = numel->count() > 0;
    resolved.workers_given = workers->count() > 0;
    resolved.steps_given = steps->count() > 0;
    resolved.synthetic_given = drift->count() + skew->count() + tail->count() > 0;
    run(std::move(resolved));
  });
}

}  // namespace sparsecomm::cli
