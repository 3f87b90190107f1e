// Pipelined (bucketed) synchronization: the same parameters as synchronizing
// after backward, for bucket sizes that split the model every way, and the
// same collectives on every rank even when backward produces gradients in a
// different order on different ranks.

#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/optim/sgd.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/models.h"

namespace sparsecomm {
namespace {

// Builds a model on one rank thread at a time after seeding LibTorch's
// global generator, so that every rank starts from the same parameters.
template <class Make>
auto construct_seeded(std::uint64_t seed, Make&& make) {
  static std::mutex construction;
  std::lock_guard lock(construction);
  torch::manual_seed(seed);
  return make();
}

constexpr int kWorld = 4;
constexpr int kSteps = 4;

// Trains `model_name` for kSteps on fixed random batches and returns rank
// 0's parameters (every rank's in `every_rank`, if given); bucket_bytes 0
// synchronizes after backward.
std::vector<float> train(const std::string& model_name, const std::string& method,
                         std::size_t bucket_bytes, std::size_t* buckets = nullptr,
                         std::vector<std::vector<float>>* every_rank = nullptr) {
  if (every_rank) every_rank->assign(kWorld, {});
  torch::manual_seed(3);
  const torch::Tensor images = torch::randn({kSteps, kWorld, 8, 1, 28, 28});
  const torch::Tensor labels = torch::randint(0, 10, {kSteps, kWorld, 8});
  std::vector<float> result;
  run_thread_world(kWorld, [&](Communicator& comm) {
    const std::shared_ptr<Model> model =
        construct_seeded(1, [&] { return make_model(model_name, 10); });
    SchemeOptions options;
    if (method != "dense") options.set("density=0.05");
    DataParallel ddp(
        *model, comm, [&] { return make_gradient_sync(method, options); },
        DataParallelOptions{bucket_bytes});
    if (comm.rank() == 0 && buckets) *buckets = ddp.buckets().size();
    FlatSgd sgd(SgdOptions{0.9, false, 0.0});
    for (int t = 0; t < kSteps; ++t) {
      ddp.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(images[t][comm.rank()]),
                                           labels[t][comm.rank()])
          .backward();
      const StepMetrics m = ddp.synchronize();
      EXPECT_EQ(m.numel, ddp.numel());
      if (ddp.pipelined()) {
        // Every parameter got a gradient: each was announced by its hook
        // during backward, not completed afterwards.
        EXPECT_EQ(ddp.hook_arrivals(), model->parameters().size());
      }
      sgd.step(ddp.parameters(), ddp.gradients(), 0.05);
    }
    if (comm.rank() == 0) result.assign(ddp.parameters().begin(), ddp.parameters().end());
    if (every_rank) {  // each thread writes its own slot
      (*every_rank)[comm.rank()].assign(ddp.parameters().begin(), ddp.parameters().end());
    }
  });
  return result;
}

TEST(Pipeline, BucketedDenseEqualsSynchronizingAfterBackward) {
  for (const std::string model : {"mlp", "cnn"}) {
    const std::vector<float> reference = train(model, "dense", 0);
    // 1 byte: one bucket per parameter; 64 KiB and 256 KiB: buckets that
    // split the layers in between; 1 GiB: one bucket for all.
    for (const std::size_t bytes :
         {std::size_t{1}, std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 30}) {
      std::size_t buckets = 0;
      const std::vector<float> pipelined = train(model, "dense", bytes, &buckets);
      ASSERT_EQ(pipelined.size(), reference.size());
      double max_diff = 0.0;
      for (std::size_t i = 0; i < reference.size(); ++i) {
        max_diff = std::max(max_diff, std::abs(double{pipelined[i]} - reference[i]));
      }
      EXPECT_LT(max_diff, 1e-5) << model << " with buckets of " << bytes << " bytes (" << buckets
                                << " buckets)";
      if (bytes == 1) {
        EXPECT_EQ(buckets, model == "mlp" ? 6u : 8u) << model;
      }
      if (bytes == std::size_t{1} << 30) {
        EXPECT_EQ(buckets, 1u) << model;
      }
    }
  }
}

TEST(Pipeline, BucketedTopkTrainsLikeOneSyncPerBucket) {
  // Per-bucket top-k selects within each bucket: a different method from
  // global top-k, but it must run and keep every rank's parameters equal.
  std::vector<std::vector<float>> ranks;
  const std::vector<float> a = train("mlp", "topk", 1, nullptr, &ranks);
  ASSERT_FALSE(a.empty());
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(ranks[r], ranks[0]) << "rank " << r;
  // And the buckets were selected from separately: per-model top-k on the
  // same batches ends elsewhere.
  const std::vector<float> unbucketed = train("mlp", "topk", 0);
  EXPECT_NE(a, unbucketed);
}

// A model whose forward uses its two layers in a rank-dependent order, so
// backward accumulates their gradients (and fires the hooks) in different
// orders on different ranks.
class TwoPaths : public torch::nn::Module {
 public:
  TwoPaths() {
    a_ = register_module("a", torch::nn::Linear(16, 16));
    b_ = register_module("b", torch::nn::Linear(16, 16));
  }
  torch::Tensor forward(const torch::Tensor& x, bool a_first) {
    if (a_first) {
      const torch::Tensor ya = a_(x);
      return (ya + b_(x)).pow(2).mean();
    }
    const torch::Tensor yb = b_(x);
    return (a_(x) + yb).pow(2).mean();
  }

 private:
  torch::nn::Linear a_{nullptr}, b_{nullptr};
};

TEST(Pipeline, CollectivesKeepTheirOrderWhenHooksFireInDifferentOrders) {
  auto run = [](std::size_t bucket_bytes) {
    std::vector<float> result;
    run_thread_world(kWorld, [&](Communicator& comm) {
      const auto model = construct_seeded(5, [] { return std::make_shared<TwoPaths>(); });
      DataParallel ddp(
          *model, comm, [] { return make_gradient_sync("dense", SchemeOptions{}); },
          DataParallelOptions{bucket_bytes});
      // Each rank its own generator: the global one is shared by the threads.
      const torch::Tensor x = torch::randn(
          {4, 16}, at::detail::createCPUGenerator(static_cast<std::uint64_t>(100 + comm.rank())));
      for (int t = 0; t < 3; ++t) {
        ddp.zero_grad();
        // Odd ranks also wait a little inside the step, perturbing timing.
        if (comm.rank() % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        model->forward(x, comm.rank() % 2 == 0).backward();
        ddp.synchronize();
        FlatSgd(SgdOptions{0.0, false, 0.0}).step(ddp.parameters(), ddp.gradients(), 0.1);
      }
      if (comm.rank() == 0) result.assign(ddp.parameters().begin(), ddp.parameters().end());
    });
    return result;
  };
  const std::vector<float> reference = run(0);
  const std::vector<float> pipelined = run(1);  // one bucket per parameter
  ASSERT_EQ(pipelined.size(), reference.size());
  for (std::size_t i = 0; i < reference.size(); ++i) {
    EXPECT_NEAR(pipelined[i], reference[i], 1e-6) << i;
  }
}

// Wraps a bucket's synchronization and records, per step, its input
// gradient, its output and the residual it keeps (read from its saved
// state: sparse_sync, scheme name, memory.ef, then the residual).
class RecordingSync final : public GradientSync {
 public:
  struct Step {
    std::vector<float> gradient, output, residual;
  };
  explicit RecordingSync(std::unique_ptr<GradientSync> inner) : inner_(std::move(inner)) {}
  std::string_view method() const override { return inner_->method(); }
  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override {
    Step step;
    step.gradient.assign(gradient.begin(), gradient.end());
    const StepMetrics m = inner_->synchronize(gradient, ctx, comm);
    step.output.assign(gradient.begin(), gradient.end());
    StateWriter writer;
    inner_->save(writer);
    StateReader reader(writer.bytes());
    reader.expect_tag("sparse_sync");
    reader.string();
    reader.expect_tag("memory.ef");
    reader.value<std::uint8_t>();
    step.residual = reader.array<float>();
    steps.push_back(std::move(step));
    return m;
  }
  bool bucketable() const override { return inner_->bucketable(); }
  void save(StateWriter& writer) const override { inner_->save(writer); }
  void load(StateReader& reader) override { inner_->load(reader); }
  std::vector<Step> steps;

 private:
  std::unique_ptr<GradientSync> inner_;
};

TEST(Pipeline, BucketedTopkWithErrorFeedbackConservesGradientMass) {
  // Over all ranks and each bucket, every step:
  //   n * average + sum of new residuals = sum of gradients + sum of old residuals.
  std::vector<std::vector<RecordingSync*>> recorders(kWorld);
  std::vector<std::vector<std::vector<RecordingSync::Step>>> records(kWorld);  // rank, bucket, step
  torch::manual_seed(3);
  const torch::Tensor images = torch::randn({kSteps, kWorld, 8, 1, 28, 28});
  const torch::Tensor labels = torch::randint(0, 10, {kSteps, kWorld, 8});
  static std::mutex construction;
  run_thread_world(kWorld, [&](Communicator& comm) {
    std::shared_ptr<Model> model;
    {
      std::lock_guard lock(construction);
      torch::manual_seed(1);
      model = make_model("mlp", 10);
    }
    SchemeOptions options;
    options.set("density=0.02");
    // Conservation holds for the steps the spike clip leaves alone
    // (tests/sync/spike_clip_test.cc covers the clip).
    options.set("clip_ratio=0");
    auto& mine = recorders[static_cast<std::size_t>(comm.rank())];
    DataParallel ddp(
        *model, comm,
        [&] {
          auto recorder = std::make_unique<RecordingSync>(make_gradient_sync("topk", options));
          mine.push_back(recorder.get());
          return recorder;
        },
        DataParallelOptions{64 << 10});
    EXPECT_TRUE(ddp.pipelined());
    FlatSgd sgd(SgdOptions{0.9, false, 0.0});
    for (int t = 0; t < kSteps; ++t) {
      ddp.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(images[t][comm.rank()]),
                                           labels[t][comm.rank()])
          .backward();
      ddp.synchronize();
      sgd.step(ddp.parameters(), ddp.gradients(), 0.05);
    }
    // The recorders die with ddp: keep what they saw.
    for (const RecordingSync* recorder : mine) {
      records[static_cast<std::size_t>(comm.rank())].push_back(recorder->steps);
    }
  });
  const std::size_t buckets = records[0].size();
  ASSERT_GT(buckets, 1u);
  for (std::size_t b = 0; b < buckets; ++b) {
    for (int t = 0; t < kSteps; ++t) {
      const std::size_t size = records[0][b][static_cast<std::size_t>(t)].output.size();
      for (std::size_t i = 0; i < size; ++i) {
        double lhs = kWorld * double{records[0][b][static_cast<std::size_t>(t)].output[i]};
        double rhs = 0.0;
        for (int r = 0; r < kWorld; ++r) {
          const auto& steps = records[static_cast<std::size_t>(r)][b];
          lhs += steps[static_cast<std::size_t>(t)].residual[i];
          rhs += steps[static_cast<std::size_t>(t)].gradient[i];
          if (t > 0) rhs += steps[static_cast<std::size_t>(t - 1)].residual[i];
        }
        ASSERT_NEAR(lhs, rhs, 1e-5 * (1.0 + std::abs(rhs)))
            << "bucket " << b << " step " << t << " element " << i;
      }
    }
  }
}

TEST(Pipeline, GlobalSchemesRunAfterBackward) {
  run_thread_world(2, [](Communicator& comm) {
    auto model = make_model("mlp", 10);
    DataParallel ddp(
        *model, comm, [] { return make_gradient_sync("exdyna", SchemeOptions{}); },
        DataParallelOptions{1});
    EXPECT_FALSE(ddp.pipelined());
    EXPECT_EQ(ddp.buckets().size(), 1u);
  });
}

}  // namespace
}  // namespace sparsecomm
