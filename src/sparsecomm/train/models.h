#pragma once
// The models `sparsecomm train` knows (LibTorch). Image models read
// [B, 1, 28, 28] floats; char-lstm reads [B, T] int64 character ids (any T).
// Each gives logits over `classes` (10 for images, the character vocabulary
// of src/sparsecomm/data/text_corpus.h for text); counts below are for those.
//
//   mlp       784-256-128-10, ReLU                         ~235 k parameters
//   cnn       conv3x3(32)-pool-conv3x3(64)-pool-fc128-fc10  ~422 k
//   resnet18  ResNet-18 (BasicBlocks 2-2-2-2, 64..512) with a 3x3 stem,
//             no max-pool, for 28x28 inputs; BatchNorm       ~11.2 M
//   wide-mlp  784-2048x5-10: cheap to compute, expensive      ~18.4 M
//             to synchronize (the stress case); five equal
//             16 MiB layers, so buckets can pipeline it
//   char-lstm embedding(97, 64)-LSTM(256)-fc97 on the last    ~361 k
//             step: next-character prediction
//   char-transformer  a causal transformer language model:    ~0.8 M
//             4 pre-LayerNorm blocks of width 128 (4 heads,
//             MLP 512), learned positions, output tied to the
//             token embedding; trained on the next character at
//             every position of the window

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/optim/optimizer.h"

namespace sparsecomm {

class Model : public torch::nn::Module {
 public:
  // inputs [B, ...] (images or ids, as above) -> logits [B, classes]
  virtual torch::Tensor forward(torch::Tensor inputs) = 0;

  struct Scores {
    torch::Tensor logits;  // [B, classes]: forward(inputs), for accuracy
    torch::Tensor losses;  // [B]: each sample's loss (training minimizes the mean)
  };
  // By default the cross-entropy of forward's logits against `labels`. A
  // language model's sample loss is the mean over every position of the
  // window of the loss of the character after it (the window's own next
  // character, then the label), so that one sample trains T predictions.
  virtual Scores score(const torch::Tensor& inputs, const torch::Tensor& labels);

  // Whether the output layer is the input embedding (weight tying): then
  // the last linear layer is a hidden one (hidden_matrices below).
  virtual bool ties_output_to_embedding() const { return false; }
};

// Builds `name` (see model_names() in train_config.h) for `classes` classes
// (dataset_classes() there) with LibTorch's default initialization drawn from
// the current global generator: seed it (torch::manual_seed) first, and build
// one model at a time per process. InvalidArgument for an unknown name.
std::shared_ptr<Model> make_model(std::string_view name, std::int64_t classes);

// The matrices Muon orthogonalizes (optim/muon.h), at their offsets in the
// flat vector of `layers` (DataParallel's, named as module's parameters):
// the weights of every linear, convolution and recurrent layer, as rows
// (the first dimension) x the rest, except the model's two ends, which
// AdamW steps: embedding tables and the last linear layer (unless
// `tied_output`: then the output is an embedding table).
std::vector<MatrixBlock> hidden_matrices(torch::nn::Module& module,
                                         std::span<const LayerSpan> layers, bool tied_output);

}  // namespace sparsecomm
