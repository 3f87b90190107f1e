#include "sparsecomm/data/click_log.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

// Counter tags (the second counter word's top 16 bits), so no two kinds
// of draw share a counter.
constexpr std::uint64_t kIdTag = 1;
constexpr std::uint64_t kDenseTag = 2;
constexpr std::uint64_t kLabelTag = 3;
constexpr std::uint64_t kEmbeddingTag = 4;
constexpr std::uint64_t kPermutationTag = 5;
constexpr std::uint64_t kDenseWeightTag = 6;
constexpr std::size_t kMaxLatent = 64;

std::uint64_t counter(std::uint64_t tag, std::uint64_t field, std::uint64_t index) {
  return tag << 48 | field << 24 | index;
}

double unit(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1p-53; }

// Two standard normals from one Philox block (Box-Muller).
std::pair<double, double> normals(const Philox::Block& b) {
  const double u1 = (static_cast<double>(b[0]) + 0.5) * 0x1p-32;
  const double u2 = static_cast<double>(b[1]) * 0x1p-32;
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  return {radius * std::cos(angle), radius * std::sin(angle)};
}

// log1p(x) / x and expm1(x) / x, continuous at 0.
double log1p_over(double x) {
  return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x / 2.0 + x * x / 3.0;
}
double expm1_over(double x) {
  return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x / 2.0 + x * x / 6.0;
}

// Zipf by rejection-inversion (Hörmann and Derflinger, ACM TOMACS 1996):
// invert the integral H of the hat h(x) = x^-s, round to the nearest
// integer k and accept unless the point falls in the gap between the hat
// and the step function around k. Expected draws per sample are close to 1.
struct ZipfShape {
  double s;
  double h(double x) const { return std::exp(-s * std::log(x)); }
  double big_h(double x) const {  // (x^(1-s) - 1) / (1 - s), log x at s = 1
    const double log_x = std::log(x);
    return expm1_over((1.0 - s) * log_x) * log_x;
  }
  double big_h_inverse(double y) const { return std::exp(log1p_over((1.0 - s) * y) * y); }
};

}  // namespace

std::vector<std::size_t> criteo_cardinalities(std::size_t cap) {
  // The Kaggle set's categorical fields C1..C26.
  const std::vector<std::size_t> criteo{1460,  583,     10131227, 2202608, 305,     24,   12517,
                                        633,   3,       93145,    5683,    8351593, 3194, 27,
                                        14992, 5461306, 10,       5652,    2173,    4,    7046547,
                                        18,    15,      286181,   105,     142572};
  std::vector<std::size_t> out;
  for (const std::size_t n : criteo) out.push_back(std::min(n, cap));
  return out;
}

double binary_entropy(double p) {
  if (p <= 0.0 || p >= 1.0) return 0.0;
  return -p * std::log(p) - (1.0 - p) * std::log1p(-p);
}

ClickLog::ClickLog(ClickLogOptions options)
    : options_(std::move(options)),
      rows_(options_.seed),
      parameters_(options_.seed ^ 0x5DEECE66DULL << 20) {
  if (options_.cardinalities.empty()) {
    throw InvalidArgument("[click-log] at least one categorical field is needed");
  }
  for (std::size_t f = 0; f < options_.cardinalities.size(); ++f) {
    const std::size_t n = options_.cardinalities[f];
    if (n < 1 || n > (std::size_t{1} << 32)) {
      throw InvalidArgument(
          fmt::format("[click-log] field {} has {} IDs; a field has 1 to 2^32 (32-bit IDs)", f, n));
    }
  }
  if (!(options_.zipf_exponent > 0.0) || !std::isfinite(options_.zipf_exponent)) {
    throw InvalidArgument(
        fmt::format("[click-log] the Zipf exponent must be > 0, got {}", options_.zipf_exponent));
  }
  if (options_.latent_dim < 1 || options_.latent_dim > kMaxLatent) {
    throw InvalidArgument(fmt::format("[click-log] latent_dim must be 1 to {}, got {}", kMaxLatent,
                                      options_.latent_dim));
  }
  if (options_.rows < 1) throw InvalidArgument("[click-log] the log needs at least 1 row");
  if (fields() >= (std::size_t{1} << 24) || options_.dense_features >= (std::size_t{1} << 24)) {
    throw InvalidArgument("[click-log] at most 2^24 fields and numeric features");
  }

  const ZipfShape zipf{options_.zipf_exponent};
  for (std::size_t f = 0; f < fields(); ++f) {
    Field field;
    field.ids = options_.cardinalities[f];
    const auto n = static_cast<std::uint64_t>(field.ids);
    // An affine permutation of [0, n): a multiplier coprime to n.
    field.multiplier = n == 1 ? 1 : parameters_.below(n - 1, f, counter(kPermutationTag, 0, 0)) + 1;
    while (std::gcd(field.multiplier, n) != 1) field.multiplier = field.multiplier % (n - 1) + 1;
    field.offset = parameters_.below(n, f, counter(kPermutationTag, 0, 1));
    field.h_x1 = zipf.big_h(1.5) - 1.0;
    field.h_n = zipf.big_h(static_cast<double>(field.ids) + 0.5);
    field.squeeze = 2.0 - zipf.big_h_inverse(zipf.big_h(2.5) - zipf.h(2.0));
    fields_.push_back(field);
  }
  // The numeric features' weights: together a logit variance of 1/4.
  const double u_scale =
      0.5 / std::sqrt(static_cast<double>(std::max<std::size_t>(1, options_.dense_features)));
  for (std::size_t j = 0; j < options_.dense_features; ++j) {
    dense_weights_.push_back(u_scale *
                             normals(parameters_.block(j, counter(kDenseWeightTag, 0, 0))).first);
  }
}

Index ClickLog::draw_id(std::size_t f, std::uint64_t row) const {
  const Field& field = fields_[f];
  const ZipfShape zipf{options_.zipf_exponent};
  const auto n = static_cast<double>(field.ids);
  std::uint64_t rank = 1;
  for (std::uint64_t attempt = 0;; ++attempt) {
    const double u =
        field.h_n + unit(rows_.u64(row, counter(kIdTag, f, attempt))) * (field.h_x1 - field.h_n);
    const double x = zipf.big_h_inverse(u);
    const double k = std::clamp(std::floor(x + 0.5), 1.0, n);
    if (k - x <= field.squeeze || u >= zipf.big_h(k + 0.5) - zipf.h(k)) {
      rank = static_cast<std::uint64_t>(k);
      break;
    }
  }
  const auto ids = static_cast<std::uint64_t>(field.ids);
  // (multiplier * (rank - 1)) < 2^64: both factors are below 2^32.
  return static_cast<Index>((field.multiplier * (rank - 1) + field.offset) % ids);
}

double ClickLog::planted_logit(const Index* ids, const float* dense) const {
  const std::size_t fields_n = fields();
  const std::size_t latent = options_.latent_dim;
  // Scales: the first-order terms and the pairwise terms each give the
  // logit a variance of about 1.
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(fields_n));
  const double pairs = static_cast<double>(fields_n * (fields_n - 1)) / 2.0;
  const double v_scale =
      pairs > 0 ? std::pow(1.0 / (pairs * static_cast<double>(latent)), 0.25) : 0.0;
  double logit = options_.bias;
  std::array<double, kMaxLatent> sum{};
  double sum_of_squares = 0.0;
  std::array<double, kMaxLatent + 2> draws{};  // w, then v
  for (std::size_t f = 0; f < fields_n; ++f) {
    for (std::size_t b = 0; 2 * b < 1 + latent; ++b) {
      const auto [z0, z1] = normals(parameters_.block(ids[f], counter(kEmbeddingTag, f, b)));
      draws[2 * b] = z0;
      draws[2 * b + 1] = z1;
    }
    logit += w_scale * draws[0];
    for (std::size_t c = 0; c < latent; ++c) {
      const double v = v_scale * draws[1 + c];
      sum[c] += v;
      sum_of_squares += v * v;
    }
  }
  double pairwise = -sum_of_squares;
  for (std::size_t c = 0; c < latent; ++c) pairwise += sum[c] * sum[c];
  logit += 0.5 * pairwise;
  for (std::size_t j = 0; j < options_.dense_features; ++j) logit += dense_weights_[j] * dense[j];
  return logit;
}

void ClickLog::read(std::uint64_t first, std::size_t count, ClickBatch& out) const {
  if (first > total_rows() || count > total_rows() - first) {
    throw InvalidArgument(fmt::format("[click-log] rows [{}, {}) are past the log's {} rows", first,
                                      first + count, total_rows()));
  }
  const std::size_t fields_n = fields();
  const std::size_t dense_n = options_.dense_features;
  out.rows = count;
  out.fields = fields_n;
  out.dense_features = dense_n;
  out.ids.resize(count * fields_n);
  out.dense.resize(count * dense_n);
  out.labels.resize(count);
  out.probability.resize(count);
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint64_t row = first + j;
    Index* ids = out.ids.data() + j * fields_n;
    float* dense = out.dense.data() + j * dense_n;
    for (std::size_t f = 0; f < fields_n; ++f) ids[f] = draw_id(f, row);
    for (std::size_t i = 0; i < dense_n; i += 2) {
      const auto [z0, z1] = normals(rows_.block(row, counter(kDenseTag, 0, i / 2)));
      dense[i] = static_cast<float>(z0);
      if (i + 1 < dense_n) dense[i + 1] = static_cast<float>(z1);
    }
    const double p = 1.0 / (1.0 + std::exp(-planted_logit(ids, dense)));
    out.probability[j] = static_cast<float>(p);
    out.labels[j] = unit(rows_.u64(row, counter(kLabelTag, 0, 0))) < p ? 1.0f : 0.0f;
  }
}

ClickLogStatistics ClickLog::statistics(std::uint64_t first, std::size_t count) const {
  ClickLogStatistics stats;
  if (count == 0) return stats;
  ClickBatch batch;
  double rate = 0.0;
  double floor = 0.0;
  constexpr std::size_t kChunk = 4096;
  for (std::size_t done = 0; done < count; done += kChunk) {
    read(first + done, std::min(kChunk, count - done), batch);
    for (const float p : batch.probability) {
      rate += p;
      floor += binary_entropy(p);
    }
  }
  stats.click_rate = rate / static_cast<double>(count);
  stats.base_entropy = binary_entropy(stats.click_rate);
  stats.floor_logloss = floor / static_cast<double>(count);
  return stats;
}

}  // namespace sparsecomm
