// The dense quantizers: every coordinate every step, compressed by the
// value codec alone (collectives/value_codec.h). The selection is one known range
// [0, d), so no index is computed or sent, and the default "shared"
// pattern encodes the d values once and all-gathers them (or, in worlds
// where that moves more bytes than a float32 ring, all-reduces the decoded
// values; docs/algorithms.md, "Wire encodings").
//
//  - qsgd: QSGD (Alistarh et al., NeurIPS 2017) with the max-norm scaling of
//    its experiments, per block of 128: unbiased stochastic rounding to 127
//    levels each side (values=int8-sr; int4-sr and int2-sr for 7 and 1).
//    No memory by default: the estimate is unbiased.
//  - terngrad: TernGrad (Wen et al., NeurIPS 2017): {-1, 0, 1} times the
//    block's largest magnitude, stochastically (int2-sr, 2.25 bits a value).
//  - signsgd: scaled sign with error feedback (EF-signSGD, Karimireddy et
//    al., ICML 2019; 1-bit SGD, Seide et al. 2014): the signs and each
//    block's mean magnitude (sign, 1.25 bits a value); the memory keeps
//    what the sign did not carry.
//  - natural: natural compression (Horvath et al., 2019): every value
//    rounded stochastically to a power of two next to it, unbiased (nat,
//    8.25 bits a value). No memory by default.

#include <memory>
#include <string>
#include <string_view>

#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm::schemes {
namespace {

class EveryCoordinate final : public DensitySparsifier {
 public:
  explicit EveryCoordinate(std::string_view name) : DensitySparsifier(1.0), name_(name) {}

  std::string_view name() const override { return name_; }

  void select(std::span<const float> accumulated, const StepContext&, Communicator&,
              SparseSelection& out) override {
    out.clear();
    read_nothing();  // the exchange reads the values
    if (!accumulated.empty()) out.known.push_back(Range{0, accumulated.size()});
  }

 private:
  std::string name_;
};

template <const char* kName>
void build_every_coordinate(const SchemeOptions&, const CommonOptions&, SchemeParts& parts) {
  parts.sparsifier = std::make_unique<EveryCoordinate>(kName);
}

constexpr char kQsgd[] = "qsgd";
constexpr char kTernGrad[] = "terngrad";
constexpr char kSignSgd[] = "signsgd";
constexpr char kNatural[] = "natural";

SchemeTraits quantizer_traits(ValueEncoding values) {
  return {.selection = SchemeTraits::Selection::kShared,
          .every_coordinate = true,
          .default_values = values};
}

}  // namespace

SchemeDefinition qsgd_definition() {
  return {.name = kQsgd,
          .summary =
              "QSGD: every coordinate, unbiased stochastic rounding to 127 levels of each "
              "128-block's largest magnitude (values=int8-sr; int4-sr, int2-sr)",
          .traits = quantizer_traits(ValueEncoding::kInt8Stochastic),
          .memories = {"none", "ef", "ef21"},
          .build = build_every_coordinate<kQsgd>};
}

SchemeDefinition terngrad_definition() {
  return {.name = kTernGrad,
          .summary =
              "TernGrad: every coordinate as -1, 0 or 1 times its 128-block's largest "
              "magnitude, unbiased (values=int2-sr)",
          .traits = quantizer_traits(ValueEncoding::kInt2Stochastic),
          .memories = {"none", "ef", "ef21"},
          .build = build_every_coordinate<kTernGrad>};
}

SchemeDefinition signsgd_definition() {
  return {.name = kSignSgd,
          .summary =
              "EF-signSGD: every coordinate's sign times its 128-block's mean magnitude, "
              "with error feedback (values=sign)",
          .traits = quantizer_traits(ValueEncoding::kSign),
          .memories = {"ef", "none", "ef21"},
          .build = build_every_coordinate<kSignSgd>};
}

SchemeDefinition natural_definition() {
  return {.name = kNatural,
          .summary =
              "natural compression: every coordinate rounded to a power of two next to it, "
              "unbiased, 8 bits each (values=nat)",
          .traits = quantizer_traits(ValueEncoding::kNatural),
          .memories = {"none", "ef", "ef21"},
          .build = build_every_coordinate<kNatural>};
}

}  // namespace sparsecomm::schemes
