// The parameter-server engine on the thread backend: layout and sync-model
// validation, DSSP's grant rule, BSP == synchronous SGD, no push lost or
// applied twice under every model (dense and sparse), the staleness bounds
// on scripted per-worker delays, and failures reported by name.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/sgd.h"
#include "sparsecomm/ps/layout.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/ps/sync_model.h"

namespace sparsecomm {
namespace {

using namespace std::chrono_literals;

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return "";
}

// --- layout and options ---

TEST(ServerLayout, BalancedContiguousShards) {
  for (const std::size_t d : {1u, 7u, 103u, 1000u}) {
    for (int servers = 1; servers <= 5 && static_cast<std::size_t>(servers) <= d; ++servers) {
      const ServerLayout layout(d, 3, servers);
      std::size_t next = 0;
      std::size_t min = d;
      std::size_t max = 0;
      for (int s = 0; s < servers; ++s) {
        const Range shard = layout.shard(s);
        EXPECT_EQ(shard.begin, next);
        next = shard.end;
        min = std::min(min, shard.size());
        max = std::max(max, shard.size());
        for (std::size_t i = shard.begin; i < shard.end; ++i) ASSERT_EQ(layout.server_of(i), s);
        EXPECT_EQ(layout.server_rank(s), 3 + s);
        EXPECT_EQ(layout.server_index(3 + s), s);
      }
      EXPECT_EQ(next, d);
      EXPECT_LE(max - min, 1u);
      EXPECT_GE(min, 1u);
      EXPECT_EQ(layout.controller_rank(), 3);
    }
  }
}

TEST(ServerLayout, BadLayoutsNameTheProblem) {
  EXPECT_NE(error_of<InvalidArgument>([] { ServerLayout(100, 3, 0); }).find("at least 1 server"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] {
              ServerLayout::for_world(100, 3, 3);
            }).find("at least one rank must be a worker"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] {
              ServerLayout::for_world(100, 3, 5);
            }).find("use at most 2 servers"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] { ServerLayout(3, 2, 4); }).find("4 servers for 3"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] { ServerLayout(3, 0, 1); }).find("0 workers"),
            std::string::npos);
  const ServerLayout layout = ServerLayout::for_world(10, 5, 2);
  EXPECT_EQ(layout.workers(), 3);
  EXPECT_THROW((void)layout.server_index(1), InvalidArgument);
}

TEST(SyncModel, ParsesEveryModel) {
  EXPECT_EQ(parse_sync_model("bsp").kind, SyncModelKind::kBsp);
  EXPECT_EQ(parse_sync_model("asp").kind, SyncModelKind::kAsp);
  const SyncModel ssp = parse_sync_model("ssp:3");
  EXPECT_EQ(ssp.kind, SyncModelKind::kSsp);
  EXPECT_EQ(ssp.staleness, 3);
  const SyncModel dssp = parse_sync_model("dssp:1:4");
  EXPECT_EQ(dssp.kind, SyncModelKind::kDssp);
  EXPECT_EQ(dssp.staleness, 1);
  EXPECT_EQ(dssp.staleness_upper, 4);
  EXPECT_EQ(dssp.name(), "dssp:1:4");
  EXPECT_EQ(parse_sync_model(ssp.name()).staleness, 3);
  EXPECT_EQ(make_sync_model("dssp", 2, 2).staleness_upper, 2);
  EXPECT_EQ(make_sync_model("ssp", 0).staleness, 0);
}

TEST(SyncModel, BadModelsNameTheProblem) {
  EXPECT_NE(error_of<InvalidArgument>([] { parse_sync_model("dssp:3:1"); }).find("s_U = 1"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] { parse_sync_model("ssp:-1"); }).find("must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] { parse_sync_model("dssp:-1:2"); }).find("s_L = -1"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] { parse_sync_model("ssp"); }).find("takes 1 bound"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] { parse_sync_model("bsp:2"); }).find("takes 0 bound"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] { parse_sync_model("ssp:x"); }).find("not an integer"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] { parse_sync_model("hogwild"); }).find("valid models"),
            std::string::npos);
  EXPECT_THROW(make_sync_model("asp", 1), InvalidArgument);
  EXPECT_THROW(make_sync_model("dssp", 2, 1), InvalidArgument);
}

TEST(DsspGrant, PicksThePredictedPushClosestToTheSlowest) {
  // F = 10, 11, 12, 13; S = 12, 14, 16: F_2 meets S_1.
  EXPECT_EQ(dssp_grant(10.0, 1.0, 10.0, 2.0, 3), 2);
  // A fast worker far ahead of a slow one: as many steps as allowed.
  EXPECT_EQ(dssp_grant(5.0, 0.001, 5.0, 1.0, 3), 3);
  // Equally fast workers in step: the slowest's next push is one interval away.
  EXPECT_EQ(dssp_grant(10.0, 1.0, 10.0, 1.0, 4), 1);
  // Ties go to the smaller r: F = 0, 1, 2; S = 1.5, 3.
  EXPECT_EQ(dssp_grant(0.0, 1.0, 0.0, 1.5, 2), 1);
  // Nothing to grant.
  EXPECT_EQ(dssp_grant(0.0, 1.0, 0.0, 1.0, 0), 0);
  // The slowest's next push lies in the past of the fast worker: r = 0.
  EXPECT_EQ(dssp_grant(100.0, 1.0, 0.0, 1.0, 3), 0);
  for (int i = 0; i < 200; ++i) {
    const double a = std::fmod(i * 0.731, 3.0);
    const double b = std::fmod(i * 0.377, 5.0);
    const std::int64_t r_max = i % 6;
    const std::int64_t r =
        dssp_grant(a, std::fmod(i * 0.13, 1.0), b, std::fmod(i * 0.29, 2.0), r_max);
    EXPECT_GE(r, 0);
    EXPECT_LE(r, r_max);
  }
  EXPECT_THROW(dssp_grant(0.0, 1.0, 0.0, 1.0, -1), InvalidArgument);
  EXPECT_THROW(dssp_grant(0.0, -1.0, 0.0, 1.0, 1), InvalidArgument);
  EXPECT_THROW(dssp_grant(0.0, 1.0, NAN, 1.0, 1), InvalidArgument);
}

TEST(PsOptions, RefusesWhatPsModeCannotDo) {
  PsOptions options;
  EXPECT_NO_THROW(validate_ps_options(options));
  for (const char* scheme : {"micro", "exdyna", "exdyna-faithful", "cltk", "deft"}) {
    options.push = scheme;
    const std::string message = error_of<InvalidArgument>([&] { validate_ps_options(options); });
    EXPECT_NE(message.find("partition-based"), std::string::npos) << message;
    EXPECT_NE(message.find("topk, threshold, randomk, dgc, gaussiank"), std::string::npos);
  }
  options.push = "nope";
  EXPECT_NE(error_of<InvalidArgument>([&] {
              validate_ps_options(options);
            }).find("unknown push method 'nope'"),
            std::string::npos);
  for (const char* scheme : {"topk", "threshold", "randomk", "gaussiank"}) {
    options.push = scheme;
    EXPECT_NO_THROW(validate_ps_options(options)) << scheme;
  }
  options.push = "topk";
  options.scheme_options.set("values=fp16");
  EXPECT_NE(error_of<InvalidArgument>([&] { validate_ps_options(options); }).find("'values'"),
            std::string::npos);
  options.scheme_options = SchemeOptions();
  options.scheme_options.set("density=2");
  EXPECT_THROW(validate_ps_options(options), InvalidArgument);
  options.scheme_options = SchemeOptions();
  options.push = "dgc";
  EXPECT_NE(error_of<InvalidArgument>([&] {
              validate_ps_options(options);
            }).find("SGD momentum must be 0"),
            std::string::npos);
  options.sgd.momentum = 0.0;
  EXPECT_NO_THROW(validate_ps_options(options));
  options.push = "dense";
  options.scheme_options.set("density=0.1");
  EXPECT_NE(error_of<InvalidArgument>([&] {
              validate_ps_options(options);
            }).find("takes no scheme options"),
            std::string::npos);
  options.scheme_options = SchemeOptions();
  options.sgd.momentum = 1.5;
  EXPECT_THROW(validate_ps_options(options), InvalidArgument);
}

// --- running a PS world ---

// The deterministic local gradient of worker w at step t.
void gradient_of(int w, std::int64_t t, std::span<const float> params, std::span<float> out) {
  const float a = 0.05f * static_cast<float>(w + 1);
  for (std::size_t i = 0; i < params.size(); ++i) {
    out[i] = a * params[i] +
             0.01f * std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(w) +
                              0.7f * static_cast<float>(t));
  }
}

std::vector<float> initial_params(std::size_t d) {
  std::vector<float> p(d);
  for (std::size_t i = 0; i < d; ++i) p[i] = std::cos(0.11f * static_cast<float>(i));
  return p;
}

struct PsRun {
  std::vector<ServerLog> servers;
  std::vector<WorkerLog> workers;
  std::vector<std::vector<float>> final_params;  // per worker, pulled after the last step
};

// Per worker w and step t: how long it "computes" (scripted delays).
using DelayScript = std::function<std::chrono::microseconds(int, std::int64_t)>;
// Called by worker w just before begin_step() of step t (test hooks).
using BeginHook = std::function<void(int, std::int64_t)>;

constexpr double kLr = 0.1;

PsRun run_ps(int workers, int servers, std::size_t d, const PsOptions& options, int steps,
             const DelayScript& delay, std::chrono::milliseconds timeout = 20s,
             const BeginHook& on_begin = nullptr) {
  PsRun run;
  run.servers.resize(static_cast<std::size_t>(servers));
  run.workers.resize(static_cast<std::size_t>(workers));
  run.final_params.resize(static_cast<std::size_t>(workers));
  const std::vector<float> init = initial_params(d);
  run_thread_world(
      workers + servers,
      [&](Communicator& comm) {
        const ServerLayout layout(d, workers, servers);
        if (layout.is_server_rank(comm.rank())) {
          const int s = layout.server_index(comm.rank());
          const Range shard = layout.shard(s);
          run.servers[static_cast<std::size_t>(s)] =
              run_server(comm, layout, options,
                         std::span<const float>(init).subspan(shard.begin, shard.size()));
          return;
        }
        const int w = comm.rank();
        PsWorker worker(comm, layout, options);
        std::vector<float> params(d);
        std::vector<float> gradient(d);
        for (int t = 0; t < steps; ++t) {
          if (on_begin) on_begin(w, t);
          worker.begin_step();
          worker.pull(params);
          std::this_thread::sleep_for(delay(w, t));
          gradient_of(w, t, params, gradient);
          worker.push(gradient, kLr);
        }
        worker.pull(params);
        worker.finish();
        run.workers[static_cast<std::size_t>(w)] = worker.log();
        run.final_params[static_cast<std::size_t>(w)] = params;
      },
      timeout);
  return run;
}

std::chrono::microseconds no_delay(int, std::int64_t) { return 0us; }

TEST(ParameterServer, BspDenseEqualsSynchronousSgd) {
  const int workers = 3;
  const std::size_t d = 103;
  const int steps = 8;
  PsOptions options;  // bsp, dense, momentum 0.9
  // Scripted jitter so arrival order differs from worker order.
  const PsRun run = run_ps(workers, 2, d, options, steps, [](int w, std::int64_t t) {
    return std::chrono::microseconds(((w * 5 + t * 3) % 4) * 300);
  });

  std::vector<float> params = initial_params(d);
  FlatSgd sgd(options.sgd);
  std::vector<float> sum(d);
  std::vector<float> g(d);
  for (int t = 0; t < steps; ++t) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int w = 0; w < workers; ++w) {
      gradient_of(w, t, params, g);
      for (std::size_t i = 0; i < d; ++i) sum[i] += g[i];
    }
    for (float& v : sum) v /= static_cast<float>(workers);
    sgd.step(params, sum, kLr);
  }
  for (int w = 0; w < workers; ++w) {
    const auto& got = run.final_params[static_cast<std::size_t>(w)];
    for (std::size_t i = 0; i < d; ++i) ASSERT_NEAR(got[i], params[i], 1e-6) << "worker " << w;
  }
  for (const ServerLog& log : run.servers) {
    EXPECT_EQ(log.version, steps);
    EXPECT_EQ(log.pushes, workers * steps);
    for (const AppliedPush& applied : log.applied) EXPECT_EQ(applied.staleness, 0);
    for (std::size_t i = 0; i < log.parameters.size(); ++i) {
      EXPECT_EQ(log.parameters[i], run.final_params[0][log.shard.begin + i]);
    }
  }
  // BSP: every step gated at staleness 0.
  for (const BeginGrant& grant : run.servers[0].grants) EXPECT_EQ(grant.clock, grant.min_clock);
}

// Every push arrived exactly once: counts, values and fingerprints match
// what the workers sent, and each (worker, clock) was applied once.
void expect_no_push_lost(const PsRun& run, int workers, int steps, const std::string& what) {
  for (std::size_t s = 0; s < run.servers.size(); ++s) {
    const ServerLog& log = run.servers[s];
    std::int64_t pushes = 0;
    std::size_t values = 0;
    double sum = 0.0;
    std::uint64_t fingerprint = 0;
    for (const WorkerLog& worker : run.workers) {
      pushes += worker.sent[s].pushes;
      values += worker.sent[s].values;
      sum += worker.sent[s].value_sum;
      fingerprint += worker.sent[s].fingerprint;
    }
    EXPECT_EQ(pushes, workers * steps) << what;
    EXPECT_EQ(log.pushes, pushes) << what;
    EXPECT_EQ(log.values, values) << what;
    EXPECT_EQ(log.fingerprint, fingerprint) << what << " server " << s;
    EXPECT_NEAR(log.value_sum, sum, 1e-6 * (1.0 + std::abs(sum))) << what;
    std::map<std::pair<int, std::int64_t>, int> seen;
    for (const AppliedPush& applied : log.applied) ++seen[{applied.worker, applied.clock}];
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(workers * steps)) << what;
    for (const auto& [key, count] : seen) EXPECT_EQ(count, 1) << what;
  }
}

TEST(ParameterServer, NoPushLostOrAppliedTwiceUnderEveryModel) {
  const int workers = 3;
  const int steps = 6;
  const std::size_t d = 2000;
  for (const char* model : {"bsp", "asp", "ssp:1", "dssp:1:3"}) {
    for (const char* push : {"dense", "topk"}) {
      PsOptions options;
      options.model = parse_sync_model(model);
      options.push = push;
      if (options.push == "topk") options.scheme_options.set("density=0.01");
      const PsRun run = run_ps(workers, 2, d, options, steps, [](int w, std::int64_t t) {
        return std::chrono::microseconds(((w * 7 + t * 3) % 4) * 250);
      });
      const std::string what = std::string(model) + "/" + push;
      expect_no_push_lost(run, workers, steps, what);
      if (options.push == "topk") {
        // 1% of 2000 = 20 values per worker per step, split over the shards.
        std::size_t values = 0;
        for (const ServerLog& log : run.servers) values += log.values;
        EXPECT_EQ(values, static_cast<std::size_t>(20 * workers * steps)) << what;
      }
      for (const auto& params : run.final_params) {
        for (const float p : params) ASSERT_TRUE(std::isfinite(p)) << what;
      }
    }
  }
}

// Worker 0 fast, the last worker slow.
std::chrono::microseconds fast_and_slow(int w, std::int64_t, int workers,
                                        std::chrono::microseconds slow) {
  return w == workers - 1 ? slow : 0us;
}

TEST(ParameterServer, SspNeverBeginsPastTheBound) {
  for (const std::int64_t s : {0, 1, 2}) {
    PsOptions options;
    options.model = SyncModel::ssp(s);
    const int steps = 8;
    // The slow worker 2 pushes its first step only well after worker 0 has
    // asked to begin step s + 1, so worker 0 blocks at least once whatever
    // the machine's load; afterwards it is just slower.
    std::atomic<std::int64_t> fast_entered{-1};
    const BeginHook hook = [&](int w, std::int64_t t) {
      if (w == 0) fast_entered.store(t);
    };
    const DelayScript script = [&](int w, std::int64_t t) -> std::chrono::microseconds {
      if (w != 2) return 0us;
      if (t > 0) return 5000us;
      const auto give_up = std::chrono::steady_clock::now() + 10s;
      while (fast_entered.load() < s + 1 && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(1ms);
      }
      return 50000us;
    };
    const PsRun run = run_ps(3, 1, 64, options, steps, script, 20s, hook);
    const ServerLog& controller = run.servers[0];
    ASSERT_EQ(controller.grants.size(), static_cast<std::size_t>(3 * steps));
    for (const BeginGrant& grant : controller.grants) {
      EXPECT_LE(grant.clock - grant.min_clock, s) << "worker " << grant.worker;
      EXPECT_FALSE(grant.extra);
    }
    EXPECT_GT(run.workers[0].blocked, 0) << "s = " << s;
    EXPECT_EQ(controller.waits[0].count, run.workers[0].blocked);
    expect_no_push_lost(run, 3, steps, "ssp");
  }
}

TEST(ParameterServer, AspNeverBlocks) {
  PsOptions options;
  options.model = SyncModel::asp();
  const int steps = 10;
  const PsRun run = run_ps(2, 2, 64, options, steps,
                           [](int w, std::int64_t t) { return fast_and_slow(w, t, 2, 5000us); });
  for (const WorkerLog& worker : run.workers) EXPECT_EQ(worker.blocked, 0);
  EXPECT_TRUE(run.servers[0].grants.empty());  // no BEGIN is ever sent
  // The fast worker ran ahead: some update of it was applied when the slow
  // worker had pushed at least 2 steps fewer.
  std::int64_t slow_clock = 0;
  std::int64_t max_lead = 0;
  for (const AppliedPush& applied : run.servers[0].applied) {
    if (applied.worker == 1) slow_clock = applied.clock + 1;
    if (applied.worker == 0) max_lead = std::max(max_lead, applied.clock + 1 - slow_clock);
  }
  EXPECT_GE(max_lead, 2);
  expect_no_push_lost(run, 2, steps, "asp");
}

TEST(ParameterServer, DsspStaysWithinTheUpperBoundAndBlocksLessThanSsp) {
  const std::int64_t lower = 1;
  const std::int64_t upper = 4;
  // The slow worker's push interval (40 ms) dwarfs the fast one's even on a
  // loaded machine, so DSSP's grants are clear-cut.
  const int steps = 8;
  const DelayScript script = [](int w, std::int64_t t) { return fast_and_slow(w, t, 2, 40000us); };
  PsOptions dssp_options;
  dssp_options.model = SyncModel::dssp(lower, upper);
  const PsRun dssp = run_ps(2, 1, 64, dssp_options, steps, script);
  PsOptions ssp_options;
  ssp_options.model = SyncModel::ssp(lower);
  const PsRun ssp = run_ps(2, 1, 64, ssp_options, steps, script);

  std::int64_t extra = 0;
  for (const BeginGrant& grant : dssp.servers[0].grants) {
    EXPECT_LE(grant.clock - grant.min_clock, upper);
    if (grant.dssp_r != -1) {
      EXPECT_GE(grant.dssp_r, 0);
      EXPECT_LE(grant.dssp_r, upper - lower);
    }
    if (grant.extra) {
      ++extra;
      EXPECT_GT(grant.clock - grant.min_clock, lower);
    } else {
      EXPECT_LE(grant.clock - grant.min_clock, lower);
    }
  }
  EXPECT_GT(extra, 0);
  EXPECT_GT(dssp.workers[0].extra_steps, 0);
  EXPECT_LT(dssp.workers[0].blocked, ssp.workers[0].blocked);
  expect_no_push_lost(dssp, 2, steps, "dssp");
}

TEST(ParameterServer, SparsePushesKeepTheResidualOnTheWorker) {
  // One worker, two servers, ASP, plain SGD: the servers' parameters move by
  // exactly lr * (what was sent), and sent + residual == the gradients' sum.
  PsOptions options;
  options.model = SyncModel::asp();
  options.push = "topk";
  options.scheme_options.set("density=0.05");
  options.sgd.momentum = 0.0;
  const std::size_t d = 200;
  const int steps = 5;
  const std::vector<float> init = initial_params(d);
  std::vector<ServerLog> servers(2);
  std::vector<double> gradient_sum(d, 0.0);
  PushReport last;
  run_thread_world(3, [&](Communicator& comm) {
    const ServerLayout layout(d, 1, 2);
    if (layout.is_server_rank(comm.rank())) {
      const int s = layout.server_index(comm.rank());
      const Range shard = layout.shard(s);
      servers[static_cast<std::size_t>(s)] = run_server(
          comm, layout, options, std::span<const float>(init).subspan(shard.begin, shard.size()));
      return;
    }
    PsWorker worker(comm, layout, options);
    std::vector<float> params(d);
    std::vector<float> gradient(d);
    for (int t = 0; t < steps; ++t) {
      worker.begin_step();
      worker.pull(params);
      gradient_of(0, t, params, gradient);
      for (std::size_t i = 0; i < d; ++i) gradient_sum[i] += gradient[i];
      last = worker.push(gradient, kLr);
      EXPECT_EQ(last.values, 10u);
      EXPECT_EQ(last.target, 10u);
      EXPECT_EQ(last.bytes_sent, 2 * 40 + 10 * 8u);
    }
    worker.finish();
  });
  double residual2 = 0.0;
  for (const ServerLog& log : servers) {
    for (std::size_t i = 0; i < log.parameters.size(); ++i) {
      const std::size_t g = log.shard.begin + i;
      const double sent = (static_cast<double>(init[g]) - log.parameters[i]) / kLr;
      residual2 += (gradient_sum[g] - sent) * (gradient_sum[g] - sent);
    }
    for (const AppliedPush& applied : log.applied) EXPECT_EQ(applied.staleness, 0);
  }
  EXPECT_EQ(servers[0].values + servers[1].values, static_cast<std::size_t>(10 * steps));
  EXPECT_NEAR(std::sqrt(residual2), last.residual_norm, 1e-4 * (1.0 + last.residual_norm));
  EXPECT_GT(last.residual_norm, 0.0);
}

TEST(ParameterServer, EveryPerWorkerSchemeWorksUnderAsyncModels) {
  const int workers = 2;
  const int steps = 4;
  for (const char* model : {"asp", "ssp:1", "dssp:0:2"}) {
    for (const char* scheme : {"threshold", "randomk", "dgc", "gaussiank"}) {
      PsOptions options;
      options.model = parse_sync_model(model);
      options.push = scheme;
      options.scheme_options.set("density=0.02");
      if (options.push == "dgc") options.sgd.momentum = 0.0;
      if (options.push == "threshold") options.scheme_options.set("lambda=0.005");
      const PsRun run = run_ps(workers, 2, 1000, options, steps, no_delay);
      expect_no_push_lost(run, workers, steps, std::string(model) + "/" + scheme);
    }
  }
}

// --- bad use and failures ---

TEST(ParameterServer, RolesAndSizesAreChecked) {
  const std::size_t d = 10;
  std::vector<std::string> errors(3);
  run_thread_world(3, [&](Communicator& comm) {
    const ServerLayout layout(d, 2, 1);
    const auto r = static_cast<std::size_t>(comm.rank());
    if (comm.rank() == 2) {
      errors[r] = error_of<InvalidArgument>([&] { PsWorker worker(comm, layout, PsOptions{}); });
      std::vector<float> wrong(3);
      errors[r] += error_of<InvalidArgument>([&] { run_server(comm, layout, PsOptions{}, wrong); });
    } else {
      std::vector<float> shard(d);
      errors[r] = error_of<InvalidArgument>([&] { run_server(comm, layout, PsOptions{}, shard); });
      PsWorker worker(comm, layout, PsOptions{});
      errors[r] += error_of<Error>([&] { worker.push(shard, 0.1); });
    }
  });
  EXPECT_NE(errors[2].find("is a server, not a worker"), std::string::npos) << errors[2];
  EXPECT_NE(errors[2].find("initial shard of 3 floats"), std::string::npos) << errors[2];
  EXPECT_NE(errors[0].find("is a worker, not a server"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("without begin_step()"), std::string::npos) << errors[0];
}

// Runs a world where `body` drives each rank and records each rank's error.
std::vector<std::string> failing_world(int ranks, std::chrono::milliseconds timeout,
                                       const std::function<void(Communicator&)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(ranks));
  EXPECT_ANY_THROW(run_thread_world(
      ranks,
      [&](Communicator& comm) {
        try {
          body(comm);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(comm.rank())] = e.what();
          throw;
        }
      },
      timeout));
  return errors;
}

TEST(ParameterServer, AWorkerThatThrowsIsNamedOnEveryOtherRank) {
  for (const char* model : {"bsp", "asp", "ssp:1"}) {
    const std::size_t d = 50;
    PsOptions options;
    options.model = parse_sync_model(model);
    const auto errors = failing_world(4, 3000ms, [&](Communicator& comm) {
      const ServerLayout layout(d, 2, 2);
      if (layout.is_server_rank(comm.rank())) {
        const std::vector<float> shard(layout.shard(layout.server_index(comm.rank())).size(), 1.0f);
        run_server(comm, layout, options, shard);
        return;
      }
      PsWorker worker(comm, layout, options);
      std::vector<float> params(d);
      std::vector<float> gradient(d, 0.5f);
      for (int t = 0; t < 1000; ++t) {
        if (comm.rank() == 1 && t == 3) throw std::runtime_error("worker crashed");
        worker.begin_step();
        worker.pull(params);
        worker.push(gradient, 0.01);
      }
      worker.finish();
    });
    EXPECT_NE(errors[1].find("worker crashed"), std::string::npos);
    for (const int r : {0, 2, 3}) {
      EXPECT_NE(errors[static_cast<std::size_t>(r)].find("rank 1 failed: worker crashed"),
                std::string::npos)
          << model << " rank " << r << ": " << errors[static_cast<std::size_t>(r)];
    }
  }
}

TEST(ParameterServer, AServerThatThrowsIsNamedOnTheWorkers) {
  const std::size_t d = 50;
  const auto errors = failing_world(4, 3000ms, [&](Communicator& comm) {
    const ServerLayout layout(d, 2, 2);
    if (comm.rank() == 3) throw std::runtime_error("server crashed");
    if (layout.is_server_rank(comm.rank())) {
      const std::vector<float> shard(layout.shard(0).size(), 1.0f);
      run_server(comm, layout, PsOptions{}, shard);
      return;
    }
    PsWorker worker(comm, layout, PsOptions{});
    std::vector<float> params(d);
    for (int t = 0; t < 1000; ++t) {
      worker.begin_step();
      worker.pull(params);
      worker.push(params, 0.01);
    }
  });
  for (const int r : {0, 1, 2}) {
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("rank 3 failed: server crashed"),
              std::string::npos)
        << "rank " << r << ": " << errors[static_cast<std::size_t>(r)];
  }
}

TEST(ParameterServer, AWorkerThatGoesSilentTimesOutByName) {
  const std::size_t d = 20;
  PsOptions options;
  options.model = SyncModel::asp();
  const auto errors = failing_world(3, 300ms, [&](Communicator& comm) {
    const ServerLayout layout(d, 2, 1);
    if (layout.is_server_rank(comm.rank())) {
      const std::vector<float> shard(d, 1.0f);
      run_server(comm, layout, options, shard);
      return;
    }
    PsWorker worker(comm, layout, options);
    std::vector<float> params(d);
    worker.begin_step();
    worker.pull(params);
    worker.push(params, 0.01);
    if (comm.rank() == 0) worker.finish();  // worker 1 returns without finish()
  });
  EXPECT_NE(errors[2].find("no request from worker 1 (rank 1) for 300 ms"), std::string::npos)
      << errors[2];
}

TEST(ParameterServer, BspWithUnequalStepCountsFailsClearly) {
  const std::size_t d = 20;
  const auto errors = failing_world(3, 3000ms, [&](Communicator& comm) {
    const ServerLayout layout(d, 2, 1);
    if (layout.is_server_rank(comm.rank())) {
      const std::vector<float> shard(d, 1.0f);
      run_server(comm, layout, PsOptions{}, shard);
      return;
    }
    PsWorker worker(comm, layout, PsOptions{});
    std::vector<float> params(d);
    for (int t = 0; t < 2 + comm.rank(); ++t) {
      worker.begin_step();
      worker.pull(params);
      worker.push(params, 0.01);
    }
    worker.finish();
  });
  EXPECT_NE(errors[2].find("same number of steps"), std::string::npos) << errors[2];
}

}  // namespace
}  // namespace sparsecomm
