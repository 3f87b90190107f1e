// The parameter-server engine on the thread backend: layout and sync-model
// validation, DSSP's grant rule, BSP == synchronous SGD, no push lost or
// applied twice under every model (dense and sparse), the staleness bounds
// on scripted per-worker delays, the partition-based push methods under
// BSP (density, error feedback), and failures reported by name.

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "error_message.h"
#include "ps/ps_checks.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/sgd.h"
#include "sparsecomm/ps/layout.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/ps/sync_model.h"

namespace sparsecomm::testing {
namespace {

using namespace std::chrono_literals;

using testing::error_message;

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
  EXPECT_NE(
      error_message<InvalidArgument>([] { ServerLayout(100, 3, 0); }).find("at least 1 server"),
      std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([] {
              ServerLayout::for_world(100, 3, 3);
            }).find("at least one rank must be a worker"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([] {
              ServerLayout::for_world(100, 3, 5);
            }).find("use at most 2 servers"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([] { ServerLayout(3, 2, 4); }).find("4 servers for 3"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([] { ServerLayout(3, 0, 1); }).find("0 workers"),
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
  EXPECT_NE(error_message<InvalidArgument>([] { parse_sync_model("dssp:3:1"); }).find("s_U = 1"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([] { parse_sync_model("ssp:-1"); }).find("must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([] { parse_sync_model("dssp:-1:2"); }).find("s_L = -1"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([] { parse_sync_model("ssp"); }).find("takes 1 bound"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([] { parse_sync_model("bsp:2"); }).find("takes 0 bound"),
            std::string::npos);
  EXPECT_NE(
      error_message<InvalidArgument>([] { parse_sync_model("ssp:x"); }).find("not an integer"),
      std::string::npos);
  EXPECT_NE(
      error_message<InvalidArgument>([] { parse_sync_model("hogwild"); }).find("valid models"),
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
    options.model = SyncModel::bsp();
    EXPECT_NO_THROW(validate_ps_options(options)) << scheme;
    EXPECT_TRUE(ps_push_is_partition_based(scheme));
    for (const char* model : {"asp", "ssp:1", "dssp:1:3"}) {
      options.model = parse_sync_model(model);
      const std::string message =
          error_message<InvalidArgument>([&] { validate_ps_options(options); });
      EXPECT_NE(message.find(fmt::format("scheme '{}' is partition-based", scheme)),
                std::string::npos)
          << message;
      EXPECT_NE(message.find(fmt::format("not under '{}'", model)), std::string::npos) << message;
      EXPECT_NE(message.find("use --sync bsp"), std::string::npos) << message;
      EXPECT_NE(message.find("dense, topk, threshold, randomk, dgc, gaussiank"), std::string::npos)
          << message;
    }
    // The exchange options stay refused under BSP too.
    options.model = SyncModel::bsp();
    options.scheme_options.set("exchange=allgather");
    EXPECT_NE(
        error_message<InvalidArgument>([&] { validate_ps_options(options); }).find("'exchange'"),
        std::string::npos);
    options.scheme_options = SchemeOptions();
  }
  EXPECT_FALSE(ps_push_is_partition_based("topk"));
  EXPECT_FALSE(ps_push_is_partition_based("dense"));
  EXPECT_NE(ps_push_methods().find("cltk, micro, exdyna, exdyna-faithful, deft (--sync bsp only)"),
            std::string::npos)
      << ps_push_methods();
  EXPECT_EQ(ps_push_methods().find("qsgd"), std::string::npos) << ps_push_methods();
  options.model = SyncModel::bsp();
  options.push = "nope";
  EXPECT_NE(error_message<InvalidArgument>([&] {
              validate_ps_options(options);
            }).find("unknown push method 'nope'"),
            std::string::npos);
  for (const char* scheme : {"topk", "threshold", "randomk", "gaussiank"}) {
    options.push = scheme;
    EXPECT_NO_THROW(validate_ps_options(options)) << scheme;
  }
  options.push = "topk";
  options.scheme_options.set("values=fp16");
  EXPECT_NE(error_message<InvalidArgument>([&] { validate_ps_options(options); }).find("'values'"),
            std::string::npos);
  options.scheme_options = SchemeOptions();
  options.scheme_options.set("density=2");
  EXPECT_THROW(validate_ps_options(options), InvalidArgument);
  options.scheme_options = SchemeOptions();
  options.push = "dgc";
  EXPECT_NE(error_message<InvalidArgument>([&] {
              validate_ps_options(options);
            }).find("SGD momentum must be 0"),
            std::string::npos);
  options.optimizer.sgd.momentum = 0.0;
  EXPECT_NO_THROW(validate_ps_options(options));
  options.push = "dense";
  options.scheme_options.set("density=0.1");
  EXPECT_NE(error_message<InvalidArgument>([&] {
              validate_ps_options(options);
            }).find("takes no scheme options"),
            std::string::npos);
  options.scheme_options = SchemeOptions();
  options.optimizer.sgd.momentum = 1.5;
  EXPECT_THROW(validate_ps_options(options), InvalidArgument);
}

// --- running a PS world ---

PsHooks hooks_with_on_begin(BeginHook hook) {
  PsHooks hooks;
  hooks.on_begin = std::move(hook);
  return hooks;
}
PsHooks hooks_with_on_push(PushHook hook) {
  PsHooks hooks;
  hooks.on_push = std::move(hook);
  return hooks;
}
PsHooks hooks_with_gradient(GradientFn gradient) {
  PsHooks hooks;
  hooks.gradient = std::move(gradient);
  return hooks;
}

// Runs a PS world of `workers` + `servers` ranks on the thread backend.
PsRun run_ps(int workers, int servers, std::size_t d, const PsOptions& options, int steps,
             const DelayScript& delay, std::chrono::milliseconds timeout = 20s,
             const PsHooks& hooks = {}) {
  PsRun run = sized_run(workers, servers);
  run_thread_world(
      workers + servers,
      [&](Communicator& comm) {
        run_ps_rank(comm, ServerLayout(d, workers, servers), options, steps, delay, run, hooks);
      },
      timeout);
  return run;
}

TEST(ParameterServer, BspDenseEqualsSynchronousSgd) {
  const int workers = 3;
  const std::size_t d = 103;
  const int steps = 8;
  PsOptions options;  // bsp, dense, momentum 0.9
  // Scripted jitter so arrival order differs from worker order.
  const PsRun run = run_ps(workers, 2, d, options, steps, [](int w, std::int64_t t) {
    return std::chrono::microseconds(((w * 5 + t * 3) % 4) * 300);
  });

  const std::vector<float> params = synchronous_sgd(d, workers, steps, options.optimizer.sgd);
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

// The servers' optimizer may be AdamW: BSP then equals AdamW on the mean
// gradient, shard by shard.
TEST(ParameterServer, BspWithAdamWEqualsSynchronousAdamW) {
  const int workers = 3;
  const std::size_t d = 103;
  const int steps = 8;
  PsOptions options;
  options.optimizer.name = "adamw";
  options.optimizer.adamw.weight_decay = 0.1;
  const PsRun run = run_ps(workers, 2, d, options, steps, [](int w, std::int64_t t) {
    return std::chrono::microseconds(((w * 3 + t) % 3) * 200);
  });
  const std::vector<float> params = synchronous_steps(d, workers, steps, options.optimizer);
  for (int w = 0; w < workers; ++w) {
    const auto& got = run.final_params[static_cast<std::size_t>(w)];
    for (std::size_t i = 0; i < d; ++i) ASSERT_NEAR(got[i], params[i], 1e-6) << "worker " << w;
  }
  // Partition-based pushes still need SGD when DGC-style momentum runs on the
  // workers; AdamW on the servers with DGC's correction is refused.
  options.push = "dgc";
  EXPECT_THROW(validate_ps_options(options), InvalidArgument);
  // EF21's running estimate lives with the exchange, not on the servers.
  options.push = "topk";
  options.scheme_options = SchemeOptions(std::map<std::string, std::string>{{"memory", "ef21"}});
  EXPECT_THROW(validate_ps_options(options), InvalidArgument);
}

// With s = 0 a worker begins step t + 1 only after all W pushes of step t,
// and its pull waits until they have reached every server, not just the
// controller; the test also holds every worker after its pull until all
// have pulled, so all W gradients of a step are taken at the same
// parameters (lockstep). Applied one by one, each as 1/W of a step with the
// pushing worker's own momentum buffer, they move the parameters as one
// synchronous step does (weight decay 0: a push's decay term would see the
// parameters that the step's earlier pushes moved). One momentum buffer
// decayed at every push would not: it decays W times per step.
TEST(ParameterServer, SspWithZeroStalenessStepsLikeBsp) {
  for (const bool nesterov : {false, true}) {
    const int workers = 3;
    const std::size_t d = 103;
    const int steps = 8;
    PsOptions options;
    options.model = SyncModel::ssp(0);
    options.optimizer.sgd.nesterov = nesterov;
    std::barrier all_pulled(workers);
    const PsHooks hooks = hooks_with_gradient(
        [&](int w, std::int64_t t, std::span<const float> params, std::span<float> out) {
          all_pulled.arrive_and_wait();
          gradient_of(w, t, params, out);
        });
    const PsRun run = run_ps(
        workers, 2, d, options, steps,
        [](int w, std::int64_t t) {
          return std::chrono::microseconds(((w * 5 + t * 3) % 4) * 300);
        },
        20s, hooks);
    // Each server's final shard: a worker's last pull need not wait for the
    // others' last pushes.
    const std::vector<float> params = synchronous_sgd(d, workers, steps, options.optimizer.sgd);
    for (const ServerLog& server : run.servers) {
      for (const AppliedPush& applied : server.applied) {
        ASSERT_EQ(applied.pulled_version, workers * applied.clock)
            << "server " << server.server << ": the lockstep broke";
      }
      ASSERT_EQ(server.parameters.size(), server.shard.size());
      for (std::size_t i = 0; i < server.parameters.size(); ++i) {
        ASSERT_NEAR(server.parameters[i], params[server.shard.begin + i], 1e-5)
            << "nesterov " << nesterov;
      }
    }
  }
}

// Every push arrived exactly once: counts, values and fingerprints match
// what the workers sent, and each (worker, clock) was applied once.
void expect_no_push_lost(const PsRun& run, int workers, int steps, const std::string& what) {
  EXPECT_EQ(push_problems(run, workers, steps), "") << what;
}

// A rank's view of the world in which its messages to one peer travel a
// slow link: each arrives `delay` late, in order, and not before `gate` is
// ready (when given). isend copies the message and completes at once; a
// lane thread sends it when due. With `only_tag`, only messages of that tag
// take the slow link. Everything else goes straight to the world. The
// destructor delivers what is still queued; after a send fails (an aborted
// world) the lane drops the rest.
class SlowLink final : public Communicator {
 public:
  SlowLink(Communicator& world, int slow_peer, std::chrono::milliseconds delay,
           std::optional<int> only_tag = std::nullopt, std::shared_future<void> gate = {})
      : world_(world),
        slow_peer_(slow_peer),
        delay_(delay),
        only_tag_(only_tag),
        gate_(std::move(gate)),
        lane_([this] { deliver(); }) {
    set_timeout(world.timeout());
  }
  ~SlowLink() override {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    ready_.notify_one();
    lane_.join();
  }
  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  std::string_view backend() const override { return world_.backend(); }
  Request isend(std::span<const std::byte> data, int dst, int tag) override {
    if (dst != slow_peer_ || (only_tag_ && tag != *only_tag_)) return world_.isend(data, dst, tag);
    {
      std::lock_guard lock(mutex_);
      queue_.push_back({{data.begin(), data.end()}, tag, Clock::now() + delay_});
    }
    ready_.notify_one();
    return Request();
  }
  Request irecv(std::span<std::byte> data, int src, int tag) override {
    return world_.irecv(data, src, tag);
  }

 private:
  struct Message {
    std::vector<std::byte> bytes;
    int tag;
    Clock::time_point due;
  };
  void deliver() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing, all delivered
      Message m = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_until(m.due);
      if (gate_.valid()) gate_.wait();
      try {
        world_.send(m.bytes, slow_peer_, m.tag);
      } catch (const std::exception&) {
        return;  // the world was aborted: the run fails on its ranks' own errors
      }
      lock.lock();
    }
  }
  Communicator& world_;
  int slow_peer_;
  std::chrono::milliseconds delay_;
  std::optional<int> only_tag_;
  std::shared_future<void> gate_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Message> queue_;
  bool closing_ = false;
  std::thread lane_;  // last: starts once the rest is built
};

// The controller grants a step on the pushes it has received; another
// server may not have its copy yet. Here worker 2's messages to server 1
// arrive 30 ms late, so under SSP(0) the others are granted step t + 1
// while worker 2's push of step t is still on its way to server 1. Their
// pulls from server 1 must wait for it: every push was computed on a read
// that held all pushes of the earlier steps, on every server.
TEST(ParameterServer, APullWaitsForPushesStillOnTheirWayToItsServer) {
  const int workers = 3;
  const int servers = 2;
  const std::size_t d = 64;
  const int steps = 4;
  PsOptions options;
  options.model = SyncModel::ssp(0);
  PsRun run = sized_run(workers, servers);
  run_thread_world(
      workers + servers,
      [&](Communicator& comm) {
        const ServerLayout layout(d, workers, servers);
        const auto no_delay = [](int, std::int64_t) { return 0us; };
        if (comm.rank() == 2) {
          SlowLink slow(comm, layout.server_rank(1), 30ms);
          run_ps_rank(slow, layout, options, steps, no_delay, run);
        } else {
          run_ps_rank(comm, layout, options, steps, no_delay, run);
        }
      },
      20s);
  for (const ServerLog& server : run.servers) {
    ASSERT_EQ(server.applied.size(), static_cast<std::size_t>(workers * steps));
    for (const AppliedPush& applied : server.applied) {
      EXPECT_GE(applied.pulled_version, workers * applied.clock)
          << "server " << server.server << ": worker " << applied.worker << " at clock "
          << applied.clock << " read before all pushes of the earlier steps";
    }
  }
  expect_no_push_lost(run, workers, steps, "slow link");
}

// A server receives one worker's push payload while it serves the others,
// so W workers share its link instead of queueing for it. Here worker 0's
// payloads are held back until worker 1 has run all its steps (ASP never
// blocks worker 1): a server that waited for worker 0's payload before
// serving anyone else would never let worker 1 finish, and the run would
// time out.
TEST(ParameterServer, AServerServesOtherWorkersWhileAPushPayloadArrives) {
  const int workers = 2;
  const std::size_t d = 1000;
  const int steps = 4;
  PsOptions options;
  options.model = SyncModel::asp();
  PsRun run = sized_run(workers, 1);
  std::promise<void> worker1_done;
  const std::shared_future<void> gate = worker1_done.get_future().share();
  run_thread_world(
      workers + 1,
      [&](Communicator& comm) {
        const ServerLayout layout(d, workers, 1);
        if (comm.rank() == 0) {
          SlowLink held(comm, layout.server_rank(0), 0ms, tags::kPsPushPayload, gate);
          run_ps_rank(held, layout, options, steps, no_delay, run);
        } else if (comm.rank() == 1) {
          // Opens the gate however worker 1 ends, so a failing run ends too.
          const std::unique_ptr<std::promise<void>, void (*)(std::promise<void>*)> open(
              &worker1_done, [](std::promise<void>* done) { done->set_value(); });
          run_ps_rank(comm, layout, options, steps, no_delay, run);
        } else {
          run_ps_rank(comm, layout, options, steps, no_delay, run);
        }
      },
      10s);
  const std::vector<AppliedPush>& applied = run.servers[0].applied;
  ASSERT_EQ(applied.size(), static_cast<std::size_t>(workers * steps));
  for (int i = 0; i < steps; ++i) {
    EXPECT_EQ(applied[static_cast<std::size_t>(i)].worker, 1)
        << "push " << i << " applied: worker 1's pushes should all come first";
  }
  expect_no_push_lost(run, workers, steps, "held payloads");
}

TEST(ParameterServer, NoPushLostOrAppliedTwiceUnderEveryModel) {
  const int workers = 3;
  const int steps = 6;
  const std::size_t d = 2000;
  for (const char* model : {"bsp", "asp", "ssp:1", "dssp:1:3"}) {
    for (const char* push : {"dense", "topk"}) {
      const PsOptions options = model_and_push(model, push);
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

TEST(ParameterServer, PushChecksCatchALostOrDoubledPush) {
  // The checks compare independent counts of both sides, so a push that
  // was lost, applied twice, or changed on the way shows.
  PsOptions options;
  options.push = "topk";
  options.scheme_options.set("density=0.05");
  const PsRun clean = run_ps(2, 2, 200, options, 3, no_delay);
  ASSERT_EQ(push_problems(clean, 2, 3), "");
  const auto find = [](ServerLog& log, int worker, std::int64_t clock) {
    return std::find_if(log.applied.begin(), log.applied.end(), [&](const AppliedPush& a) {
      return a.worker == worker && a.clock == clock;
    });
  };

  PsRun lost = clean;  // server 1 never applied worker 0's step 1
  ServerLog& lost_log = lost.servers[1];
  const auto gone = find(lost_log, 0, 1);
  ASSERT_NE(gone, lost_log.applied.end());
  lost_log.pushes -= 1;
  lost_log.values -= gone->values;
  lost_log.applied.erase(gone);
  std::string problems = push_problems(lost, 2, 3);
  EXPECT_NE(problems.find("server 1: applied 5 pushes, the workers sent 6"), std::string::npos)
      << problems;
  EXPECT_NE(problems.find("server 1: worker 0 step 1 applied 0 times"), std::string::npos)
      << problems;

  PsRun doubled = clean;  // server 0 applied worker 1's step 2 twice
  ServerLog& doubled_log = doubled.servers[0];
  const AppliedPush again = *find(doubled_log, 1, 2);
  doubled_log.applied.push_back(again);
  doubled_log.pushes += 1;
  doubled_log.values += again.values;
  problems = push_problems(doubled, 2, 3);
  EXPECT_NE(problems.find("server 0: applied 7 pushes"), std::string::npos) << problems;
  EXPECT_NE(problems.find("server 0: worker 1 step 2 applied 2 times"), std::string::npos)
      << problems;

  PsRun changed = clean;  // same count, different content
  changed.workers[1].sent[0].fingerprint += 1;
  problems = push_problems(changed, 2, 3);
  EXPECT_NE(problems.find("server 0: fingerprint"), std::string::npos) << problems;
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
    const PsRun run = run_ps(3, 1, 64, options, steps, script, 20s, hooks_with_on_begin(hook));
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
  options.optimizer.sgd.momentum = 0.0;
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
      EXPECT_EQ(last.selected, 10u);
      EXPECT_EQ(last.union_size, 10u);  // per-worker scheme: its own count
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
      if (options.push == "dgc") options.optimizer.sgd.momentum = 0.0;
      if (options.push == "threshold") options.scheme_options.set("lambda=0.005");
      const PsRun run = run_ps(workers, 2, 1000, options, steps, no_delay);
      expect_no_push_lost(run, workers, steps, std::string(model) + "/" + scheme);
    }
  }
}

// --- partition-based push methods (BSP only) ---

constexpr const char* kPartitionSchemes[] = {"micro", "exdyna", "exdyna-faithful", "cltk", "deft"};

// Values pushed per step, over all workers and servers.
std::vector<std::size_t> values_per_step(const PsRun& run, int steps) {
  std::vector<std::size_t> out(static_cast<std::size_t>(steps), 0);
  for (const ServerLog& log : run.servers) {
    for (const AppliedPush& applied : log.applied) {
      out[static_cast<std::size_t>(applied.clock)] += applied.values;
    }
  }
  return out;
}

TEST(ParameterServer, EveryPartitionSchemeWorksUnderBsp) {
  const int workers = 3;
  const int steps = 6;
  const std::size_t d = 2000;
  const std::size_t k = 20;  // 1% of d
  const auto W = static_cast<std::size_t>(workers);
  for (const char* scheme : kPartitionSchemes) {
    PsOptions options;
    options.push = scheme;
    options.scheme_options.set("density=0.01");
    if (options.push == "deft") options.layers = deft_layers();
    // Per step and worker: what its push reported.
    std::vector<std::vector<PushReport>> reports(static_cast<std::size_t>(steps),
                                                 std::vector<PushReport>(W));
    const PushHook hook = [&](int w, std::int64_t t, const PsWorker&, std::span<const float>,
                              const PushReport& report) {
      reports[static_cast<std::size_t>(t)][static_cast<std::size_t>(w)] = report;
    };
    const PsRun run = run_ps(
        workers, 2, d, options, steps,
        [](int w, std::int64_t t) {
          return std::chrono::microseconds(((w * 7 + t * 3) % 4) * 250);
        },
        20s, hooks_with_on_push(hook));
    expect_no_push_lost(run, workers, steps, scheme);
    const std::vector<std::size_t> per_step = values_per_step(run, steps);
    std::size_t total = 0;
    for (int t = 0; t < steps; ++t) {
      const std::size_t values = per_step[static_cast<std::size_t>(t)];
      const auto& step = reports[static_cast<std::size_t>(t)];
      total += values;
      std::size_t selected = 0;
      std::size_t pushed = 0;
      for (const PushReport& report : step) {
        selected += report.selected;
        pushed += report.values;
        // One shared outcome: every worker's sparsifier observed the same K,
        // and every worker pushes its values at the whole union (explicit
        // indices of all workers + known ranges), as the union all-reduce.
        EXPECT_EQ(report.union_size, step[0].union_size) << scheme << " step " << t;
        EXPECT_EQ(report.values, report.union_size) << scheme << " step " << t;
        EXPECT_EQ(report.target, k);
        EXPECT_EQ(report.bytes_to_workers, report.selected * sizeof(Index) * (W - 1))
            << scheme << " step " << t;
      }
      EXPECT_EQ(pushed, values) << scheme << " step " << t;
      EXPECT_EQ(values, W * step[0].union_size) << scheme << " step " << t;
      if (options.push == "cltk") {
        // Shared indices: every worker selected the leader's k indices, K = k.
        for (const PushReport& report : step) EXPECT_EQ(report.selected, k) << "step " << t;
        EXPECT_EQ(step[0].union_size, k) << "step " << t;
      } else if (options.push == "deft") {
        // Disjoint per-piece selections plus the whole pieces (known ranges,
        // in no count): k in all.
        EXPECT_GE(step[0].union_size, selected) << "step " << t;
        EXPECT_LE(step[0].union_size, k) << "step " << t;
      } else {
        // Disjoint selections: K = the sum of the counts.
        EXPECT_EQ(step[0].union_size, selected) << scheme << " step " << t;
      }
    }
    // The threshold schemes may select nothing in a step; not in all.
    EXPECT_GT(total, 0u) << scheme;
    for (const auto& params : run.final_params) {
      ASSERT_EQ(params, run.final_params[0]) << scheme;  // BSP: everyone pulled the same
      for (const float p : params) ASSERT_TRUE(std::isfinite(p)) << scheme;
    }
  }
}

// gradient_of plus noise that differs per worker, step and element (like a
// minibatch gradient): the smooth, nearly constant gradient_of makes whole
// runs of elements cross any threshold together, which no controller that
// looks one step back can track.
void noisy_gradient_of(int w, std::int64_t t, std::span<const float> params, std::span<float> out) {
  gradient_of(w, t, params, out);
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint64_t x = (static_cast<std::uint64_t>(w) << 48) ^
                      (static_cast<std::uint64_t>(t) << 24) ^ static_cast<std::uint64_t>(i);
    double sum = 0.0;  // Irwin-Hall: about normal, mean 0, variance 1
    for (int j = 0; j < 12; ++j) {
      x += 0x9e3779b97f4a7c15ULL;
      std::uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      z ^= z >> 31;
      sum += static_cast<double>(z >> 11) * 0x1.0p-53;
    }
    out[i] += 0.05f * static_cast<float>(sum - 6.0);
  }
}

TEST(ParameterServer, ExDynaUnderBspHoldsTheDensityAcrossWorkers) {
  // K = the sum of the workers' counts (disjoint partitions) must track
  // k = 1% of d once the density controller has settled: the workers'
  // controllers only agree on one threshold because each sees the
  // all-gathered counts.
  const int workers = 3;
  const int servers = 2;
  const std::size_t d = 4000;
  const std::size_t k = 40;
  const int steps = 200;
  const int settled = 100;
  PsOptions options;
  options.push = "exdyna";
  options.scheme_options.set("density=0.01");
  const PsRun run = run_ps(workers, servers, d, options, steps, no_delay, 20s,
                           hooks_with_gradient(noisy_gradient_of));
  expect_no_push_lost(run, workers, steps, "exdyna");
  const std::vector<std::size_t> per_step = values_per_step(run, steps);
  double settled_values = 0.0;
  for (int t = settled; t < steps; ++t)
    settled_values += static_cast<double>(per_step[static_cast<std::size_t>(t)]);
  // Every worker pushes the union: W x K values per step.
  const double ratio = settled_values / static_cast<double>(workers * k * (steps - settled));
  EXPECT_GT(ratio, 0.9) << "mean K/k over steps " << settled << "+";
  EXPECT_LT(ratio, 1.1) << "mean K/k over steps " << settled << "+";
  // Bytes per push, whole run (settling included): >= 20x below dense.
  std::size_t bytes = 0;
  std::size_t pushes = 0;
  for (const ServerLog& log : run.servers) {
    for (const AppliedPush& applied : log.applied) bytes += applied.bytes;
    pushes += static_cast<std::size_t>(log.pushes);
  }
  const double dense_push_bytes = static_cast<double>(servers * 40 + d * 4);  // per worker
  const double sparse_push_bytes =
      static_cast<double>(bytes) / static_cast<double>(pushes / servers);
  EXPECT_LT(sparse_push_bytes * 20.0, dense_push_bytes) << sparse_push_bytes << " bytes per push";
}

TEST(ParameterServer, PartitionSchemesKeepTheResidualOnTheWorkers) {
  // BSP, plain SGD: each step the servers move by lr / W * (the sum of the
  // pushes), so over the run, for every coordinate,
  //   sum over workers of (pushed + residual) == sum of all gradients.
  // DEFT's known range (index 1200) is pushed by every worker whenever the
  // leader makes it a whole piece: then every residual there is exactly 0.
  const int workers = 3;
  const int steps = 8;
  const std::size_t d = 2000;
  for (const char* scheme : {"exdyna", "deft"}) {
    PsOptions options;
    options.push = scheme;
    options.scheme_options.set("density=0.01");
    options.optimizer.sgd.momentum = 0.0;
    if (options.push == "deft") options.layers = deft_layers();
    std::vector<std::vector<double>> gradient_sum(static_cast<std::size_t>(workers),
                                                  std::vector<double>(d, 0.0));
    std::vector<std::vector<float>> residual(static_cast<std::size_t>(workers));
    // Per step and worker: the residual at DEFT's known index is 0.
    std::vector<std::vector<int>> known_zero(static_cast<std::size_t>(steps),
                                             std::vector<int>(static_cast<std::size_t>(workers)));
    const PushHook hook = [&](int w, std::int64_t t, const PsWorker& worker,
                              std::span<const float> gradient, const PushReport& report) {
      const auto wi = static_cast<std::size_t>(w);
      for (std::size_t i = 0; i < d; ++i) gradient_sum[wi][i] += gradient[i];
      const std::span<const float> r = worker.residual();
      residual[wi].assign(r.begin(), r.end());
      known_zero[static_cast<std::size_t>(t)][wi] = r[kDeftKnownIndex] == 0.0f ? 1 : 0;
      double norm2 = 0.0;
      for (const float v : r) norm2 += static_cast<double>(v) * v;
      EXPECT_NEAR(std::sqrt(norm2), report.residual_norm, 1e-4 * (1.0 + report.residual_norm));
    };
    const PsRun run =
        run_ps(workers, 2, d, options, steps, no_delay, 20s, hooks_with_on_push(hook));
    expect_no_push_lost(run, workers, steps, scheme);

    const std::vector<float> init = initial_params(d);
    double pushed_total = 0.0;
    for (const ServerLog& log : run.servers) pushed_total += log.value_sum;
    double residual_total = 0.0;
    double residual_max = 0.0;
    double gradient_total = 0.0;
    double max_error = 0.0;
    for (const ServerLog& log : run.servers) {
      for (std::size_t j = 0; j < log.parameters.size(); ++j) {
        const std::size_t i = log.shard.begin + j;
        const double pushed =
            workers * (static_cast<double>(init[i]) - static_cast<double>(log.parameters[j])) / kLr;
        double kept = 0.0;
        double sum = 0.0;
        for (int w = 0; w < workers; ++w) {
          kept += residual[static_cast<std::size_t>(w)][i];
          residual_max =
              std::max(residual_max, std::abs(double{residual[static_cast<std::size_t>(w)][i]}));
          sum += gradient_sum[static_cast<std::size_t>(w)][i];
        }
        residual_total += kept;
        gradient_total += sum;
        max_error = std::max(max_error, std::abs(pushed + kept - sum) / (1.0 + std::abs(sum)));
      }
    }
    EXPECT_LT(max_error, 1e-4) << scheme << ": pushed + residual != gradients somewhere";
    EXPECT_NEAR(pushed_total + residual_total, gradient_total,
                1e-4 * (1.0 + std::abs(gradient_total)))
        << scheme;
    EXPECT_GT(residual_max, 0.0) << scheme;  // something was held back

    if (options.push == "deft") {
      int whole_steps = 0;
      for (int t = 0; t < steps; ++t) {
        const auto& row = known_zero[static_cast<std::size_t>(t)];
        // Known ranges are the same on every worker: all pushed it or none.
        EXPECT_EQ(std::count(row.begin(), row.end(), row[0]), workers) << "step " << t;
        whole_steps += row[0];
      }
      EXPECT_GT(whole_steps, 0) << "DEFT never made the 1-element bias a whole piece";
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
      errors[r] =
          error_message<InvalidArgument>([&] { PsWorker worker(comm, layout, PsOptions{}); });
      std::vector<float> wrong(3);
      errors[r] +=
          error_message<InvalidArgument>([&] { run_server(comm, layout, PsOptions{}, wrong); });
    } else {
      std::vector<float> shard(d);
      errors[r] =
          error_message<InvalidArgument>([&] { run_server(comm, layout, PsOptions{}, shard); });
      PsWorker worker(comm, layout, PsOptions{});
      errors[r] += error_message<Error>([&] { worker.push(shard, 0.1); });
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

TEST(ParameterServer, PartitionSchemesAreRefusedOutsideBspOnEveryRank) {
  for (const char* model : {"asp", "ssp:1", "dssp:1:3"}) {
    PsOptions options;
    options.model = parse_sync_model(model);
    options.push = "exdyna";
    PsRun unused = sized_run(2, 1);
    const auto errors = failing_world(3, 3000ms, [&](Communicator& comm) {
      run_ps_rank(comm, ServerLayout(100, 2, 1), options, 1, no_delay, unused);
    });
    for (const std::string& error : errors) {
      EXPECT_NE(error.find("scheme 'exdyna' is partition-based"), std::string::npos) << error;
      EXPECT_NE(error.find(fmt::format("not under '{}'", model)), std::string::npos) << error;
      EXPECT_NE(error.find("use --sync bsp"), std::string::npos) << error;
    }
  }
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
}  // namespace sparsecomm::testing
