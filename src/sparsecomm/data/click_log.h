#pragma once
// A synthetic click log for embedding-heavy models (docs/algorithms.md,
// "The click log"): no real click log ships with the project's package
// sources, so one is generated, shaped like Criteo's display-advertising
// log (26 categorical fields with its field sizes, 13 numeric features)
// and labelled by a planted model, so that what a model learns can be
// measured against the best log-loss any model can reach.
//
// Row r is a pure function of (seed, r): any rank reads any rows without
// the log ever being stored, and a run resumes exactly.
//  - Field f's ID is Zipf-distributed over its n_f IDs (exponent s:
//    P(rank k) proportional to k^-s), the ranks scattered over the IDs by a
//    per-field affine permutation, so that hot IDs are not all small.
//  - The 13 numeric features are standard normal.
//  - The label is 1 with probability sigmoid(logit), where the planted
//    logit is a factorization machine: bias + sum_f w_f[id_f] +
//    sum_{f<g} <v_f[id_f], v_g[id_g]> + sum_j u_j x_j, every w and v drawn
//    from (seed, field, ID), u from (seed, j). Its mean binary entropy over
//    held-out rows is the floor: the log-loss of the true probabilities.
//
// Rows [0, rows) are for training, [rows, rows + held_out_rows) held out.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sparsecomm/core/rng.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

// The 26 categorical field sizes of Criteo's Kaggle display-advertising
// log (the counts DLRM's preprocessing reports), each capped at `cap` IDs,
// as DLRM's --max-ind-range hashes them.
std::vector<std::size_t> criteo_cardinalities(std::size_t cap);

struct ClickLogOptions {
  std::vector<std::size_t> cardinalities = criteo_cardinalities(2000000);
  std::size_t dense_features = 13;
  double zipf_exponent = 1.05;    // s, the same for every field
  std::uint64_t rows = 10000000;  // training rows
  std::uint64_t held_out_rows = 200000;
  std::uint64_t seed = 1;
  std::size_t latent_dim = 4;  // of the planted factorization machine
  double bias = -1.7;          // of the planted logit: sets the click rate (about 26%)
};

// Rows of the log, row-major.
struct ClickBatch {
  std::size_t rows = 0;
  std::size_t fields = 0;
  std::size_t dense_features = 0;
  UninitVector<Index> ids;          // rows x fields, ids[j * fields + f] < cardinality f
  UninitVector<float> dense;        // rows x dense_features
  UninitVector<float> labels;       // 0 or 1
  UninitVector<float> probability;  // the planted model's click probability
};

// What a range of rows says about learnability (over its planted
// probabilities, not its labels): the click rate, the entropy of a model
// that knows only it, and the floor.
struct ClickLogStatistics {
  double click_rate = 0.0;     // mean probability
  double base_entropy = 0.0;   // H(click_rate), nats
  double floor_logloss = 0.0;  // mean H(probability), nats
};

// Binary entropy in nats; 0 at p = 0 and 1.
double binary_entropy(double p);

class ClickLog {
 public:
  // InvalidArgument when a field has no IDs or more than 2^32, s <= 0,
  // latent_dim is 0 or rows is 0.
  explicit ClickLog(ClickLogOptions options);

  const ClickLogOptions& options() const { return options_; }
  std::size_t fields() const { return options_.cardinalities.size(); }
  std::uint64_t total_rows() const { return options_.rows + options_.held_out_rows; }

  // Rows [first, first + count) into `out`; InvalidArgument past total_rows().
  void read(std::uint64_t first, std::size_t count, ClickBatch& out) const;

  ClickLogStatistics statistics(std::uint64_t first, std::size_t count) const;

 private:
  struct Field {
    std::size_t ids = 0;
    std::uint64_t multiplier = 1;  // ID = (multiplier * (rank - 1) + offset) mod ids
    std::uint64_t offset = 0;
    double h_x1 = 0.0, h_n = 0.0, squeeze = 0.0;  // rejection-inversion constants
  };
  Index draw_id(std::size_t f, std::uint64_t row) const;
  double planted_logit(const Index* ids, const float* dense) const;

  ClickLogOptions options_;
  Philox rows_;        // the rows' draws
  Philox parameters_;  // the planted model's
  std::vector<Field> fields_;
  std::vector<double> dense_weights_;
};

}  // namespace sparsecomm
