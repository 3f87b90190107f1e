// The parameter-server engine on the MPI backend (run under mpiexec -n 4):
// no push is lost or applied twice under every model, with dense, Top-k
// and the partition-based pushes (BSP), on 3 workers + 1 server and on
// 2 workers + 2 servers; and BSP with dense pushes equals synchronous SGD.
// Each rank is its own process, so every rank all-gathers the per-server
// totals of every rank (what each worker sent, what each server applied)
// and checks them; each server checks its own apply log. No ASSERT in the
// rank bodies: a rank that returned early would leave the others waiting.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "mpi/mpi_world.h"
#include "ps/ps_checks.h"
#include "sparsecomm/ps/layout.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/ps/sync_model.h"

namespace sparsecomm::testing {
namespace {

TEST(PsMpi, RunsOnFourRanks) { EXPECT_EQ(mpi_world().size(), 4); }

// Scripted per-worker, per-step delays, so arrival order varies.
std::chrono::microseconds jitter(int w, std::int64_t t) {
  return std::chrono::microseconds(((w * 7 + t * 3) % 4) * 250);
}

// Runs one PS configuration on the world (its last `servers` ranks serve)
// and checks on every rank that no push was lost or applied twice. Returns
// this rank's part of the run.
PsRun run_and_check(Communicator& comm, int servers, const PsOptions& options, std::size_t d,
                    int steps, const std::string& what) {
  const ServerLayout layout = ServerLayout::for_world(d, comm.size(), servers);
  const int workers = layout.workers();
  PsRun run = sized_run(workers, servers);
  run_ps_rank(comm, layout, options, steps, jitter, run);

  // Per rank, one record per server: a worker's is what it sent there; a
  // server's own slot is what it applied (its other slots stay 0).
  const auto n_servers = static_cast<std::size_t>(servers);
  std::vector<PushTotals> mine(n_servers);
  if (layout.is_worker_rank(comm.rank())) {
    const WorkerLog& log = run.workers[static_cast<std::size_t>(comm.rank())];
    for (std::size_t s = 0; s < n_servers; ++s) mine[s] += log.sent[s];
  } else {
    const auto s = static_cast<std::size_t>(layout.server_index(comm.rank()));
    mine[s] = applied_totals(run.servers[s]);
  }
  std::vector<PushTotals> all(static_cast<std::size_t>(comm.size()) * n_servers);
  comm.allgather(std::as_bytes(std::span<const PushTotals>(mine)),
                 std::as_writable_bytes(std::span<PushTotals>(all)));
  for (int s = 0; s < servers; ++s) {
    PushTotals sent;
    for (int w = 0; w < workers; ++w) {
      sent += all[static_cast<std::size_t>(w) * n_servers + static_cast<std::size_t>(s)];
    }
    const PushTotals applied = all[static_cast<std::size_t>(layout.server_rank(s)) * n_servers +
                                   static_cast<std::size_t>(s)];
    EXPECT_EQ(push_totals_problems(s, sent, applied, workers, steps), "") << what;
    EXPECT_GT(applied.values, 0u) << what << " server " << s;
  }
  if (layout.is_server_rank(comm.rank())) {
    const ServerLog& log = run.servers[static_cast<std::size_t>(layout.server_index(comm.rank()))];
    EXPECT_EQ(applied_once_problems(log, workers, steps), "") << what;
  } else {
    const auto& params = run.final_params[static_cast<std::size_t>(comm.rank())];
    EXPECT_TRUE(std::all_of(params.begin(), params.end(), [](float p) { return std::isfinite(p); }))
        << what;
  }
  return run;
}

TEST(PsMpi, NoPushLostOrAppliedTwiceUnderEveryModel) {
  run_on_mpi_world([](Communicator& comm) {
    for (const int servers : {1, 2}) {
      for (const char* model : {"bsp", "asp", "ssp:1", "dssp:1:3"}) {
        for (const char* push : {"dense", "topk"}) {
          const PsOptions options = model_and_push(model, push);
          run_and_check(comm, servers, options, 2000, 6,
                        fmt::format("{} servers, {}, {}", servers, model, push));
        }
      }
    }
  });
}

TEST(PsMpi, PartitionBasedPushesUnderBsp) {
  run_on_mpi_world([](Communicator& comm) {
    for (const int servers : {1, 2}) {
      for (const char* push : {"exdyna", "micro", "cltk", "deft"}) {
        PsOptions options;
        options.push = push;
        options.scheme_options.set("density=0.01");
        if (options.push == "deft") options.layers = deft_layers();
        run_and_check(comm, servers, options, 2000, 6,
                      fmt::format("{} servers, bsp, {}", servers, push));
      }
    }
  });
}

TEST(PsMpi, BspDenseEqualsSynchronousSgd) {
  run_on_mpi_world([](Communicator& comm) {
    const std::size_t d = 103;
    const int steps = 8;
    for (const int servers : {1, 2}) {
      PsOptions options;  // bsp, dense, momentum 0.9
      const std::string what = fmt::format("{} servers", servers);
      const PsRun run = run_and_check(comm, servers, options, d, steps, what);
      const ServerLayout layout = ServerLayout::for_world(d, comm.size(), servers);
      if (layout.is_worker_rank(comm.rank())) {
        const std::vector<float> expected =
            synchronous_sgd(d, layout.workers(), steps, options.optimizer.sgd);
        const auto& got = run.final_params[static_cast<std::size_t>(comm.rank())];
        EXPECT_EQ(got.size(), d) << what;
        double max_error = 0.0;
        for (std::size_t i = 0; i < d && i < got.size(); ++i) {
          max_error = std::max(max_error, std::abs(static_cast<double>(got[i]) - expected[i]));
        }
        EXPECT_LE(max_error, 1e-6) << what;
      } else {
        const ServerLog& log =
            run.servers[static_cast<std::size_t>(layout.server_index(comm.rank()))];
        EXPECT_EQ(log.version, steps) << what;
        for (const AppliedPush& applied : log.applied) EXPECT_EQ(applied.staleness, 0) << what;
      }
    }
  });
}

}  // namespace
}  // namespace sparsecomm::testing
