#include "sparsecomm/train/model_probe.h"

#include <algorithm>

#include <fmt/format.h>
#include <torch/torch.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/data/text_corpus.h"
#include "sparsecomm/report/statistics.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/models.h"
#include "sparsecomm/train/train_config.h"

namespace sparsecomm {

ModelProbe probe_model(const std::string& model, std::int64_t batch, int threads, int reps) {
  const auto& names = model_names();
  if (std::find(names.begin(), names.end(), model) == names.end()) {
    throw InvalidArgument(
        fmt::format("unknown model '{}' (models: {})", model, fmt::join(names, ", ")));
  }
  if (model_reads_clicks(model)) {
    throw InvalidArgument(fmt::format(
        "the performance model does not cover {}'s row-sparse embedding tables yet; plan its "
        "MLPs with --params 57361 and --compute-ms (docs/benchmarks/click-model.md measures "
        "the tables' exchanges)",
        model));
  }
  if (batch < 1 || threads < 1 || reps < 1) {
    throw InvalidArgument(
        fmt::format("timing a model needs batch, threads and repetitions >= 1, got {}, {} and {}",
                    batch, threads, reps));
  }
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  const bool text = model_reads_text(model);
  const std::int64_t classes =
      text ? static_cast<std::int64_t>(kTextVocabularySize) : std::int64_t{10};
  const std::shared_ptr<Model> net = make_model(model, classes);
  net->train();

  ModelProbe probe;
  probe.model = model;
  probe.batch = batch;
  probe.threads = threads;
  // The tensors as the trainer lays them out (names, offsets, rows), and
  // its flat gradient for the timed passes.
  const FlatModule flat(*net);
  probe.tensors.assign(flat.layers().begin(), flat.layers().end());
  probe.numel = static_cast<std::int64_t>(flat.numel());
  constexpr std::int64_t kTextWindow = 32;  // TextCorpusOptions' default window
  const torch::Tensor inputs = text ? torch::randint(static_cast<std::int64_t>(kTextVocabularySize),
                                                     {batch, kTextWindow}, torch::kInt64)
                                    : torch::randn({batch, 1, 28, 28});
  const torch::Tensor labels = torch::randint(classes, {batch}, torch::kInt64);
  std::vector<double> seconds;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    net->zero_grad();
    Stopwatch clock;
    net->score(inputs, labels).losses.mean().backward();
    if (rep > 0) seconds.push_back(clock.seconds());
  }
  probe.compute_s = report::median(seconds);
  return probe;
}

}  // namespace sparsecomm
