#pragma once
// DeMo, decoupled momentum (Peng, Quesnelle and Kingma, 2024): every rank
// keeps its own momentum of its own gradients, sends only the largest
// components of it in a DCT basis, keeps the rest, and the ranks step on the
// sign of the mean of what was sent (docs/algorithms.md, "DeMo").
//
// Per step, on every tensor cut into chunks of `chunk` consecutive elements
// (a tensor's last chunk may be shorter; elements outside every layer form
// chunks of their own):
//
//   M  = beta M + DCT(g)         this rank's momentum, kept in the DCT basis
//   S  = the `topk` largest |M| of each chunk: (position in chunk, value)
//   M -= decoded(S)              what was sent leaves the momentum (exact)
//   every rank's S is all-gathered (fixed size: chunks x topk entries)
//   A  = (sum over ranks of S) / n, per coefficient
//   the gradient becomes sign(IDCT(A))   (sign=false: IDCT(A) itself)
//
// The DCT is the orthonormal DCT-II of each chunk, so ||M|| is the norm of
// the momentum in the parameters' basis, and IDCT(M) is what is kept.
// The method applies momentum itself, and its output is a direction, not a
// gradient: the optimizer must be SGD without momentum (the trainers run
// it so and refuse AdamW; applies_momentum() says so).

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sync/gradient_sync_interface.h"
#include "sparsecomm/sync/sparsify_sequence.h"

namespace sparsecomm {

// The orthonormal DCT-II of length `length`: row k holds basis vector k,
// C[k][j] = a_k cos(pi (j + 1/2) k / length), a_0 = sqrt(1/length), else
// sqrt(2/length). forward: c = C x; inverse: x = C^T c.
class DctBasis {
 public:
  explicit DctBasis(std::size_t length);
  std::size_t length() const { return length_; }
  std::span<const float> row(std::size_t k) const {
    return std::span<const float>(table_).subspan(k * length_, length_);
  }
  // out[k] = sum_j C[k][j] x[j]; x and out of length(), not overlapping.
  void forward(std::span<const float> x, std::span<float> out) const;

 private:
  std::size_t length_;
  std::vector<float> table_;    // C, length x length, row-major
  std::vector<float> columns_;  // C transposed (forward reads C's columns)
};

// DeMo's defaults (-o chunk, -o topk), which `plan` prices.
constexpr std::size_t kDemoDefaultChunk = 64;
constexpr std::size_t kDemoDefaultTopk = 1;

// The chunks DeMo cuts a gradient of `numel` elements into: every layer,
// and every gap before, between and after the layers, in pieces of `chunk`
// (each one's last shorter), visited as (begin, length) in order.
// InvalidArgument for a layer out of order or outside the gradient.
void for_each_demo_chunk(std::size_t numel, std::span<const LayerSpan> layers, std::size_t chunk,
                         const std::function<void(std::size_t, std::size_t)>& visit);

// One rank's message: min(topk, length) coefficients of every chunk in
// `values`, then their positions at bit_width(chunk - 1) bits each. Every
// rank receives n - 1 of them a step (an all-gather): `plan` prices it so.
std::size_t demo_message_bytes(std::size_t numel, std::span<const LayerSpan> layers,
                               std::size_t chunk, std::size_t topk, ValueEncoding values);

// The options `sparsecomm methods` lists for demo.
std::vector<OptionSpec> demo_option_specs();

std::unique_ptr<GradientSync> make_demo(const SchemeOptions& options, NonFinitePolicy nonfinite);

}  // namespace sparsecomm
