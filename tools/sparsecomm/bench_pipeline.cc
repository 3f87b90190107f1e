#include "bench_pipeline.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "cli_util.h"
#include "sparsecomm/comm/backend.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/data/text_corpus.h"
#include "sparsecomm/optim/sgd.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/models.h"
#include "sparsecomm/train/train_config.h"
#include "world_flags.h"

namespace sparsecomm::cli {
namespace {

struct PipelineBenchOptions {
  WorldFlags world;
  std::string model = "wide-mlp";
  std::string method = "dense";
  double bucket_mb = 4.0;
  int steps = 30;
  int warmup = 3;
  std::int64_t batch = 64;
};

// The dataset whose kind of samples the model reads.
std::string dataset_for(const std::string& model) {
  return model_reads_text(model) ? "fortunes" : "fashion-mnist";
}

struct Timing {
  std::vector<double> step_s;  // rank 0's wall time per step (after warm-up)
  double backward_s = 0.0;
  double communication_s = 0.0;  // selection + exchange
  double overlapped_s = 0.0;
  std::size_t buckets = 0;
};

// Trains `steps` steps on fixed random batches (rank-specific: images, or
// windows of character ids for a text model) with buckets of `bucket_bytes`
// (0: after backward); every rank returns its timing.
Timing measure(Communicator& comm, const PipelineBenchOptions& o, std::size_t bucket_bytes) {
  static std::mutex construction;
  const std::int64_t classes = dataset_classes(dataset_for(o.model));
  std::shared_ptr<Model> model;
  {
    std::lock_guard lock(construction);
    torch::manual_seed(1);
    model = make_model(o.model, classes);
  }
  SchemeOptions options;
  DataParallel ddp(
      *model, comm, [&] { return make_gradient_sync(o.method, options); },
      DataParallelOptions{bucket_bytes});
  FlatSgd sgd(SgdOptions{0.9, false, 0.0});
  auto generator = at::detail::createCPUGenerator(static_cast<std::uint64_t>(7 + comm.rank()));
  const auto window = static_cast<std::int64_t>(TextCorpusOptions{}.window);
  const torch::Tensor inputs =
      model_reads_text(o.model)
          ? torch::randint(0, classes, {o.batch, window}, generator, torch::kInt64)
          : torch::randn({o.batch, 1, 28, 28}, generator);
  const torch::Tensor labels = torch::randint(0, classes, {o.batch}, generator);
  Timing timing;
  timing.buckets = ddp.buckets().size();
  for (int t = 0; t < o.warmup + o.steps; ++t) {
    comm.barrier();  // every step starts together: the median compares like with like
    Stopwatch step;
    ddp.zero_grad();
    Stopwatch backward;
    torch::nn::functional::cross_entropy(model->forward(inputs), labels).backward();
    const double backward_s = backward.seconds();
    const StepMetrics m = ddp.synchronize();
    sgd.step(ddp.parameters(), ddp.gradients(), 0.01);
    if (t < o.warmup) continue;
    timing.step_s.push_back(step.seconds());
    timing.backward_s += backward_s;
    timing.communication_s += m.selection_s + m.exchange_s + m.accumulate_s;
    timing.overlapped_s += m.overlapped_s;
  }
  return timing;
}

void run(const PipelineBenchOptions& o) {
  TrainConfig check;
  check.model = o.model;
  check.dataset = dataset_for(o.model);
  check.method = o.method;
  validate(check);
  if (o.bucket_mb <= 0) throw InvalidArgument("--bucket-mb must be > 0 (the pipelined side)");
  if (o.steps < 1 || o.warmup < 0) throw InvalidArgument("--steps must be >= 1, --warmup >= 0");
  torch::set_num_threads(1);
  run_world(world_options(o.world), [&](Communicator& comm) {
    const Timing after = measure(comm, o, 0);
    const Timing piped = measure(comm, o, static_cast<std::size_t>(o.bucket_mb * 1024.0 * 1024.0));
    if (comm.rank() != 0) return;
    const double median_after = median(after.step_s);
    const double median_piped = median(piped.step_s);
    fmt::print(
        "pipelining, {} on the {} backend, {} ranks, {} over {} steps (after {} warm-up), "
        "rank 0\n",
        o.model, comm.backend(), comm.size(), o.method, o.steps, o.warmup);
    fmt::print("  {:<28} {:>8} {:>14} {:>12} {:>16} {:>16}\n", "path", "buckets", "median step s",
               "backward s", "communication s", "overlap_fraction");
    for (const auto& [name, t] : {std::pair<std::string, const Timing&>{"after backward", after},
                                  {fmt::format("pipelined, {} MiB buckets", o.bucket_mb), piped}}) {
      fmt::print("  {:<28} {:>8} {:>14.4f} {:>12.3f} {:>16.3f} {:>16.3f}\n", name, t.buckets,
                 median(t.step_s), t.backward_s, t.communication_s,
                 t.communication_s > 0 ? t.overlapped_s / t.communication_s : 0.0);
    }
    fmt::print("  median step time, pipelined / after backward: {:.3f}\n",
               median_piped / median_after);
  });
}

}  // namespace

void add_bench_pipeline_command(CLI::App& bench) {
  auto options = std::make_shared<PipelineBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "pipeline",
      "The same training steps synchronized after backward and pipelined in buckets, in one run: "
      "median step times, their ratio, and the share of communication hidden under backward");
  add_world_flags(*cmd, options->world);
  cmd->add_option("--model", options->model,
                  "mlp | cnn | resnet18 | wide-mlp | char-lstm | char-transformer")
      ->capture_default_str();
  cmd->add_option("--method", options->method, "a bucketable method (dense, topk, ...)")
      ->capture_default_str();
  cmd->add_option("--bucket-mb", options->bucket_mb, "bucket size of the pipelined side")
      ->capture_default_str();
  cmd->add_option("--steps", options->steps, "timed steps per side")->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--batch", options->batch, "batch per rank")->capture_default_str();
  cmd->callback([options] { run(*options); });
}

}  // namespace sparsecomm::cli
