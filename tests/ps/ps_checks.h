#pragma once
// What the parameter-server suites share (ps_test on the thread backend,
// ps_mpi_test under mpiexec): the workers' deterministic gradients, the
// initial parameters, one rank's part of a PS run, the serial reference of
// BSP with dense pushes, and the checks that no push was lost or applied
// twice. The checks return a description of every problem found ("" when
// there is none), so a suite can also show that they catch a tampered log.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/optim/optimizer.h"
#include "sparsecomm/optim/sgd.h"
#include "sparsecomm/ps/layout.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/ps/sync_model.h"

namespace sparsecomm::testing {

inline constexpr double kLr = 0.1;

// The deterministic local gradient of worker w at step t.
inline void gradient_of(int w, std::int64_t t, std::span<const float> params,
                        std::span<float> out) {
  const float a = 0.05f * static_cast<float>(w + 1);
  for (std::size_t i = 0; i < params.size(); ++i) {
    out[i] = a * params[i] +
             0.01f * std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(w) +
                              0.7f * static_cast<float>(t));
  }
}

inline std::vector<float> initial_params(std::size_t d) {
  std::vector<float> p(d);
  for (std::size_t i = 0; i < d; ++i) p[i] = std::cos(0.11f * static_cast<float>(i));
  return p;
}

// The parameters after `steps` steps of synchronous SGD on the mean of the
// workers' gradients: what BSP with dense pushes must compute.
inline std::vector<float> synchronous_steps(std::size_t d, int workers, int steps,
                                            const OptimizerOptions& options) {
  std::vector<float> params = initial_params(d);
  const std::unique_ptr<FlatOptimizer> optimizer = make_flat_optimizer(options);
  std::vector<float> sum(d);
  std::vector<float> g(d);
  for (int t = 0; t < steps; ++t) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int w = 0; w < workers; ++w) {
      gradient_of(w, t, params, g);
      for (std::size_t i = 0; i < d; ++i) sum[i] += g[i];
    }
    for (float& v : sum) v /= static_cast<float>(workers);
    optimizer->step(params, sum, kLr);
  }
  return params;
}
inline std::vector<float> synchronous_sgd(std::size_t d, int workers, int steps,
                                          const SgdOptions& options) {
  OptimizerOptions sgd;
  sgd.sgd = options;
  return synchronous_steps(d, workers, steps, sgd);
}

// Layers of a d = 2000 model for DEFT: two matrices (split into 3 pieces
// each on 3 workers) and two biases. The 1-element bias gets k_l = 1 = its
// size whenever budget is left, so it is a whole piece: a known range
// (index 1200) that every worker pushes with no index exchange.
inline std::vector<LayerSpan> deft_layers() {
  return {{"w1", 0, 1200}, {"b1", 1200, 1}, {"w2", 1201, 789}, {"b2", 1990, 10}};
}
inline constexpr std::size_t kDeftKnownIndex = 1200;

// What a PS run left: on the thread backend every slot (all ranks share
// one PsRun), under MPI only the slot of this rank's role.
struct PsRun {
  std::vector<ServerLog> servers;
  std::vector<WorkerLog> workers;
  std::vector<std::vector<float>> final_params;  // per worker, pulled after the last step
};

inline PsRun sized_run(int workers, int servers) {
  PsRun run;
  run.servers.resize(static_cast<std::size_t>(servers));
  run.workers.resize(static_cast<std::size_t>(workers));
  run.final_params.resize(static_cast<std::size_t>(workers));
  return run;
}

// Per worker w and step t: how long it "computes" (scripted delays).
using DelayScript = std::function<std::chrono::microseconds(int, std::int64_t)>;
// Called by worker w just before begin_step() of step t (test hooks).
using BeginHook = std::function<void(int, std::int64_t)>;
// Called by worker w right after push() of step t, with the gradient it
// pushed and the report (test hooks: residuals, conservation).
using PushHook = std::function<void(int, std::int64_t, const PsWorker&, std::span<const float>,
                                    const PushReport&)>;
// Worker w's local gradient at step t from the parameters it pulled.
using GradientFn = std::function<void(int, std::int64_t, std::span<const float>, std::span<float>)>;

struct PsHooks {
  BeginHook on_begin;   // none by default
  PushHook on_push;     // none by default
  GradientFn gradient;  // gradient_of by default
};

// The options of a run under sync `model` ("bsp", "ssp:1", ...) with pushes
// of `push` ("dense", or "topk" at density 1%).
inline PsOptions model_and_push(const char* model, const char* push) {
  PsOptions options;
  options.model = parse_sync_model(model);
  options.push = push;
  if (options.push == "topk") options.scheme_options.set("density=0.01");
  return options;
}

inline std::chrono::microseconds no_delay(int, std::int64_t) {
  return std::chrono::microseconds(0);
}

// One rank's part of a PS run of `steps` steps: a server serves its shard
// (log into run.servers[s]); a worker runs begin_step, pull, the scripted
// delay, the gradient (gradient_of unless hooks.gradient), push for each
// step, then pulls the final parameters
// and finishes (log into run.workers[w], parameters into
// run.final_params[w]). `run` must be sized (sized_run); each rank writes
// only its own slots.
inline void run_ps_rank(Communicator& comm, const ServerLayout& layout, const PsOptions& options,
                        int steps, const DelayScript& delay, PsRun& run,
                        const PsHooks& hooks = {}) {
  const std::size_t d = layout.numel();
  if (layout.is_server_rank(comm.rank())) {
    const int s = layout.server_index(comm.rank());
    const Range shard = layout.shard(s);
    const std::vector<float> init = initial_params(d);
    run.servers[static_cast<std::size_t>(s)] = run_server(
        comm, layout, options, std::span<const float>(init).subspan(shard.begin, shard.size()));
    return;
  }
  const int w = comm.rank();
  PsWorker worker(comm, layout, options);
  std::vector<float> params(d);
  std::vector<float> gradient(d);
  for (int t = 0; t < steps; ++t) {
    if (hooks.on_begin) hooks.on_begin(w, t);
    worker.begin_step();
    worker.pull(params);
    std::this_thread::sleep_for(delay(w, t));
    if (hooks.gradient) {
      hooks.gradient(w, t, params, gradient);
    } else {
      gradient_of(w, t, params, gradient);
    }
    const PushReport report = worker.push(gradient, kLr);
    if (hooks.on_push) hooks.on_push(w, t, worker, gradient, report);
  }
  worker.pull(params);
  worker.finish();
  run.workers[static_cast<std::size_t>(w)] = worker.log();
  run.final_params[static_cast<std::size_t>(w)] = params;
}

// The pushes to one server, as the workers sent them (summed over workers)
// or as the server applied them. Fixed size, so ranks can all-gather it.
struct PushTotals {
  std::int64_t pushes = 0;
  std::uint64_t values = 0;
  double value_sum = 0.0;
  std::uint64_t fingerprint = 0;  // wrapping sum of push fingerprints
};
static_assert(std::is_trivially_copyable_v<PushTotals> && sizeof(PushTotals) == 32);

inline PushTotals& operator+=(PushTotals& totals, const SentToServer& sent) {
  totals.pushes += sent.pushes;
  totals.values += sent.values;
  totals.value_sum += sent.value_sum;
  totals.fingerprint += sent.fingerprint;
  return totals;
}

inline PushTotals& operator+=(PushTotals& totals, const PushTotals& more) {
  totals.pushes += more.pushes;
  totals.values += more.values;
  totals.value_sum += more.value_sum;
  totals.fingerprint += more.fingerprint;
  return totals;
}

inline PushTotals applied_totals(const ServerLog& log) {
  return {log.pushes, log.values, log.value_sum, log.fingerprint};
}

// Every push to server s arrived exactly once with its content: the
// workers' and the server's counts, values and fingerprints agree, and there
// were workers * steps pushes. "" when they do; else what differs.
inline std::string push_totals_problems(int server, const PushTotals& sent,
                                        const PushTotals& applied, int workers, int steps) {
  std::string out;
  const auto add = [&](const std::string& problem) {
    out += fmt::format("server {}: {}\n", server, problem);
  };
  const std::int64_t expected = static_cast<std::int64_t>(workers) * steps;
  if (sent.pushes != expected) {
    add(fmt::format("the workers sent {} pushes, expected {}", sent.pushes, expected));
  }
  if (applied.pushes != sent.pushes) {
    add(fmt::format("applied {} pushes, the workers sent {}", applied.pushes, sent.pushes));
  }
  if (applied.values != sent.values) {
    add(fmt::format("applied {} values, the workers sent {}", applied.values, sent.values));
  }
  if (applied.fingerprint != sent.fingerprint) {
    add(fmt::format("fingerprint {:#x} of the applied pushes, {:#x} of the sent ones",
                    applied.fingerprint, sent.fingerprint));
  }
  if (std::abs(applied.value_sum - sent.value_sum) > 1e-6 * (1.0 + std::abs(sent.value_sum))) {
    add(fmt::format("applied values sum to {}, the sent ones to {}", applied.value_sum,
                    sent.value_sum));
  }
  return out;
}

// Each (worker, clock) with worker < workers and clock < steps was applied
// exactly once by this server, and nothing else was. "" when so.
inline std::string applied_once_problems(const ServerLog& log, int workers, int steps) {
  std::map<std::pair<int, std::int64_t>, int> seen;
  for (const AppliedPush& applied : log.applied) ++seen[{applied.worker, applied.clock}];
  std::string out;
  for (int w = 0; w < workers; ++w) {
    for (std::int64_t t = 0; t < steps; ++t) {
      const auto it = seen.find({w, t});
      const int count = it == seen.end() ? 0 : it->second;
      if (count != 1) {
        out +=
            fmt::format("server {}: worker {} step {} applied {} times\n", log.server, w, t, count);
      }
      if (it != seen.end()) seen.erase(it);
    }
  }
  for (const auto& [key, count] : seen) {
    out += fmt::format("server {}: unexpected push of worker {} step {} applied {} times\n",
                       log.server, key.first, key.second, count);
  }
  if (static_cast<std::int64_t>(log.applied.size()) != log.pushes) {
    out += fmt::format("server {}: {} pushes counted, {} in the apply log\n", log.server,
                       log.pushes, log.applied.size());
  }
  return out;
}

// Both checks over a whole run (thread backend: every log is here).
inline std::string push_problems(const PsRun& run, int workers, int steps) {
  std::string out;
  for (std::size_t s = 0; s < run.servers.size(); ++s) {
    PushTotals sent;
    for (const WorkerLog& worker : run.workers) sent += worker.sent[s];
    out += push_totals_problems(static_cast<int>(s), sent, applied_totals(run.servers[s]), workers,
                                steps);
    out += applied_once_problems(run.servers[s], workers, steps);
  }
  return out;
}

}  // namespace sparsecomm::testing
