// run_training(): validates the configuration, builds the plan, the data
// and the world, and runs every rank's trainer (run_plan.h).

#include "sparsecomm/train/trainer.h"

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "sparsecomm/comm/backend.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/train/checkpoint.h"
#include "sparsecomm/train/run_plan.h"
#include "sparsecomm/train/run_writer.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

int resolve_threads(const TrainConfig& config, BackendKind backend) {
  if (config.deterministic) {
    if (config.threads > 1) {
      throw InvalidArgument("--deterministic runs one intra-op thread per rank; drop --threads");
    }
    return 1;
  }
  if (config.threads > 0) return config.threads;
  if (backend == BackendKind::kThread) return 1;
  // Under mpirun: share this machine's cores among the ranks on it.
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int local_ranks = local ? std::max(1, std::atoi(local)) : 1;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local_ranks);
}

fs::path default_run_dir(const TrainConfig& config) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  return fs::path("runs") / fmt::format("{}-{}-{:04}{:02}{:02}-{:02}{:02}{:02}", config.method,
                                        config.model, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                                        tm.tm_hour, tm.tm_min, tm.tm_sec);
}

// Builds the method once up front so that bad options fail before any work.
void check_method(const TrainConfig& config, const RunPlan& plan) {
  if (ps_mode(config)) {
    const std::size_t numel = model_numel(config);
    if (static_cast<std::size_t>(config.servers) > numel) {
      throw InvalidArgument(fmt::format(
          "--servers {}: more servers than the {} model's {} parameters; give at most {}",
          config.servers, config.model, numel, numel));
    }
    validate_ps_options(ps_options(plan, {}));
  } else {
    with_dense_layers(make_gradient_sync(config.method, SchemeOptions(plan.method_options)),
                      dense_layer_rule(config), NonFinitePolicy::kStop);
    if (!dense_layer_rule(config).empty() && config.model != "dlrm") {  // dlrm: its MLPs, later
      FlatModule probe(*make_seeded_model(config));
      check_dense_layer_rule(config, probe.layers());
    }
  }
}

// The run directory: the resumed run's own (checked against its latest
// checkpoint), --out, or a new one under runs/.
void choose_run_dir(const TrainConfig& config, const std::string& resume_dir, RunPlan& plan) {
  if (!resume_dir.empty()) {
    if (!config.out.empty() && fs::path(config.out) != fs::path(resume_dir)) {
      throw InvalidArgument(
          fmt::format("--resume {} continues that run in its own directory; drop --out {}",
                      resume_dir, config.out));
    }
    plan.run_dir = resume_dir;
    const auto latest = latest_checkpoint(plan.run_dir);
    if (!latest) {
      throw InvalidArgument(fmt::format(
          "{} holds no checkpoint (checkpoints/latest.json); train with --checkpoint-every N or "
          "--stop-at-step N to write one",
          resume_dir));
    }
    plan.resume_step = (*latest)["step"].get<std::int64_t>();
    if (config.stop_at_step > 0 && config.stop_at_step <= *plan.resume_step) {
      throw InvalidArgument(fmt::format(
          "--stop-at-step {}: the checkpoint in {} is already at step {}; give a later step, "
          "or 0 to run to the end",
          config.stop_at_step, resume_dir, *plan.resume_step));
    }
  } else {
    plan.run_dir = config.out.empty() ? default_run_dir(config) : fs::path(config.out);
  }
}

WorldOptions world_of(const TrainConfig& config, const RunPlan& plan) {
  WorldOptions world;
  world.backend = plan.backend;
  world.ranks = config.workers;
  if (ps_mode(config)) {
    // Under MPI take the job's size and check it below (a clearer message).
    world.ranks = plan.backend == BackendKind::kMpi ? 0 : config.workers + config.servers;
  }
  if (config.timeout_s > 0) {
    world.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(config.timeout_s * 1000));
  }
  return world;
}

// The world as started against the configuration (under MPI its size is the
// job's); in parameter-server mode, which ranks serve which shards.
std::optional<ServerLayout> check_world(const TrainConfig& config, const Communicator& comm) {
  std::optional<ServerLayout> layout;
  if (ps_mode(config)) {
    if (config.workers > 0 && comm.size() != config.workers + config.servers) {
      throw InvalidArgument(fmt::format(
          "--workers {} --servers {}: the world must have {} ranks (workers + servers), but "
          "the MPI job has {}; run mpirun -n {} (or give --workers {} to use this job)",
          config.workers, config.servers, config.workers + config.servers, comm.size(),
          config.workers + config.servers, comm.size() - config.servers));
    }
    if (comm.size() <= config.servers) {
      throw InvalidArgument(fmt::format(
          "--servers {}: the job has {} ranks, which leaves no worker; the world is workers + "
          "servers ranks",
          config.servers, comm.size()));
    }
    const int workers = comm.size() - config.servers;
    for (const auto& [rank, factor] : parse_slowdowns(config).fixed) {
      if (rank >= workers) {
        throw InvalidArgument(fmt::format(
            "--slowdown {}:{}: rank {} is not a worker (workers are ranks 0..{}, servers "
            "{}..{})",
            rank, factor, rank, workers - 1, workers, comm.size() - 1));
      }
    }
    layout.emplace(model_numel(config), workers, config.servers);
  } else {
    for (const auto& [rank, factor] : parse_slowdowns(config).fixed) {
      if (rank >= comm.size()) {
        throw InvalidArgument(
            fmt::format("--slowdown {}:{}: there are only {} ranks", rank, factor, comm.size()));
      }
    }
  }
  return layout;
}

}  // namespace

nlohmann::json run_training(const TrainConfig& config, TrainObserver* observer,
                            const std::string& resume_dir) {
  validate(config);
  RunPlan plan;
  plan.config = config;
  plan.method_options = effective_method_options(config);
  if (config.deterministic && config.method == "dense" && plan.method_options.count("allreduce") &&
      plan.method_options.at("allreduce") != "ring") {
    throw InvalidArgument(
        "--deterministic needs our ring all-reduce (a fixed reduction order); drop "
        "--method-option allreduce=native");
  }
  check_method(config, plan);

  plan.backend = resolve_backend(parse_backend(config.backend));
  plan.threads = resolve_threads(config, plan.backend);
  torch::set_num_threads(plan.threads);
  plan.observer = observer;

  choose_run_dir(config, resume_dir, plan);
  plan.config.out = plan.run_dir.string();

  const Datasets data = load_datasets(config);
  plan.data = &data;

  const WorldOptions world = world_of(config, plan);

  std::unique_ptr<RunWriter> writer;
  run_world(world, [&](Communicator& comm) {
    const std::optional<ServerLayout> layout = check_world(config, comm);
    if (comm.rank() == 0) {
      writer = std::make_unique<RunWriter>(plan.run_dir, plan.config,
                                           plan.resume_step ? *plan.resume_step : -1);
      plan.writer = writer.get();
    }
    // The run directory exists (or the error above stops every rank)
    // before anyone trains.
    comm.barrier();
    try {
      if (layout) {
        train_ps_rank(comm, plan, *layout);
      } else if (model_reads_clicks(config.model)) {
        train_click_rank(comm, plan);
      } else {
        train_allreduce_rank(comm, plan);
      }
    } catch (const std::exception& e) {
      if (plan.writer != nullptr) plan.writer->write_failure(e.what());
      throw;
    }
  });
  // Under MPI the other processes learn only that the run stopped.
  if (plan.summary.is_null() && plan.stopped) return {{"stopped", true}};
  return plan.summary;
}

}  // namespace sparsecomm
