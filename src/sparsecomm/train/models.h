#pragma once
// The models `sparsecomm train` knows, for 1x28x28 images and 10 classes.
// (LibTorch.)
//
//   mlp       784-256-128-10, ReLU                         ~235 k parameters
//   cnn       conv3x3(32)-pool-conv3x3(64)-pool-fc128-fc10  ~422 k
//   resnet18  ResNet-18 (BasicBlocks 2-2-2-2, 64..512) with a 3x3 stem,
//             no max-pool, for 28x28 inputs; BatchNorm       ~11.2 M
//   wide-mlp  784-2048x5-10: cheap to compute, expensive      ~18.4 M
//             to synchronize (the stress case); five equal
//             16 MiB layers, so buckets can pipeline it

#include <memory>
#include <string_view>

#include <torch/torch.h>

namespace sparsecomm {

class ImageModel : public torch::nn::Module {
 public:
  // images [B, 1, 28, 28] -> logits [B, 10]
  virtual torch::Tensor forward(torch::Tensor images) = 0;
};

// Builds `name` (see model_names() in train_config.h) with LibTorch's
// default initialization drawn from the current global generator: seed it
// (torch::manual_seed) first, and build one model at a time per process.
// InvalidArgument for an unknown name.
std::shared_ptr<ImageModel> make_model(std::string_view name);

}  // namespace sparsecomm
