// The synthetic click log: deterministic random access, IDs in range and
// Zipf-distributed, labels drawn from the planted probabilities, a floor
// well below the base rate's entropy, bad options refused.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/data/click_log.h"

namespace sparsecomm {
namespace {

ClickLogOptions small_log() {
  ClickLogOptions o;
  o.cardinalities = {1000, 3, 50000, 1};
  o.dense_features = 5;
  o.rows = 100000;
  o.held_out_rows = 20000;
  o.seed = 9;
  return o;
}

TEST(ClickLog, CriteosFieldsCappedGiveTheDefaultTablesOverAHundredMillionParameters) {
  const std::vector<std::size_t> fields = criteo_cardinalities(2000000);
  ASSERT_EQ(fields.size(), 26u);
  EXPECT_EQ(*std::max_element(fields.begin(), fields.end()), 2000000u);
  EXPECT_EQ(fields[8], 3u);  // C9: three values
  const std::size_t rows = std::accumulate(fields.begin(), fields.end(), std::size_t{0});
  EXPECT_GE(rows * 16, 100000000u) << "16-float rows";
}

TEST(ClickLog, RowsArePureFunctionsOfTheirIndex) {
  const ClickLog log(small_log());
  ClickBatch all, part, again;
  log.read(0, 300, all);
  log.read(120, 50, part);
  ASSERT_EQ(part.rows, 50u);
  ASSERT_EQ(part.fields, 4u);
  for (std::size_t j = 0; j < 50; ++j) {
    for (std::size_t f = 0; f < 4; ++f)
      EXPECT_EQ(part.ids[j * 4 + f], all.ids[(120 + j) * 4 + f]) << j << " " << f;
    for (std::size_t i = 0; i < 5; ++i)
      EXPECT_EQ(part.dense[j * 5 + i], all.dense[(120 + j) * 5 + i]);
    EXPECT_EQ(part.labels[j], all.labels[120 + j]);
    EXPECT_EQ(part.probability[j], all.probability[120 + j]);
  }
  const ClickLog same(small_log());
  same.read(0, 300, again);
  EXPECT_TRUE(std::equal(all.ids.begin(), all.ids.end(), again.ids.begin()));
  ClickLogOptions other = small_log();
  other.seed = 10;
  ClickBatch different;
  ClickLog(other).read(0, 300, different);
  EXPECT_FALSE(std::equal(all.ids.begin(), all.ids.end(), different.ids.begin()));
}

TEST(ClickLog, IdsAreInRangeAndZipfDistributed) {
  const ClickLog log(small_log());
  ClickBatch batch;
  constexpr std::size_t kRows = 100000;
  log.read(0, kRows, batch);
  std::vector<std::map<Index, std::size_t>> counts(4);
  for (std::size_t j = 0; j < kRows; ++j) {
    for (std::size_t f = 0; f < 4; ++f) {
      const Index id = batch.ids[j * 4 + f];
      ASSERT_LT(id, small_log().cardinalities[f]);
      ++counts[f][id];
    }
  }
  EXPECT_EQ(counts[3].size(), 1u);  // one ID
  EXPECT_EQ(counts[1].size(), 3u);
  // Field 0: P(rank k) = k^-s / H(1000, s); the top two ranks' frequencies
  // within 4 standard errors, their ratio near 2^s.
  const double s = small_log().zipf_exponent;
  double harmonic = 0.0;
  for (int k = 1; k <= 1000; ++k) harmonic += std::pow(k, -s);
  std::vector<std::size_t> sorted;
  for (const auto& [id, c] : counts[0]) sorted.push_back(c);
  std::sort(sorted.rbegin(), sorted.rend());
  for (int k = 1; k <= 3; ++k) {
    const double p = std::pow(k, -s) / harmonic;
    const double sigma = std::sqrt(p * (1 - p) / kRows);
    EXPECT_NEAR(static_cast<double>(sorted[k - 1]) / kRows, p, 4 * sigma) << "rank " << k;
  }
  // The hot IDs are scattered, not 0, 1, 2.
  std::vector<Index> hot;
  for (const auto& [id, c] : counts[0]) {
    if (c >= sorted[2]) hot.push_back(id);
  }
  EXPECT_NE(hot, (std::vector<Index>{0, 1, 2}));
  // The large field touches many IDs, the head far more often than the tail.
  EXPECT_GT(counts[2].size(), 5000u);
}

TEST(ClickLog, LabelsFollowThePlantedProbabilitiesAndTheFloorIsWellBelowTheBaseRate) {
  const ClickLog log(small_log());
  ClickBatch batch;
  log.read(100000, 20000, batch);  // the held-out rows
  double clicks = 0.0, probability = 0.0;
  for (std::size_t j = 0; j < batch.rows; ++j) {
    EXPECT_TRUE(batch.labels[j] == 0.0f || batch.labels[j] == 1.0f);
    EXPECT_GT(batch.probability[j], 0.0f);
    EXPECT_LT(batch.probability[j], 1.0f);
    clicks += batch.labels[j];
    probability += batch.probability[j];
  }
  const double n = static_cast<double>(batch.rows);
  const double rate = probability / n;
  EXPECT_NEAR(clicks / n, rate, 4 * std::sqrt(rate * (1 - rate) / n));
  const ClickLogStatistics stats = log.statistics(100000, 20000);
  EXPECT_NEAR(stats.click_rate, rate, 1e-9);
  EXPECT_GT(stats.click_rate, 0.1);
  EXPECT_LT(stats.click_rate, 0.5);
  EXPECT_LT(stats.floor_logloss, 0.85 * stats.base_entropy)
      << "floor " << stats.floor_logloss << " base " << stats.base_entropy;
  EXPECT_DOUBLE_EQ(binary_entropy(0.5), std::log(2.0));
  EXPECT_EQ(binary_entropy(0.0), 0.0);
  EXPECT_EQ(binary_entropy(1.0), 0.0);
}

TEST(ClickLog, BadOptionsAndRowsPastTheEndAreRefused) {
  const auto refuses = [](ClickLogOptions o, const std::string& says) {
    try {
      const ClickLog log(std::move(o));
      ADD_FAILURE() << "accepted; wanted: " << says;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  ClickLogOptions o = small_log();
  o.cardinalities = {};
  refuses(o, "at least one categorical field");
  o = small_log();
  o.cardinalities[2] = 0;
  refuses(o, "field 2 has 0 IDs");
  o = small_log();
  o.zipf_exponent = 0.0;
  refuses(o, "Zipf exponent must be > 0");
  o = small_log();
  o.latent_dim = 0;
  refuses(o, "latent_dim must be 1 to 64");
  o = small_log();
  o.rows = 0;
  refuses(o, "at least 1 row");
  const ClickLog log(small_log());
  ClickBatch batch;
  EXPECT_THROW(log.read(119990, 11, batch), InvalidArgument);
  EXPECT_NO_THROW(log.read(119990, 10, batch));
}

}  // namespace
}  // namespace sparsecomm
