// run_comparison (train/compare.h): a run that fails is recorded in its
// directory and in the table, and the comparison goes on with the next run.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "error_message.h"
#include "sparsecomm/data/idx.h"
#include "sparsecomm/report/compare_table.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/train/checkpoint.h"
#include "sparsecomm/train/compare.h"
#include "train_checks.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

TEST(Compare, AFailedRunIsRecordedAndTheNextOneRuns) {
  const testing::ScratchDir scratch("compare_failure");
  TrainConfig base = testing::short_run("exdyna", scratch.path());
  base.epochs = 1;
  base.train_samples = 1024;
  base.test_samples = 200;
  std::vector<CompareRun> runs = {compare_item(base, "exdyna"), compare_item(base, "dense")};
  // An absurd learning rate: the first update overflows the parameters and
  // the next gradient is not finite, on every rank (policy "stop").
  runs[0].config.lr = 1e30;
  runs[0].config.out = (scratch.path() / "exdyna").string();
  runs[1].config.out = (scratch.path() / "dense").string();

  const CompareResult result = run_comparison(runs, nullptr);
  ASSERT_EQ(result.dirs.size(), 2u);
  ASSERT_EQ(result.failed.size(), 1u);
  EXPECT_EQ(result.failed[0].rfind("exdyna: ", 0), 0u) << result.failed[0];
  EXPECT_NE(result.failed[0].find("non-finite"), std::string::npos) << result.failed[0];

  // The failed run: failure.json, no summary.json; the next run finished.
  std::ifstream failure_file(scratch.path() / "exdyna" / "failure.json");
  const nlohmann::json failure = nlohmann::json::parse(failure_file);
  EXPECT_TRUE(failure.at("failed").get<bool>());
  EXPECT_NE(failure.at("error").get<std::string>().find("non-finite"), std::string::npos);
  EXPECT_LT(failure.at("steps_completed").get<std::int64_t>(), 5);
  EXPECT_FALSE(fs::exists(scratch.path() / "exdyna" / "summary.json"));
  EXPECT_TRUE(fs::exists(scratch.path() / "dense" / "summary.json"));

  const std::vector<report::RunData> loaded = {report::load_run(result.dirs[0]),
                                               report::load_run(result.dirs[1])};
  ASSERT_TRUE(loaded[0].failure.has_value());
  EXPECT_FALSE(loaded[1].failure.has_value());
  const std::string table = report::format_comparison_table(loaded);
  EXPECT_NE(table.find("exdyna!"), std::string::npos) << table;
  EXPECT_NE(table.find("! exdyna failed after"), std::string::npos) << table;

  // Rerunning into the failed run's directory says what to do.
  try {
    run_training(runs[0].config);
    ADD_FAILURE() << "a second run into a failed run's directory was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("that run failed (see its failure.json)"),
              std::string::npos)
        << e.what();
  }
}

// --nonfinite skip: a skipped step leaves the parameters alone (no
// momentum, no weight decay) and its loss out of the averages.
TEST(NonFinite, SkippedStepsDoNotMoveTheParameters) {
  const testing::ScratchDir scratch("skip_nonfinite");
  const auto run_to = [&](std::int64_t steps) {
    TrainConfig c = testing::short_run("topk", scratch.path() / std::to_string(steps));
    c.lr = 1e30;  // step 0's update overflows the model: every later step is skipped
    c.nonfinite = "skip";
    c.max_steps = 8;
    c.stop_at_step = steps;
    run_training(c);
    return testing::parameters_of_checkpoint(
        read_rank_checkpoint(scratch.path() / std::to_string(steps), steps, 0));
  };
  const std::vector<float> at3 = run_to(3);
  const std::vector<float> at6 = run_to(6);
  ASSERT_EQ(at3.size(), at6.size());
  EXPECT_EQ(std::memcmp(at3.data(), at6.data(), at3.size() * sizeof(float)), 0)
      << "skipped steps 3..5 changed the parameters";
  // Steps 1..5 were recorded as skipped.
  std::ifstream metrics(scratch.path() / "6" / "metrics.jsonl");
  int skipped = 0;
  for (std::string line; std::getline(metrics, line);) {
    if (line.find("\"skipped_nonfinite\":true") != std::string::npos) ++skipped;
  }
  EXPECT_EQ(skipped, 5);
}

// Images of another size than the models take are refused when the data is
// loaded, before a run directory exists (it once ended in a LibTorch shape
// error mid-run, and the half run then blocked a rerun).
TEST(Data, ImagesOfTheWrongSizeAreRefusedBeforeTheRunStarts) {
  const testing::ScratchDir scratch("wrong_image_size");
  const fs::path data = scratch.path() / "data";
  fs::create_directories(data);
  for (const char* split : {"train", "t10k"}) {
    write_idx_gz((data / fmt::format("{}-images-idx3-ubyte.gz", split)).string(),
                 IdxArray{{8, 32, 32}, std::vector<std::uint8_t>(8 * 32 * 32, 7)});
    write_idx_gz((data / fmt::format("{}-labels-idx1-ubyte.gz", split)).string(),
                 IdxArray{{8}, std::vector<std::uint8_t>(8, 1)});
  }
  TrainConfig c = testing::short_run("dense", scratch.path() / "run");
  c.data_dir = data.string();
  c.train_samples = 0;
  c.test_samples = 0;
  const std::string message = testing::error_message<InvalidArgument>([&] { run_training(c); });
  EXPECT_NE(message.find("images of 32x32 pixels; the image models take 28x28"), std::string::npos)
      << message;
  EXPECT_FALSE(fs::exists(scratch.path() / "run")) << "a failed start left a run directory";
}

TEST(Compare, ItemsNameTheMethodAndTheSyncModel) {
  TrainConfig base;
  base.staleness = 3;
  const CompareRun plain = compare_item(base, "topk");
  EXPECT_EQ(plain.config.method, "topk");
  EXPECT_EQ(plain.label, "topk");
  const CompareRun ssp = compare_item(base, "topk@ssp:2");
  EXPECT_EQ(ssp.config.sync, "ssp");
  EXPECT_EQ(ssp.config.staleness, 2);
  EXPECT_EQ(ssp.label, "topk@ssp-2");
  const CompareRun dssp = compare_item(base, "dense@dssp:1:4");
  EXPECT_EQ(dssp.config.staleness_low, 1);
  EXPECT_EQ(dssp.config.staleness_high, 4);
  EXPECT_EQ(dssp.config.staleness, 0);
}

}  // namespace
}  // namespace sparsecomm
