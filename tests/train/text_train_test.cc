// The character-level LSTM on fortune text: the model's shape and flat
// buffers, a short training run on a tiny corpus, gradient traces, and the
// model/dataset checks.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/data/fashion_mnist.h"
#include "sparsecomm/data/text_corpus.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/models.h"
#include "sparsecomm/train/trainer.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

constexpr auto kVocabulary = static_cast<std::int64_t>(kTextVocabularySize);

void write_alphabet_corpus(const fs::path& directory) {
  testing::write_alphabet_corpus(directory, 4000, 12345);
}

// A short char-lstm run on `data_dir`: 2 thread ranks, batch 32, no plots.
TrainConfig text_run(const std::string& method, const fs::path& data_dir, const fs::path& out) {
  TrainConfig c = testing::short_run(method, out);
  c.workers = 2;
  c.model = "char-lstm";
  c.dataset = "fortunes";
  c.data_dir = data_dir.string();
  c.train_samples = 0;
  c.test_samples = 0;
  c.epochs = 1;
  c.lr = 0.5;
  c.warmup_epochs = 0.0;
  return c;
}

std::string validation_message(const TrainConfig& c) {
  try {
    validate(c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CharLstm, MapsIdWindowsToLogitsOverTheVocabulary) {
  torch::manual_seed(1);
  const auto model = make_model("char-lstm", kVocabulary);
  const torch::Tensor ids = torch::randint(0, kVocabulary, {5, 32}, torch::kInt64);
  EXPECT_EQ(model->forward(ids).sizes(), (std::vector<std::int64_t>{5, kVocabulary}));
  std::int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  // embedding 97x64, LSTM 4x256x(64 + 256) + 2 biases of 4x256, fc 256x97 + 97.
  EXPECT_EQ(numel, 97 * 64 + 4 * 256 * (64 + 256) + 2 * 4 * 256 + 256 * 97 + 97);
}

// The LSTM reads its weights from DataParallel's flat buffer: with its
// weights zeroed there, its output is 0 and the logits are fc's bias.
TEST(CharLstm, TheLstmReadsItsWeightsFromTheFlatBuffer) {
  run_thread_world(1, [](Communicator& comm) {
    torch::manual_seed(2);
    const auto model = make_model("char-lstm", kVocabulary);
    DataParallel ddp(*model, comm, make_gradient_sync("dense", SchemeOptions{}));
    torch::Tensor fc_bias;
    for (const auto& item : model->named_parameters()) {
      if (item.key() == "fc.bias") fc_bias = item.value();
    }
    ASSERT_TRUE(fc_bias.defined());
    const torch::Tensor ids = torch::randint(0, kVocabulary, {3, 16}, torch::kInt64);
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(torch::allclose(model->forward(ids), fc_bias.expand({3, kVocabulary})));
    int lstm_layers = 0;
    for (const LayerSpan& layer : ddp.layers()) {
      if (layer.name.rfind("lstm.", 0) != 0) continue;
      ++lstm_layers;
      std::fill_n(ddp.parameters().begin() + static_cast<std::ptrdiff_t>(layer.offset), layer.size,
                  0.0f);
    }
    EXPECT_EQ(lstm_layers, 4);  // weight_ih, weight_hh, bias_ih, bias_hh
    EXPECT_TRUE(torch::allclose(model->forward(ids), fc_bias.expand({3, kVocabulary})));
  });
}

TEST(CharLstm, TrainsOnATinyCorpusWellAboveChance) {
  const testing::ScratchDir scratch("char_lstm");
  write_alphabet_corpus(scratch.path() / "fortunes");
  const TrainConfig config = text_run("dense", scratch.path() / "fortunes", scratch.path() / "run");
  const nlohmann::json summary = run_training(config);
  const report::RunData run = report::load_run(config.out);
  ASSERT_GE(run.steps.size(), 40u);
  double first = 0.0, last = 0.0;
  for (std::size_t i = 0; i < 10; ++i) {
    first += run.steps[i].loss;
    last += run.steps[run.steps.size() - 1 - i].loss;
  }
  EXPECT_LT(last, 0.5 * first) << "the loss did not go down";
  // Chance is 1/28 here (26 letters, newline, '%'); the next letter follows
  // from the last one except after a record's end.
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.5);
}

TEST(CharLstm, RecordsAGradientTraceWithTheLstmLayers) {
  const testing::ScratchDir scratch("char_lstm_trace");
  write_alphabet_corpus(scratch.path() / "fortunes");
  const auto json =
      testing::record_trace(text_run("exdyna", scratch.path() / "fortunes", scratch.path() / "run"),
                            scratch.path() / "trace", 3);
  std::vector<std::string> names;
  std::size_t covered = 0;
  for (const auto& layer : json.at("layers")) {
    EXPECT_EQ(layer.at("offset").get<std::size_t>(), covered);
    covered += layer.at("size").get<std::size_t>();
    names.push_back(layer.at("name").get<std::string>());
  }
  EXPECT_EQ(covered, json.at("numel").get<std::size_t>());
  EXPECT_EQ(names, (std::vector<std::string>{"embedding.weight", "lstm.weight_ih_l0",
                                             "lstm.weight_hh_l0", "lstm.bias_ih_l0",
                                             "lstm.bias_hh_l0", "fc.weight", "fc.bias"}));
  EXPECT_EQ(fs::file_size(scratch.path() / "trace" / "rank1.f32"), 3 * covered * sizeof(float));
}

TEST(CharLstm, ModelsAndDatasetsMustAgree) {
  TrainConfig c;
  c.model = "char-lstm";
  const std::string text_model = validation_message(c);
  EXPECT_NE(text_model.find("model char-lstm reads text: it needs --dataset fortunes"),
            std::string::npos)
      << text_model;
  c.model = "cnn";
  c.dataset = "fortunes";
  const std::string image_model = validation_message(c);
  EXPECT_NE(image_model.find("model cnn reads images: it needs --dataset fashion-mnist or "
                             "synthetic"),
            std::string::npos)
      << image_model;
  c.model = "char-lstm";
  EXPECT_EQ(validation_message(c), "(no error)");
  c.dataset = "imagenet";
  EXPECT_NE(validation_message(c).find("fashion-mnist, synthetic, fortunes"), std::string::npos);
}

TEST(CharLstm, EachDatasetHasItsDefaultDirectoryAndClasses) {
  TrainConfig c;
  EXPECT_EQ(data_dir_of(c), kFashionMnistDirectory);
  EXPECT_EQ(dataset_classes(c.dataset), 10);
  c.dataset = "fortunes";
  EXPECT_EQ(data_dir_of(c), kFortunesDirectory);
  EXPECT_EQ(dataset_classes(c.dataset), kVocabulary);
  c.data_dir = "/elsewhere";
  EXPECT_EQ(data_dir_of(c), "/elsewhere");
}

TEST(CharLstm, AMissingCorpusNamesThePackageToInstall) {
  const testing::ScratchDir scratch("char_lstm_missing");
  const TrainConfig c = text_run("dense", scratch.path() / "nowhere", scratch.path() / "run");
  try {
    run_training(c);
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install fortunes"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sparsecomm
