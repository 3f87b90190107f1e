#include "sparsecomm/train/models.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/train/train_config.h"

namespace sparsecomm {
namespace {

namespace nn = torch::nn;

// Fully connected layers fc1..fcN of the given hidden widths, ReLU between.
class Mlp final : public Model {
 public:
  Mlp(const std::vector<std::int64_t>& hidden, std::int64_t classes) {
    std::int64_t in = 28 * 28;
    for (std::size_t i = 0; i <= hidden.size(); ++i) {
      const std::int64_t out = i < hidden.size() ? hidden[i] : classes;
      layers_.push_back(register_module(fmt::format("fc{}", i + 1), nn::Linear(in, out)));
      in = out;
    }
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = x.flatten(1);
    for (std::size_t i = 0; i + 1 < layers_.size(); ++i) x = torch::relu(layers_[i](x));
    return layers_.back()(x);
  }

 private:
  std::vector<nn::Linear> layers_;
};

class Cnn final : public Model {
 public:
  explicit Cnn(std::int64_t classes) {
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)));
    fc1_ = register_module("fc1", nn::Linear(64 * 7 * 7, 128));
    fc2_ = register_module("fc2", nn::Linear(128, classes));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::max_pool2d(torch::relu(conv1_(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2_(x)), 2);
    x = torch::relu(fc1_(x.flatten(1)));
    return fc2_(x);
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

nn::Conv2d conv3x3(std::int64_t in, std::int64_t out, std::int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

class BasicBlock final : public nn::Module {
 public:
  BasicBlock(std::int64_t in, std::int64_t out, std::int64_t stride) {
    conv1_ = register_module("conv1", conv3x3(in, out, stride));
    bn1_ = register_module("bn1", nn::BatchNorm2d(out));
    conv2_ = register_module("conv2", conv3x3(out, out, 1));
    bn2_ = register_module("bn2", nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      shortcut_conv_ = register_module(
          "shortcut_conv", nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
      shortcut_bn_ = register_module("shortcut_bn", nn::BatchNorm2d(out));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = torch::relu(bn1_(conv1_(x)));
    y = bn2_(conv2_(y));
    const torch::Tensor shortcut = shortcut_conv_ ? shortcut_bn_(shortcut_conv_(x)) : x;
    return torch::relu(y + shortcut);
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, shortcut_conv_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, shortcut_bn_{nullptr};
};

class ResNet18 final : public Model {
 public:
  explicit ResNet18(std::int64_t classes) {
    stem_ = register_module("stem", conv3x3(1, 64, 1));
    stem_bn_ = register_module("stem_bn", nn::BatchNorm2d(64));
    const std::int64_t widths[] = {64, 128, 256, 512};
    std::int64_t in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      for (int block = 0; block < 2; ++block) {
        const std::int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
        blocks_.push_back(register_module(fmt::format("layer{}_{}", stage + 1, block),
                                          std::make_shared<BasicBlock>(in, widths[stage], stride)));
        in = widths[stage];
      }
    }
    fc_ = register_module("fc", nn::Linear(512, classes));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(stem_bn_(stem_(x)));
    for (const auto& block : blocks_) x = block->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc_(x);
  }

 private:
  nn::Conv2d stem_{nullptr};
  nn::BatchNorm2d stem_bn_{nullptr};
  std::vector<std::shared_ptr<BasicBlock>> blocks_;
  nn::Linear fc_{nullptr};
};

// Next-character prediction: ids [B, T] -> embedding -> LSTM -> the logits
// of the character after the last one, from the last step's output.
class CharLstm final : public Model {
 public:
  explicit CharLstm(std::int64_t vocabulary) {
    embedding_ = register_module("embedding", nn::Embedding(vocabulary, kEmbedding));
    lstm_ =
        register_module("lstm", nn::LSTM(nn::LSTMOptions(kEmbedding, kHidden).batch_first(true)));
    fc_ = register_module("fc", nn::Linear(kHidden, vocabulary));
  }
  torch::Tensor forward(torch::Tensor ids) override {
    const torch::Tensor outputs = std::get<0>(lstm_(embedding_(ids)));  // [B, T, hidden]
    return fc_(outputs.select(1, -1));
  }

 private:
  static constexpr std::int64_t kEmbedding = 64;
  static constexpr std::int64_t kHidden = 256;
  nn::Embedding embedding_{nullptr};
  nn::LSTM lstm_{nullptr};
  nn::Linear fc_{nullptr};
};

// GPT-2's block layout: x + attention(LN(x)), then x + MLP(LN(x)), with a
// causal mask (a position attends to itself and the ones before it).
class CausalBlock final : public nn::Module {
 public:
  CausalBlock(std::int64_t width, std::int64_t heads) : heads_(heads) {
    norm1_ = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({width})));
    qkv_ = register_module("qkv", nn::Linear(width, 3 * width));
    proj_ = register_module("proj", nn::Linear(width, width));
    norm2_ = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({width})));
    fc1_ = register_module("fc1", nn::Linear(width, 4 * width));
    fc2_ = register_module("fc2", nn::Linear(4 * width, width));
  }
  // x [B, T, width]; future [T, T] bool, true above the diagonal.
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& future) {
    const std::int64_t b = x.size(0), t = x.size(1), width = x.size(2);
    const std::int64_t head = width / heads_;
    const torch::Tensor qkv =
        qkv_(norm1_(x)).view({b, t, 3, heads_, head}).permute({2, 0, 3, 1, 4});
    const torch::Tensor q = qkv[0], k = qkv[1], v = qkv[2];  // [B, heads, T, head]
    torch::Tensor attention = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head));
    attention = attention.masked_fill(future, -std::numeric_limits<float>::infinity()).softmax(-1);
    const torch::Tensor mixed = attention.matmul(v).transpose(1, 2).reshape({b, t, width});
    x = x + proj_(mixed);
    return x + fc2_(torch::gelu(fc1_(norm2_(x))));
  }

 private:
  std::int64_t heads_;
  nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};

// Four causal blocks of `width` with heads of 32, the output layer tied to
// the token embedding: width 128 is char-transformer (814 K parameters at
// the fortunes vocabulary), 64 and 256 the size ladder's w64 and w256
// (0.21 M and 3.2 M).
class CharTransformer final : public Model {
 public:
  CharTransformer(std::int64_t vocabulary, std::int64_t width) {
    token_ = register_module("token", nn::Embedding(vocabulary, width));
    position_ = register_module("position", nn::Embedding(kMaxWindow, width));
    for (int i = 0; i < kBlocks; ++i) {
      blocks_.push_back(register_module(fmt::format("block{}", i),
                                        std::make_shared<CausalBlock>(width, width / kHeadWidth)));
    }
    norm_ = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({width})));
    // Small embeddings (GPT-2's 0.02): the tied output layer then starts
    // with logits near zero instead of N(0, width).
    torch::NoGradGuard no_grad;
    token_->weight.normal_(0.0, 0.02);
    position_->weight.normal_(0.0, 0.02);
  }
  torch::Tensor forward(torch::Tensor ids) override { return logits(ids).select(1, -1); }
  bool ties_output_to_embedding() const override { return true; }
  Scores score(const torch::Tensor& ids, const torch::Tensor& labels) override {
    const torch::Tensor all = logits(ids);  // [B, T, V]
    const std::int64_t b = ids.size(0), t = ids.size(1);
    const torch::Tensor targets = torch::cat({ids.narrow(1, 1, t - 1), labels.unsqueeze(1)}, 1);
    const torch::Tensor losses = torch::nn::functional::cross_entropy(
        all.reshape({b * t, -1}), targets.reshape({b * t}),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    return {all.select(1, -1), losses.view({b, t}).mean(1)};
  }

 private:
  static constexpr std::int64_t kHeadWidth = 32;
  static constexpr int kBlocks = 4;
  static constexpr std::int64_t kMaxWindow = 64;

  // ids [B, T] -> logits [B, T, V] of each position's next character.
  torch::Tensor logits(const torch::Tensor& ids) {
    const std::int64_t t = ids.size(1);
    if (t > kMaxWindow) {
      throw InvalidArgument(
          fmt::format("[char-transformer] windows of {} characters: the model has positions for {}",
                      t, kMaxWindow));
    }
    torch::Tensor x = token_(ids) + position_(torch::arange(t, torch::kInt64));
    const torch::Tensor future = torch::ones({t, t}, torch::kBool).triu(1);
    for (const auto& block : blocks_) x = block->forward(x, future);
    return norm_(x).matmul(token_->weight.t());
  }

  nn::Embedding token_{nullptr}, position_{nullptr};
  std::vector<std::shared_ptr<CausalBlock>> blocks_;
  nn::LayerNorm norm_{nullptr};
};

}  // namespace

Model::Scores Model::score(const torch::Tensor& inputs, const torch::Tensor& labels) {
  torch::Tensor logits = forward(inputs);
  torch::Tensor losses = torch::nn::functional::cross_entropy(
      logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  return {std::move(logits), std::move(losses)};
}

std::shared_ptr<Model> make_model(std::string_view name, std::int64_t classes) {
  if (name == "mlp") return std::make_shared<Mlp>(std::vector<std::int64_t>{256, 128}, classes);
  if (name == "cnn") return std::make_shared<Cnn>(classes);
  if (name == "resnet18") return std::make_shared<ResNet18>(classes);
  if (name == "wide-mlp") return std::make_shared<Mlp>(std::vector<std::int64_t>(5, 2048), classes);
  if (name == "char-lstm") return std::make_shared<CharLstm>(classes);
  if (name == "char-transformer") return std::make_shared<CharTransformer>(classes, 128);
  if (name == "char-transformer-w64") return std::make_shared<CharTransformer>(classes, 64);
  if (name == "char-transformer-w256") return std::make_shared<CharTransformer>(classes, 256);
  if (model_reads_clicks(std::string(name))) {
    throw InvalidArgument(fmt::format(
        "model {} is the click model: its embedding tables are not a Model's flat parameters, so "
        "the click trainer builds it (train/click_model.h); make_model builds the image and text "
        "models",
        name));
  }
  throw InvalidArgument(
      fmt::format("unknown model '{}'; valid: {}", name, fmt::join(model_names(), ", ")));
}

}  // namespace sparsecomm

namespace sparsecomm {

std::vector<MatrixBlock> hidden_matrices(torch::nn::Module& module,
                                         std::span<const LayerSpan> layers, bool tied_output) {
  std::vector<std::string> ends;  // parameters AdamW steps: embeddings, the output layer
  std::string last_linear;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    if (item.value()->as<torch::nn::Embedding>() != nullptr ||
        item.value()->as<torch::nn::EmbeddingBag>() != nullptr) {
      ends.push_back(item.key() + ".");
    }
    if (item.value()->as<torch::nn::Linear>() != nullptr) last_linear = item.key();
  }
  if (!tied_output && !last_linear.empty()) ends.push_back(last_linear + ".");
  std::vector<MatrixBlock> matrices;
  for (const LayerSpan& layer : layers) {
    if (layer.rows == 0 || layer.rows == layer.size) continue;  // vectors
    const bool at_an_end = std::any_of(ends.begin(), ends.end(), [&](const std::string& prefix) {
      return layer.name.rfind(prefix, 0) == 0;
    });
    if (!at_an_end) matrices.push_back({layer.offset, layer.rows, layer.size / layer.rows});
  }
  return matrices;
}

}  // namespace sparsecomm
