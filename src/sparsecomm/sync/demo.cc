#include "sparsecomm/sync/demo.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <numbers>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/memory.h"

// One rank's message, the same size on every rank and every step:
//   [the values of every chunk's entries, chunk after chunk, encoded with
//    `values` as one run (encoded_value_bytes of chunks x topk values)]
//   [their positions inside their chunks, in the same order, packed at
//    bit_width(chunk - 1) bits each (6 for chunks of 64), least significant
//    bit first; the last byte's unused bits are 0]
// A chunk shorter than topk sends all of its coefficients.

namespace sparsecomm {
namespace {

constexpr std::string_view kDemo = "demo";
constexpr std::int64_t kMaxChunk = 4096;

struct Chunk {
  std::size_t begin = 0;
  std::size_t length = 0;
  std::size_t entries = 0;   // min(topk, length)
  std::size_t entry_at = 0;  // its first entry in the message
};

}  // namespace

DctBasis::DctBasis(std::size_t length)
    : length_(length), table_(length * length), columns_(length * length) {
  const double n = static_cast<double>(length);
  for (std::size_t k = 0; k < length; ++k) {
    const double scale = std::sqrt((k == 0 ? 1.0 : 2.0) / n);
    for (std::size_t j = 0; j < length; ++j) {
      const auto value =
          static_cast<float>(scale * std::cos(std::numbers::pi * (static_cast<double>(j) + 0.5) *
                                              static_cast<double>(k) / n));
      table_[k * length + j] = value;
      columns_[j * length + k] = value;
    }
  }
}

// out = sum_j x[j] C[., j]: one a * x + y pass per input element over a
// column of C, which the compiler vectorizes (a dot product per output
// would be a reduction, which it may not reorder).
void DctBasis::forward(std::span<const float> x, std::span<float> out) const {
  std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(length_), 0.0f);
  for (std::size_t j = 0; j < length_; ++j) {
    const float xj = x[j];
    const float* column = columns_.data() + j * length_;
    for (std::size_t k = 0; k < length_; ++k) out[k] += xj * column[k];
  }
}

namespace {

class DeMo final : public GradientSync {
 public:
  DeMo(const SchemeOptions& options, NonFinitePolicy policy) : policy_(policy) {
    options.check_known(kDemo, demo_option_specs());
    chunk_ = static_cast<std::size_t>(options.integer(
        kDemo, "chunk", static_cast<std::int64_t>(kDemoDefaultChunk), 2, kMaxChunk));
    topk_ = static_cast<std::size_t>(options.integer(kDemo, "topk",
                                                     static_cast<std::int64_t>(kDemoDefaultTopk), 1,
                                                     static_cast<std::int64_t>(chunk_)));
    beta_ = options.number(kDemo, "momentum", 0.9, 0.0, 1.0, false);
    if (!(beta_ < 1.0)) {
      throw InvalidArgument(
          "[demo] option momentum=1 would keep every gradient forever; give a value in [0, 1)");
    }
    values_ = parse_value_encoding(options.choice(kDemo, "values", "fp32", value_encoding_names()));
    sign_ = options.flag(kDemo, "sign", true);
  }

  std::string_view method() const override { return kDemo; }
  // Its momentum replaces the optimizer's, and with sign=true its output
  // is a direction of +-1: SGD without momentum applies it.
  bool applies_momentum() const override { return true; }

  std::span<const float> kept() const override {
    kept_.assign(momentum_.size(), 0.0f);
    for (const Chunk& c : chunks_) {
      const DctBasis& basis = basis_for(c.length);
      float* out = kept_.data() + c.begin;
      for (std::size_t k = 0; k < c.length; ++k) {
        const float coefficient = momentum_[c.begin + k];
        if (coefficient == 0.0f) continue;
        const std::span<const float> row = basis.row(k);
        for (std::size_t j = 0; j < c.length; ++j) out[j] += coefficient * row[j];
      }
    }
    return kept_;
  }

  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override {
    StepMetrics m;
    if (!begin_finite_step(gradient, ctx, comm, policy_, finite_flags_, m)) return m;
    plan(gradient.size(), ctx.layers);
    m.gradient_norm = std::sqrt(sum_of_squares(gradient));

    // M = beta M + DCT(g), chunk by chunk.
    Stopwatch watch;
    const auto beta = static_cast<float>(beta_);
    for (const Chunk& c : chunks_) {
      basis_for(c.length).forward(gradient.subspan(c.begin, c.length),
                                  std::span<float>(coefficients_).first(c.length));
      float* mc = momentum_.data() + c.begin;
      for (std::size_t k = 0; k < c.length; ++k) mc[k] = beta * mc[k] + coefficients_[k];
    }
    m.accumulate_s = watch.seconds();

    // Each chunk's topk largest |M| (ties: the lower position), encoded;
    // what the receivers will decode leaves M.
    watch.restart();
    for (const Chunk& c : chunks_) select_chunk(c);
    const std::size_t value_bytes = encoded_value_bytes(values_, entries_);
    std::span<std::byte> mine(message_);
    encode_values(std::span<float>(sent_values_), values_, mine.first(value_bytes),
                  static_cast<std::uint64_t>(ctx.step) * static_cast<std::uint64_t>(ctx.world) +
                      static_cast<std::uint64_t>(comm.rank()));
    write_positions(mine.subspan(value_bytes));
    for (const Chunk& c : chunks_) {
      for (std::size_t e = c.entry_at; e < c.entry_at + c.entries; ++e) {
        momentum_[c.begin + sent_positions_[e]] -= sent_values_[e];
      }
    }
    m.selection_s = watch.seconds();

    // Every rank's message.
    watch.restart();
    const auto n = static_cast<std::size_t>(comm.size());
    gathered_.resize(message_.size() * n);
    comm.allgather(message_, gathered_);
    const std::uint64_t moved = static_cast<std::uint64_t>(message_.size()) * (n - 1);
    m.bytes_sent = moved;
    m.bytes_received = moved;
    m.exchange_s = watch.seconds() + m.agreement_s;

    // A = the mean of the sent coefficients (summed in rank order, the same
    // bits on every rank), then IDCT, then the sign.
    watch.restart();
    std::fill(average_.begin(), average_.end(), 0.0f);
    for (std::size_t r = 0; r < n; ++r) {
      const std::span<const std::byte> message =
          std::span<const std::byte>(gathered_).subspan(r * message_.size(), message_.size());
      decode_values(message.first(value_bytes), values_, std::span<float>(received_values_));
      read_positions(message.subspan(value_bytes), static_cast<int>(r));
      for (const Chunk& c : chunks_) {
        for (std::size_t e = c.entry_at; e < c.entry_at + c.entries; ++e) {
          average_[c.begin + received_positions_[e]] += received_values_[e];
        }
      }
    }
    const float inverse_n = 1.0f / static_cast<float>(n);
    std::size_t union_size = 0;
    for (const Chunk& c : chunks_) {
      const DctBasis& basis = basis_for(c.length);
      float* out = gradient.data() + c.begin;
      std::fill(out, out + c.length, 0.0f);
      for (std::size_t k = 0; k < c.length; ++k) {
        const float coefficient = average_[c.begin + k] * inverse_n;
        if (coefficient == 0.0f) continue;
        ++union_size;
        const std::span<const float> row = basis.row(k);
        for (std::size_t j = 0; j < c.length; ++j) out[j] += coefficient * row[j];
      }
      if (sign_) {
        for (std::size_t j = 0; j < c.length; ++j) {
          out[j] = out[j] > 0.0f ? 1.0f : (out[j] < 0.0f ? -1.0f : 0.0f);
        }
      }
    }
    m.selection_s += watch.seconds();

    m.selected = m.target = entries_;
    m.union_size = union_size;
    m.density_ratio =
        entries_ == 0 ? 0.0 : static_cast<double>(union_size) / static_cast<double>(entries_);
    m.index_bytes_raw = m.index_bytes_encoded = position_bytes();
    m.value_bits = wire_bits_per_value(values_);
    m.residual_norm = std::sqrt(sum_of_squares(momentum_));
    return m;
  }

  void save(StateWriter& writer) const override {
    writer.tag(kDemo);
    writer.value<std::uint64_t>(chunk_);
    writer.array<float>(momentum_);
  }

  void load(StateReader& reader) override {
    reader.expect_tag(kDemo);
    const auto chunk = reader.value<std::uint64_t>();
    if (chunk != chunk_) {
      throw Error(fmt::format(
          "[demo] the state was saved with chunk={}, this run has chunk={}: the momentum is kept "
          "in the chunks' DCT basis and does not carry over",
          chunk, chunk_));
    }
    momentum_ = reader.array<float>();
    loaded_ = true;
    planned_ = false;  // plan() checks the size against the gradient on the next step
  }

 private:
  std::size_t position_bits() const { return static_cast<std::size_t>(std::bit_width(chunk_ - 1)); }
  // Bytes of all the positions of one message.
  std::size_t position_bytes() const { return (entries_ * position_bits() + 7) / 8; }

  const DctBasis& basis_for(std::size_t length) const {
    for (const DctBasis& basis : bases_) {
      if (basis.length() == length) return basis;
    }
    throw Error(fmt::format("[demo] no DCT basis of length {} was planned", length));
  }

  // The chunks of every layer (and of the gaps between them), once, or
  // again when the gradient's length changes.
  void plan(std::size_t numel, std::span<const LayerSpan> layers) {
    if (planned_ && numel == numel_) return;
    chunks_.clear();
    std::size_t entries = 0;
    for_each_demo_chunk(numel, layers, chunk_, [&](std::size_t at, std::size_t length) {
      const std::size_t count = std::min(topk_, length);
      chunks_.push_back({at, length, count, entries});
      entries += count;
      if (std::none_of(bases_.begin(), bases_.end(),
                       [&](const DctBasis& b) { return b.length() == length; })) {
        bases_.emplace_back(length);
      }
    });
    entries_ = entries;
    std::size_t longest = 0;
    for (const Chunk& c : chunks_) longest = std::max(longest, c.length);
    coefficients_.assign(longest, 0.0f);
    order_.resize(longest);
    sent_values_.assign(entries, 0.0f);
    received_values_.assign(entries, 0.0f);
    sent_positions_.assign(entries, 0);
    received_positions_.assign(entries, 0);
    message_.assign(encoded_value_bytes(values_, entries) + position_bytes(), std::byte{0});
    average_.assign(numel, 0.0f);
    if (loaded_) {
      if (momentum_.size() != numel) {
        throw Error(fmt::format(
            "[demo] the saved momentum holds {} values, this model's gradient {}: the state is "
            "of another model",
            momentum_.size(), numel));
      }
      loaded_ = false;
    } else {
      momentum_.assign(numel, 0.0f);
    }
    numel_ = numel;
    planned_ = true;
  }

  void select_chunk(const Chunk& c) {
    const float* mc = momentum_.data() + c.begin;
    const auto first = order_.begin();
    const auto last = first + static_cast<std::ptrdiff_t>(c.length);
    for (std::size_t k = 0; k < c.length; ++k) order_[k] = static_cast<std::uint32_t>(k);
    const auto larger = [mc](std::uint32_t a, std::uint32_t b) {
      const float x = std::fabs(mc[a]);
      const float y = std::fabs(mc[b]);
      return x > y || (x == y && a < b);
    };
    const auto chosen = first + static_cast<std::ptrdiff_t>(c.entries);
    if (chosen < last) std::nth_element(first, chosen - 1, last, larger);
    std::sort(first, chosen);  // ascending positions: the same bytes for the same selection
    for (std::size_t e = 0; e < c.entries; ++e) {
      sent_positions_[c.entry_at + e] = order_[e];
      sent_values_[c.entry_at + e] = mc[order_[e]];
    }
  }

  void write_positions(std::span<std::byte> out) const {
    const std::size_t width = position_bits();
    std::fill(out.begin(), out.end(), std::byte{0});
    for (std::size_t e = 0; e < entries_; ++e) {
      const std::uint32_t p = sent_positions_[e];
      for (std::size_t b = 0; b < width; ++b) {
        if (((p >> b) & 1u) != 0) {
          const std::size_t bit = e * width + b;
          out[bit / 8] |= static_cast<std::byte>(1u << (bit % 8));
        }
      }
    }
  }

  // CommError for a position outside its chunk (a malformed message).
  void read_positions(std::span<const std::byte> in, int from) {
    const std::size_t width = position_bits();
    for (const Chunk& c : chunks_) {
      for (std::size_t e = c.entry_at; e < c.entry_at + c.entries; ++e) {
        std::uint32_t p = 0;
        for (std::size_t b = 0; b < width; ++b) {
          const std::size_t bit = e * width + b;
          p |= ((std::to_integer<std::uint32_t>(in[bit / 8]) >> (bit % 8)) & 1u) << b;
        }
        if (p >= c.length) {
          throw CommError(fmt::format(
              "[demo] rank {} sent position {} for a chunk of {} coefficients", from, p, c.length));
        }
        received_positions_[e] = p;
      }
    }
  }

  NonFinitePolicy policy_;
  std::size_t chunk_ = 64;
  std::size_t topk_ = 1;
  double beta_ = 0.9;
  ValueEncoding values_ = ValueEncoding::kFloat32;
  bool sign_ = true;

  bool planned_ = false;
  bool loaded_ = false;
  std::size_t numel_ = 0;
  std::size_t entries_ = 0;
  std::vector<Chunk> chunks_;
  std::vector<DctBasis> bases_;  // one per distinct chunk length
  std::vector<float> momentum_;  // M, in each chunk's DCT basis
  std::vector<float> coefficients_;
  std::vector<std::uint32_t> order_;
  std::vector<float> sent_values_;  // decoded: what the receivers see
  std::vector<std::uint32_t> sent_positions_;
  std::vector<float> received_values_;
  std::vector<std::uint32_t> received_positions_;
  std::vector<std::byte> message_;
  std::vector<std::byte> gathered_;
  std::vector<float> average_;  // the sum of the sent coefficients, by position
  mutable std::vector<float> kept_;
  std::vector<std::uint8_t> finite_flags_;
};

}  // namespace

std::vector<OptionSpec> demo_option_specs() {
  return {
      {"chunk", std::to_string(kDemoDefaultChunk),
       "length of the chunks each tensor is cut into, each sent in its DCT basis "
       "(2-4096)"},
      {"topk", std::to_string(kDemoDefaultTopk),
       "coefficients each chunk sends per step (1-chunk)"},
      {"momentum", "0.9",
       "beta of each rank's own momentum M = beta M + DCT(g), in [0, 1) (DeMo's paper: 0.999)"},
      {"values", "fp32", "codec of the sent coefficients (fp16, bf16, int8, lloyd2, ...)"},
      {"sign", "true", "apply the sign of the mean (DeMo); false: the mean itself"},
  };
}

void for_each_demo_chunk(std::size_t numel, std::span<const LayerSpan> layers, std::size_t chunk,
                         const std::function<void(std::size_t, std::size_t)>& visit) {
  for_each_layer_and_gap("[demo]", numel, layers,
                         [&](std::size_t begin, std::size_t end, const LayerSpan*) {
                           for (std::size_t at = begin; at < end; at += chunk) {
                             visit(at, std::min(chunk, end - at));
                           }
                         });
}

std::size_t demo_message_bytes(std::size_t numel, std::span<const LayerSpan> layers,
                               std::size_t chunk, std::size_t topk, ValueEncoding values) {
  std::size_t entries = 0;
  for_each_demo_chunk(numel, layers, chunk,
                      [&](std::size_t, std::size_t length) { entries += std::min(topk, length); });
  const auto position_bits = static_cast<std::size_t>(std::bit_width(chunk - 1));
  return encoded_value_bytes(values, entries) + (entries * position_bits + 7) / 8;
}

std::unique_ptr<GradientSync> make_demo(const SchemeOptions& options, NonFinitePolicy nonfinite) {
  return std::make_unique<DeMo>(options, nonfinite);
}

}  // namespace sparsecomm
