// The click model (dlrm) and its trainer: the tables' gradient against
// finite differences, every embedding exchange giving the same tables as
// the dense all-reduce of the whole table gradient, learning on the click
// log, the run's figures, and bad settings.

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/train/click_model.h"
#include "sparsecomm/train/trainer.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

ClickModelShape tiny_shape() {
  ClickModelShape shape;
  shape.cardinalities = {5, 7, 3};
  shape.dense_features = 2;
  shape.width = 4;
  shape.bottom = {6};
  shape.top = {8};
  return shape;
}

// Two rows that share field 0's ID 3 (so its table row gets two lookups).
ClickBatch tiny_batch() {
  ClickBatch batch;
  batch.rows = 2;
  batch.fields = 3;
  batch.dense_features = 2;
  batch.ids = {3, 1, 2, 3, 6, 0};
  batch.dense = {0.5f, -1.0f, 1.5f, 0.25f};
  batch.labels = {1.0f, 0.0f};
  batch.probability = {0.5f, 0.5f};
  return batch;
}

double loss_of(ClickModel& model, const ClickBatch& batch, const RowReader& tables) {
  const torch::NoGradGuard no_grad;
  return model.forward(batch, tables).to(torch::kFloat64).sum().item<double>();
}

TEST(ClickModel, TableGradientMatchesFiniteDifferences) {
  torch::manual_seed(3);
  ClickModel model(tiny_shape());
  EmbeddingTables tables(model.layout(), 7);
  const ClickBatch batch = tiny_batch();
  model.forward(batch, tables).sum().backward();
  RowSparse gradient;
  model.table_gradient(gradient);
  // Stacked rows: table 0 rows 0..4, table 1 rows 5..11, table 2 rows 12..14.
  const std::vector<Index> touched = {3, 5 + 1, 5 + 6, 12 + 0, 12 + 2};
  ASSERT_EQ(std::vector<Index>(gradient.ids.begin(), gradient.ids.end()), touched);
  EXPECT_EQ(model.layout().table_of(11), 1u);
  EXPECT_EQ(model.layout().table_of(12), 2u);
  // Central differences in double of the float model: h = 1e-2 keeps the
  // rounding error near 1e-5 while the model is smooth enough there.
  const double h = 1e-2;
  std::span<float> values = tables.values();
  for (std::size_t j = 0; j < gradient.touched(); ++j) {
    for (std::size_t c = 0; c < gradient.width; ++c) {
      float& v = values[gradient.ids[j] * gradient.width + c];
      const float saved = v;
      v = saved + static_cast<float>(h);
      const double up = loss_of(model, batch, tables);
      v = saved - static_cast<float>(h);
      const double down = loss_of(model, batch, tables);
      v = saved;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(gradient.row(j)[c], numeric, 2e-3 + 1e-2 * std::abs(numeric))
          << "row " << gradient.ids[j] << " column " << c;
    }
  }
}

TEST(ClickModel, RejectsABatchOfAnotherShapeOrAnIdOutsideItsTable) {
  torch::manual_seed(3);
  ClickModel model(tiny_shape());
  const EmbeddingTables tables(model.layout(), 7);
  ClickBatch batch = tiny_batch();
  batch.ids[1] = 7;  // table 1 has 7 rows
  EXPECT_THROW(model.forward(batch, tables), InvalidArgument);
  batch = tiny_batch();
  batch.fields = 2;
  EXPECT_THROW(model.forward(batch, tables), InvalidArgument);
  EXPECT_THROW(TableLayout({4, 0}, 4), InvalidArgument);
  EXPECT_THROW(EmbeddingTables(model.layout(), 1, 3, 16), InvalidArgument);  // 15 rows
}

// A range of the tables holds the rows the whole tables hold there, and
// the fingerprints of the ranges add up to the whole's; forward reads the
// same logits from the tables and from rows pulled out of them.
TEST(ClickModel, ARangeOfTheTablesIsThatPartOfTheWholeTables) {
  torch::manual_seed(3);
  ClickModel model(tiny_shape());
  const EmbeddingTables whole(model.layout(), 7);
  const EmbeddingTables low(model.layout(), 7, 0, 6);
  const EmbeddingTables high(model.layout(), 7, 6, 15);
  const std::size_t width = model.layout().width();
  for (Index r = 0; r < 15; ++r) {
    const EmbeddingTables& part = r < 6 ? low : high;
    EXPECT_TRUE(std::equal(whole.row(r), whole.row(r) + width, part.row(r))) << r;
  }
  EXPECT_EQ(low.row_hash_sum() + high.row_hash_sum(), whole.row_hash_sum());
  EXPECT_NEAR(low.abs_sum() + high.abs_sum(), whole.abs_sum(), 1e-12);

  const ClickBatch batch = tiny_batch();
  RowSparse pulled;
  pulled.reset(15, width);
  for (const Index r : {3, 6, 11, 12, 14}) {
    pulled.ids.push_back(r);
    pulled.values.insert(pulled.values.end(), whole.row(r), whole.row(r) + width);
  }
  const torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(model.forward(batch, whole), model.forward(batch, PulledRows(pulled))));
  pulled.ids[4] = 13;  // row 14 missing
  EXPECT_THROW(model.forward(batch, PulledRows(pulled)), std::logic_error);
}

// A small click run: tables capped at 300 rows (so ranks share rows),
// plain SGD everywhere, the dense MLPs on our ring.
TrainConfig click_run(const fs::path& out, const std::string& exchange, int workers) {
  TrainConfig c = testing::short_run("dense", out);
  c.model = "dlrm";
  c.dataset = "click-log";
  c.workers = workers;
  c.deterministic = true;
  c.train_samples = 4096;
  c.test_samples = 2000;
  c.embedding_cap = 300;
  c.embedding_exchange = exchange;
  c.embedding_optimizer = "sgd";
  c.embedding_lr = 0.5;
  c.epochs = 1;
  c.batch = 64;
  c.momentum = 0.0;
  c.nesterov = false;
  c.weight_decay = 0.0;
  return c;
}

// Every row-sparse exchange, the sharded tables' push and pull included,
// leaves the tables the dense all-reduce of the whole table gradient
// leaves: bit for bit on 2 ranks (each sum has two terms, so its order
// cannot matter), within float rounding on 4 (the ring sums in another
// order).
TEST(ClickTrain, RowSparseExchangesEqualTheDenseAllReduce) {
  const testing::ScratchDir scratch("click_exact");
  for (const int workers : {2, 4}) {
    std::vector<nlohmann::json> tables;
    for (const std::string exchange :
         {"dense", "allgather", "sparse-allreduce", "auto", "sharded"}) {
      const nlohmann::json summary = run_training(
          click_run(scratch.path() / fmt::format("{}-{}", exchange, workers), exchange, workers));
      tables.push_back(summary.at("embedding"));
      EXPECT_EQ(summary.at("embedding").at("steps_by_exchange").begin().key(),
                exchange == "auto" ? "allgather" : exchange);
    }
    const double dense_sum = tables[0].at("table_abs_sum").get<double>();
    for (std::size_t i = 1; i < tables.size(); ++i) {
      if (workers == 2) {
        EXPECT_EQ(tables[i].at("table_hash"), tables[0].at("table_hash")) << i;
      }
      EXPECT_NEAR(tables[i].at("table_abs_sum").get<double>(), dense_sum, 1e-6 * dense_sum) << i;
    }
    // The row-sparse exchanges touch a small share of the table's rows.
    EXPECT_LT(tables[1].at("mean_union_rows").get<double>(),
              tables[0].at("mean_union_rows").get<double>());
    // The row-sparse exchanges agree on the union; the sharded tables
    // store 1/n of the rows on each rank.
    EXPECT_EQ(tables[4].at("mean_union_rows"), tables[1].at("mean_union_rows"));
    // (rank 0's range: the tables' rows / n, rounded up)
    EXPECT_NEAR(tables[4].at("resident_parameters_per_rank").get<double>(),
                tables[0].at("parameters").get<double>() / workers,
                tables[0].at("width").get<double>());
    EXPECT_EQ(tables[1].at("resident_parameters_per_rank"), tables[0].at("parameters"));
  }
}

// bf16 rows on the wire: the rows' bytes halve (ids stay), the tables move
// a little, the held-out loss barely.
TEST(ClickTrain, Bf16RowsHalveTheRowBytes) {
  const testing::ScratchDir scratch("click_bf16");
  std::vector<nlohmann::json> summaries;
  for (const std::string values : {"fp32", "bf16"}) {
    TrainConfig c = click_run(scratch.path() / values, "allgather", 2);
    c.embedding_values = values;
    summaries.push_back(run_training(c));
  }
  const nlohmann::json& fp32 = summaries[0].at("embedding");
  const nlohmann::json& bf16 = summaries[1].at("embedding");
  EXPECT_EQ(bf16.at("values"), "bf16");
  const double ratio =
      bf16.at("mean_bytes_sent").get<double>() / fp32.at("mean_bytes_sent").get<double>();
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 0.6);
  EXPECT_NE(bf16.at("table_hash"), fp32.at("table_hash"));
  const std::vector<report::EvalRecord> a = report::load_run(scratch.path() / "fp32").evals;
  const std::vector<report::EvalRecord> b = report::load_run(scratch.path() / "bf16").evals;
  ASSERT_FALSE(a.empty() || b.empty());
  EXPECT_NEAR(a.back().test_loss, b.back().test_loss, 0.01);
}

TEST(ClickTrain, LearnsAndReportsItsFigures) {
  const testing::ScratchDir scratch("click_learns");
  TrainConfig c = click_run(scratch.path() / "run", "auto", 2);
  c.train_samples = 32768;
  c.embedding_optimizer = "adagrad";
  c.embedding_lr = 0.05;
  c.lr = 0.1;
  c.warmup_epochs = 0.0;
  const nlohmann::json summary = run_training(c);
  const nlohmann::json& log = summary.at("click_log");
  const double floor = log.at("floor_logloss").get<double>();
  const double base = log.at("base_entropy").get<double>();
  ASSERT_LT(floor, base);
  const std::vector<report::EvalRecord> evals = report::load_run(scratch.path() / "run").evals;
  ASSERT_FALSE(evals.empty());
  // Below the click rate's entropy, above the planted model's floor.
  EXPECT_LT(evals.back().test_loss, base);
  EXPECT_GT(evals.back().test_loss, floor - 0.01);
  EXPECT_GT(summary.at("final_test_auc").get<double>(), 0.6);
  const nlohmann::json& e = summary.at("embedding");
  EXPECT_EQ(e.at("tables").get<int>(), 26);
  EXPECT_EQ(e.at("mean_table_touched_rows").size(), 26u);
  EXPECT_GT(e.at("mean_touched_rows").get<double>(), 0.0);
  EXPECT_LT(e.at("mean_bytes_sent").get<double>(), e.at("dense_allreduce_bytes").get<double>());
  EXPECT_GT(summary.at("peak_resident_bytes").get<double>(), 0.0);
}

// A stop requested during step 10 checkpoints after it (the MLPs, their
// sparsifier's state, the tables and their optimizer's state, the rows'
// update counts, the exchange choice's figures); resumed, the run ends
// with the same tables and MLPs, bit for bit, and the same figures, for
// replicated tables (auto) and sharded ones.
TEST(ClickTrain, AStoppedRunResumesBitForBit) {
  const testing::ScratchDir scratch("click_resume");
  for (const std::string exchange : {"auto", "sharded"}) {
    TrainConfig whole = click_run(scratch.path() / (exchange + "-whole"), exchange, 4);
    whole.method = "exdyna";
    whole.epochs = 2;
    whole.embedding_optimizer = "adagrad";
    TrainConfig stopped = whole;
    stopped.out = (scratch.path() / (exchange + "-stopped")).string();
    const auto [a, b] = testing::expect_stop_resumes_bit_for_bit(whole, stopped, 10, 11);
    ASSERT_TRUE(a.contains("embedding") && b.contains("embedding")) << exchange;
    for (const char* key : {"table_hash", "table_abs_sum", "mean_union_rows", "mean_bytes_sent",
                            "steps_by_exchange"}) {
      EXPECT_EQ(a["embedding"][key], b["embedding"][key]) << exchange << " " << key;
    }
    EXPECT_EQ(a["final_test_auc"], b["final_test_auc"]) << exchange;
    EXPECT_EQ(b["resumed_from_step"], 11) << exchange;
  }
}

TEST(ClickTrain, BadSettingsSayWhatToDo) {
  const testing::ScratchDir scratch("click_bad");
  TrainConfig c = click_run(scratch.path() / "run", "allgather", 2);
  c.dataset = "fashion-mnist";
  EXPECT_THROW(validate(c), InvalidArgument);
  c = click_run(scratch.path() / "run", "ring", 2);
  EXPECT_THROW(validate(c), InvalidArgument);
  c = click_run(scratch.path() / "run", "dense", 2);
  c.embedding_values = "bf16";  // the dense comparison is fp32
  EXPECT_THROW(validate(c), InvalidArgument);
  c = click_run(scratch.path() / "run", "allgather", 2);
  c.servers = 1;
  EXPECT_THROW(validate(c), InvalidArgument);
  c = click_run(scratch.path() / "run", "allgather", 2);
  c.model = "cnn";  // images on the click log
  try {
    validate(c);
    FAIL() << "cnn on the click log was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fashion-mnist or synthetic"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sparsecomm
