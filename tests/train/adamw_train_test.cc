// AdamW on the flat buffers against torch.optim.AdamW, the causal
// transformer language model, and AdamW in the trainer.

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "error_message.h"
#include "sparsecomm/data/text_corpus.h"
#include "sparsecomm/optim/adamw.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/train/models.h"
#include "sparsecomm/train/trainer.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;
constexpr auto kCharVocabulary = static_cast<std::int64_t>(kTextVocabularySize);

// The same parameters and gradients through FlatAdamW and torch's AdamW, 30
// steps, with and without weight decay (Adam).
TEST(FlatAdamW, EqualsTorchsAdamWOnTheSameGradients) {
  for (const double weight_decay : {0.0, 0.1}) {
    torch::manual_seed(7);
    const torch::Tensor start = torch::randn({257});
    torch::Tensor theirs = start.clone().requires_grad_(true);
    torch::optim::AdamW reference(
        {theirs},
        torch::optim::AdamWOptions(3e-3).betas({0.9, 0.99}).eps(1e-8).weight_decay(weight_decay));
    FlatAdamW ours(
        AdamWOptions{.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = weight_decay});
    std::vector<float> p(start.data_ptr<float>(), start.data_ptr<float>() + start.numel());
    for (int t = 0; t < 30; ++t) {
      const torch::Tensor g = torch::randn({257}) * (t % 2 == 0 ? 1.0 : 0.01);
      theirs.mutable_grad() = g.clone();
      reference.step();
      ours.step(p, std::span<const float>(g.data_ptr<float>(), 257), 3e-3);
    }
    const torch::Tensor expected = theirs.detach();
    for (std::int64_t i = 0; i < 257; ++i) {
      ASSERT_NEAR(p[static_cast<std::size_t>(i)], expected[i].item<float>(), 2e-6)
          << "weight decay " << weight_decay << " element " << i;
    }
  }
}

// The size ladder: four blocks of widths 64, 128 and 256 (heads of 32),
// 12 w^2 + 13 w parameters a block, the token and position embeddings and
// the last norm; the output layer is the token embedding.
TEST(CharTransformer, TheSizeLadderHasFourBlocksOfEachWidth) {
  for (const auto& [name, width] :
       {std::pair<std::string, std::int64_t>{"char-transformer-w64", 64},
        {"char-transformer", 128},
        {"char-transformer-w256", 256}}) {
    const auto model = make_model(name, kCharVocabulary);
    std::int64_t count = 0;
    for (const torch::Tensor& p : model->parameters()) count += p.numel();
    const std::int64_t w = width;
    EXPECT_EQ(count, 4 * (12 * w * w + 13 * w) + (kCharVocabulary + 64) * w + 2 * w) << name;
    const torch::Tensor ids = torch::randint(0, kCharVocabulary, {2, 16}, torch::kInt64);
    EXPECT_EQ(model->forward(ids).sizes(), (std::vector<std::int64_t>{2, kCharVocabulary}));
  }
}

TEST(CharTransformer, MapsIdWindowsToLogitsAndScoresEveryPosition) {
  torch::manual_seed(3);
  const auto model = make_model("char-transformer", kCharVocabulary);
  const torch::Tensor ids = torch::randint(0, kCharVocabulary, {5, 32}, torch::kInt64);
  const torch::Tensor labels = torch::randint(0, kCharVocabulary, {5}, torch::kInt64);
  EXPECT_EQ(model->forward(ids).sizes(), (std::vector<std::int64_t>{5, kCharVocabulary}));
  const Model::Scores scores = model->score(ids, labels);
  EXPECT_EQ(scores.losses.sizes(), (std::vector<std::int64_t>{5}));
  std::int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  // Tied output: token 97x128 and positions 64x128; per block two layer
  // norms (2 x 256), qkv 128x384 + 384, proj 128x128 + 128, MLP 128x512 +
  // 512 and 512x128 + 128; a final layer norm.
  const std::int64_t block =
      2 * 256 + (128 * 384 + 384) + (128 * 128 + 128) + (128 * 512 + 512) + (512 * 128 + 128);
  EXPECT_EQ(numel, 97 * 128 + 64 * 128 + 4 * block + 256);
  // Untrained, the loss is near that of a uniform guess (small embeddings).
  EXPECT_NEAR(scores.losses.mean().item<double>(), std::log(97.0), 0.5);
}

// Causal: the positions before the last see nothing after them, so their
// losses on the whole window equal those of the window without its last
// character (whose own target is that character).
TEST(CharTransformer, NoPositionSeesTheCharactersAfterIt) {
  torch::manual_seed(4);
  const auto model = make_model("char-transformer", kCharVocabulary);
  torch::NoGradGuard no_grad;
  const std::int64_t t = 16;
  const torch::Tensor ids = torch::randint(0, kCharVocabulary, {3, t}, torch::kInt64);
  const torch::Tensor labels = torch::randint(0, kCharVocabulary, {3}, torch::kInt64);
  const Model::Scores whole = model->score(ids, labels);
  const torch::Tensor last = torch::nn::functional::cross_entropy(
      whole.logits, labels,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  const torch::Tensor before_last = whole.losses * t - last;
  const Model::Scores prefix = model->score(ids.narrow(1, 0, t - 1), ids.select(1, t - 1));
  EXPECT_TRUE(torch::allclose(before_last, prefix.losses * (t - 1), 1e-4, 1e-4))
      << before_last << prefix.losses * (t - 1);
  EXPECT_THROW(model->forward(torch::zeros({1, 65}, torch::kInt64)), InvalidArgument);
}

TrainConfig transformer_run(const fs::path& data_dir, const fs::path& out) {
  TrainConfig c = testing::short_run("dense", out);
  c.workers = 2;
  c.model = "char-transformer";
  c.dataset = "fortunes";
  c.data_dir = data_dir.string();
  c.train_samples = 0;
  c.test_samples = 0;
  c.epochs = 1;
  c.batch = 16;
  c.optimizer = "adamw";
  c.lr = 5e-3;
  c.weight_decay = 0.1;
  c.warmup_epochs = 0.1;
  return c;
}

TEST(CharTransformer, TrainsWithAdamWWellAboveChance) {
  const testing::ScratchDir scratch("char_transformer");
  testing::write_alphabet_corpus(scratch.path() / "fortunes", 1500, 777);
  const TrainConfig c = transformer_run(scratch.path() / "fortunes", scratch.path() / "run");
  const nlohmann::json summary = run_training(c);
  const report::RunData run = report::load_run(c.out);
  ASSERT_GE(run.steps.size(), 30u);
  // Chance is 1/28 (26 letters, newline, '%'); after a letter the next one is known.
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.5);
}

// Every combination of the optimizer's placement resumes bit for bit: the
// step's AdamW state, each rank's own moments (--compress update), and the
// dense steps before a frozen variance.
TEST(Trainer, AdamWRunsResumeBitForBit) {
  const testing::ScratchDir scratch("adamw_resume");
  struct Case {
    std::string method, compress;
    std::int64_t freeze;
  };
  for (const Case& k :
       {Case{"exdyna", "gradient", 0}, Case{"topk", "update", 0}, Case{"topk", "gradient", 24}}) {
    const std::string name = k.method + "-" + k.compress + std::to_string(k.freeze);
    auto config = [&](const std::string& tail) {
      TrainConfig c = testing::short_run(k.method, scratch.path() / (name + tail));
      c.optimizer = "adamw";
      c.lr = 2e-3;
      c.compress = k.compress;
      c.freeze_variance_after = k.freeze;
      c.train_samples = 2048;  // 32 steps: the frozen case stops before its freeze at 24
      return c;
    };
    const TrainConfig whole = config("-whole");
    testing::expect_resume_matches_uninterrupted(whole, config("-half"), 20, name);
    const report::RunData run = report::load_run(whole.out);
    // The frozen variance's steps before it are the dense ring's: the same
    // bytes every step; the method's differ.
    if (k.freeze > 0) {
      for (std::int64_t t = 1; t < k.freeze; ++t) {
        EXPECT_EQ(run.steps[t].bytes_sent, run.steps[0].bytes_sent) << name << " step " << t;
      }
      EXPECT_NE(run.steps[k.freeze].bytes_sent, run.steps[0].bytes_sent) << name;
    }
    EXPECT_LT(run.steps.back().loss, run.steps.front().loss) << name;
  }
}

// DeMo's trainer runs SGD without momentum on its signs; a run resumes bit
// for bit (the momentum in the chunks' DCT basis is in the checkpoint).
TEST(Trainer, DeMoRunsResumeBitForBit) {
  const testing::ScratchDir scratch("demo_resume");
  auto config = [&](const std::string& tail) {
    TrainConfig c = testing::short_run("demo", scratch.path() / tail);
    c.lr = 2e-3;
    c.method_options["chunk"] = "32";
    c.method_options["values"] = "int8-sr";
    c.train_samples = 2048;  // 32 steps
    return c;
  };
  const TrainConfig whole = config("whole");
  testing::expect_resume_matches_uninterrupted(whole, config("half"), 20, "demo");
  const report::RunData run = report::load_run(whole.out);
  EXPECT_LT(run.steps.back().loss, run.steps.front().loss);
  EXPECT_EQ(run.steps.back().bytes_sent, run.steps.front().bytes_sent);  // fixed per step
}

// Muon around a sparsifier resumes bit for bit (the matrices' momentum and
// the rest's AdamW moments are in the checkpoint).
// Muon inside rounds of 4 local steps with 4-bit stochastically rounded
// pseudo-gradients and error feedback (MuLoCo's design), stopped inside a
// round: the momentum of Muon and of its AdamW half, the anchor and the
// quantizer's memory all resume. Two ranks and 8 steps: the Newton-Schulz
// products of the MLP's 784 x 256 layer dominate, and the sanitizer builds
// run them at a tenth of the speed.
TEST(Trainer, MuonInsideLowBitRoundsResumesBitForBit) {
  const testing::ScratchDir scratch("muon_resume");
  auto config = [&](const std::string& tail) {
    TrainConfig c = testing::short_run("qsgd", scratch.path() / tail);
    c.method_options = {{"values", "int4-sr"}, {"memory", "ef"}};
    c.local_steps = 4;
    c.outer_lr = 1.0;
    c.outer_momentum = 0.0;
    c.outer_nesterov = false;
    c.optimizer = "muon";
    c.lr = 2e-3;
    c.workers = 2;
    c.train_samples = 512;
    c.epochs = 1;
    return c;
  };
  const TrainConfig whole = config("whole");
  testing::expect_resume_matches_uninterrupted(whole, config("half"), 6, "muon rounds");
  const report::RunData run = report::load_run(whole.out);
  EXPECT_LT(run.steps.back().loss, run.steps.front().loss);
}

// The layers of `model` as DataParallel lays them out (named parameters in order).
std::vector<LayerSpan> layers_of(torch::nn::Module& model) {
  std::vector<LayerSpan> layers;
  std::size_t offset = 0;
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& p = item.value();
    const auto size = static_cast<std::size_t>(p.numel());
    layers.push_back(
        {item.key(), offset, size, p.dim() >= 2 ? static_cast<std::size_t>(p.size(0)) : 0});
    offset += size;
  }
  return layers;
}

// Muon's matrices: every hidden weight; not the embeddings, not an untied
// output layer, not the vectors.
TEST(HiddenMatrices, LeaveTheModelsEndsAndItsVectorsToAdamW) {
  auto names = [](torch::nn::Module& model, bool tied) {
    const std::vector<LayerSpan> layers = layers_of(model);
    std::vector<std::string> out;
    for (const MatrixBlock& m : hidden_matrices(model, layers, tied)) {
      for (const LayerSpan& layer : layers) {
        if (layer.offset == m.offset) {
          EXPECT_EQ(m.rows * m.cols, layer.size) << layer.name;
          out.push_back(layer.name);
        }
      }
    }
    return out;
  };
  const auto transformer = make_model("char-transformer", kCharVocabulary);
  ASSERT_TRUE(transformer->ties_output_to_embedding());
  const std::vector<std::string> blocks = names(*transformer, true);
  ASSERT_EQ(blocks.size(), 16u);  // qkv, proj, fc1, fc2 of 4 blocks
  EXPECT_EQ(blocks.front(), "block0.qkv.weight");
  EXPECT_EQ(blocks.back(), "block3.fc2.weight");
  const auto mlp = make_model("mlp", 10);
  EXPECT_FALSE(mlp->ties_output_to_embedding());
  EXPECT_EQ(names(*mlp, false), (std::vector<std::string>{"fc1.weight", "fc2.weight"}));
  const auto cnn = make_model("cnn", 10);
  EXPECT_EQ(names(*cnn, false),
            (std::vector<std::string>{"conv1.weight", "conv2.weight", "fc1.weight"}));
}

// With AdamW on the gradient a sparsifier's memory is EF21 unless named
// (DGC's momentum correction included); not with --compress update, in
// parameter-server mode, or for dense.
TEST(Trainer, AdamWDefaultsSparsifiersToEf21) {
  TrainConfig c = testing::short_run("dgc", "unused");
  EXPECT_EQ(effective_method_options(c).count("memory"), 0u);
  c.optimizer = "adamw";
  EXPECT_EQ(effective_method_options(c).at("memory"), "ef21");
  c.method_options["memory"] = "ef";
  EXPECT_EQ(effective_method_options(c).at("memory"), "ef");
  c.method_options.clear();
  c.compress = "update";
  EXPECT_EQ(effective_method_options(c).count("memory"), 0u);
  c.compress = "gradient";
  c.servers = 1;
  EXPECT_EQ(effective_method_options(c).count("memory"), 0u);
  c.servers = 0;
  c.method = "dense";
  EXPECT_EQ(effective_method_options(c).count("memory"), 0u);
}

TEST(Trainer, OptimizerOptionsThatCannotApplyAreRefused) {
  const testing::ScratchDir scratch("adamw_bad");
  auto message = [&](TrainConfig c) { return testing::error_message([&] { run_training(c); }); };
  TrainConfig c = testing::short_run("topk", scratch.path() / "a");
  c.compress = "update";  // with SGD
  EXPECT_NE(message(c).find("needs --optimizer adamw"), std::string::npos) << message(c);
  c.optimizer = "adamw";
  c.bucket_mb = 1.0;
  EXPECT_NE(message(c).find("drop --bucket-mb"), std::string::npos) << message(c);
  c = testing::short_run("dgc", scratch.path() / "b");  // DGC's momentum correction, named
  c.optimizer = "adamw";
  c.method_options["memory"] = "momentum";
  EXPECT_NE(message(c).find("-o memory=ef"), std::string::npos) << message(c);
  c = testing::short_run("topk", scratch.path() / "c");
  c.optimizer = "adamw";
  c.compress = "update";
  c.freeze_variance_after = 10;
  EXPECT_NE(message(c).find("choose one"), std::string::npos) << message(c);
  c = testing::short_run("topk", scratch.path() / "d");
  c.optimizer = "lamb";
  EXPECT_NE(message(c).find("valid: sgd, adamw, muon"), std::string::npos) << message(c);
  c = testing::short_run("topk", scratch.path() / "d2");
  c.optimizer = "muon";
  c.servers = 1;
  EXPECT_NE(message(c).find("shards split them"), std::string::npos) << message(c);
  c = testing::short_run("topk", scratch.path() / "e");
  c.freeze_variance_after = 10;
  EXPECT_NE(message(c).find("add --optimizer adamw"), std::string::npos) << message(c);
  c = testing::short_run("demo", scratch.path() / "f");  // a direction: SGD applies it
  c.optimizer = "adamw";
  EXPECT_NE(message(c).find("run it with --optimizer sgd"), std::string::npos) << message(c);
  c.optimizer = "sgd";
  c.local_steps = 4;
  c.out = (scratch.path() / "g").string();
  EXPECT_NE(message(c).find("use a sparsifier"), std::string::npos) << message(c);
  c.local_steps = 0;
  c.min_numel = 100;
  c.out = (scratch.path() / "h").string();
  EXPECT_NE(message(c).find("drop --min-numel and --exclude"), std::string::npos) << message(c);
  EXPECT_FALSE(fs::exists(scratch.path() / "a"));  // refused before the run directory exists
}

}  // namespace
}  // namespace sparsecomm
