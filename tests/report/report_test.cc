// The report layer on synthetic run directories: loading (truncated last
// line, malformed lines, missing files, no summary.json), the comparison
// table, and the gnuplot PNGs.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "scratch_dir.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/report/compare_table.h"
#include "sparsecomm/report/plots.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/report/statistics.h"
#include "sparsecomm/report/timeline_summary.h"

namespace sparsecomm::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return std::move(text).str();
}

class ReportTest : public ::testing::Test {
 protected:
  // A run of `steps` steps sending `bytes` per step, evaluated every 10
  // steps; with summary.json when `finished`.
  // `overlapped` >= 0: the steps were pipelined, that many seconds of their
  // 0.04 s of selection + exchange hidden under backward.
  fs::path write_run(const std::string& name, const std::string& method, double density,
                     double bytes, int steps = 60, bool finished = true, double overlapped = -1.0) {
    const fs::path dir = root_ / name;
    fs::create_directories(dir);
    write_json_atomically(dir / "config.json", json{{"method", method},
                                                    {"model", "mlp"},
                                                    {"workers", 4},
                                                    {"density", density},
                                                    {"backend", "thread"}});
    for (int s = 0; s < steps; ++s) {
      json step = json{{"kind", "step"},
                       {"step", s},
                       {"epoch", s / 20.0},
                       {"wall_s", 0.1 * (s + 1)},
                       {"lr", 0.1},
                       {"loss", 2.0 / (s + 1)},
                       {"compute_s", 0.05},
                       {"selection_s", 0.01},
                       {"exchange_s", 0.03},
                       {"update_s", 0.01},
                       {"density_ratio", 1.0 + 0.1 * std::sin(s)},
                       {"imbalance", 0.05},
                       {"bytes_sent", bytes},
                       {"bytes_received", 3 * bytes},
                       {"residual_norm", 1.5},
                       {"selected", 100},
                       {"union_size", 380},
                       {"target", 100},
                       {"numel", 10000},
                       {"extra_key", "ignored"}};
      if (overlapped >= 0) step["overlapped_s"] = overlapped;
      append_line(dir / "metrics.jsonl", step.dump());
      if ((s + 1) % 10 == 0) {
        append_line(dir / "metrics.jsonl", json{{"kind", "eval"},
                                                {"step", s},
                                                {"epoch", (s + 1) / 20.0},
                                                {"wall_s", 0.1 * (s + 1) + 0.02},
                                                {"test_accuracy", 0.5 + 0.005 * s},
                                                {"test_loss", 1.0},
                                                {"train_loss", 0.9}}
                                               .dump());
      }
    }
    if (finished) {
      write_json_atomically(
          dir / "summary.json",
          json{{"method", method},
               {"model", "mlp"},
               {"workers", 4},
               {"backend", "thread"},
               {"epochs", 3},
               {"steps", steps},
               {"test_accuracy", 0.8123},
               {"best_test_accuracy", 0.8456},
               {"wall_s", 12.5},
               {"time_breakdown_s",
                {{"compute", 3.0}, {"selection", 0.6}, {"exchange", 1.8}, {"update", 0.6}}},
               {"bytes_per_rank_per_step", bytes},
               {"density_ratio_mean", 1.0123},
               {"imbalance_mean", 0.0456},
               {"samples_per_s", 5120.0},
               {"some_future_key", {1, 2}}});
    }
    return dir;
  }

  std::string load_error(const fs::path& dir) {
    try {
      load_run(dir);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected load_run to fail for " << dir;
    return {};
  }

  // A space in the path: plotting must not depend on shell quoting.
  const testing::ScratchDir scratch_{"report " + testing::current_test_name()};
  const fs::path root_ = scratch_.path();
};

// Three ranks, two steps: rows of times per rank.
TEST(ComputeSpread, IsTheSpreadAcrossRanksWithinEachStepAndTheWaitForTheSlowest) {
  // Step 0: 1, 2, 3 (sample sd 1, slowest 3, mean 2: wait 1); step 1: 5, 5,
  // 5 (sd 0, wait 0). A shift shared by every rank (step 1 is slower for
  // all) is not a spread.
  const std::vector<double> times = {1, 5, 2, 5, 3, 5};
  const report::ComputeSpread spread = report::compute_spread(times, 3);
  // The mean sd over steps, 0.5, over c4(3) = sqrt(pi)/2; the RMS sqrt(0.5).
  EXPECT_DOUBLE_EQ(spread.spread_s, 0.5 / (std::sqrt(std::numbers::pi) / 2));
  EXPECT_DOUBLE_EQ(spread.spread_rms_s, std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(spread.wait_s, 0.5);
  EXPECT_EQ(report::compute_spread(std::vector<double>{4, 7}, 1).spread_s, 0.0);
  EXPECT_EQ(report::compute_spread(std::vector<double>{}, 4).wait_s, 0.0);
  EXPECT_THROW(report::compute_spread(std::vector<double>{1, 2, 3}, 2), InvalidArgument);
  EXPECT_THROW(report::compute_spread(std::vector<double>{}, 0), InvalidArgument);
}

// Two ranks: the model's wait, E[max of 2 normals] = 1/sqrt(pi) times the
// spread, is exactly the measured mean wait with the mean spread, whatever
// the steps; with the RMS it is too large when one step spreads far more.
TEST(ComputeSpread, ForTwoRanksTheMeanSpreadGivesTheMeasuredWaitAndTheRmsDoesNot) {
  // Steps 0-2 differ by 0.2 between the ranks, step 3 by 4 (a rank stalled).
  const std::vector<double> times = {1.0, 1.0, 1.0, 1.0, 1.2, 1.2, 1.2, 5.0};
  const report::ComputeSpread spread = report::compute_spread(times, 2);
  EXPECT_DOUBLE_EQ(spread.wait_s, (0.1 + 0.1 + 0.1 + 2.0) / 4);
  EXPECT_NEAR(spread.spread_s / std::sqrt(std::numbers::pi), spread.wait_s, 1e-12);
  EXPECT_GT(spread.spread_rms_s / std::sqrt(std::numbers::pi), 1.3 * spread.wait_s);
}

TEST_F(ReportTest, LoadsAFinishedRun) {
  const fs::path dir = write_run("topk", "topk", 0.01, 2048);
  const RunData run = load_run(dir);
  EXPECT_EQ(run.config.at("method"), "topk");
  ASSERT_EQ(run.steps.size(), 60u);
  ASSERT_EQ(run.evals.size(), 6u);
  EXPECT_EQ(run.steps[7].step, 7);
  EXPECT_DOUBLE_EQ(run.steps[7].bytes_received, 3 * 2048.0);
  EXPECT_DOUBLE_EQ(run.steps[7].union_size, 380);
  EXPECT_DOUBLE_EQ(run.evals[1].test_accuracy, 0.5 + 0.005 * 19);
  ASSERT_TRUE(run.summary_json.has_value());
  EXPECT_FALSE(run.summary_derived);
  EXPECT_EQ(run.summary.method, "topk");
  EXPECT_EQ(run.summary.workers, 4);
  EXPECT_EQ(run.summary.steps, 60);
  EXPECT_DOUBLE_EQ(run.summary.best_test_accuracy, 0.8456);
  EXPECT_DOUBLE_EQ(run.summary.time_breakdown_s.exchange, 1.8);
  EXPECT_DOUBLE_EQ(run.summary.samples_per_s, 5120.0);
  EXPECT_TRUE(run.warnings.empty());
}

TEST_F(ReportTest, DerivesTheSummaryWhenSummaryJsonIsMissing) {
  const fs::path dir = write_run("partial", "exdyna", 0.01, 1000, 40, /*finished=*/false);
  const RunData run = load_run(dir);
  EXPECT_TRUE(run.summary_derived);
  EXPECT_FALSE(run.summary_json.has_value());
  ASSERT_EQ(run.warnings.size(), 1u);
  EXPECT_NE(run.warnings[0].find("no summary.json"), std::string::npos);
  const RunSummary& s = run.summary;
  EXPECT_EQ(s.method, "exdyna");
  EXPECT_EQ(s.backend, "thread");
  EXPECT_EQ(s.workers, 4);
  EXPECT_EQ(s.steps, 40);
  EXPECT_DOUBLE_EQ(s.epochs, 2.0);
  EXPECT_NEAR(s.wall_s, 4.02, 1e-12);
  EXPECT_DOUBLE_EQ(s.test_accuracy, 0.5 + 0.005 * 39);
  EXPECT_DOUBLE_EQ(s.best_test_accuracy, 0.5 + 0.005 * 39);
  EXPECT_NEAR(s.time_breakdown_s.compute, 40 * 0.05, 1e-9);
  EXPECT_DOUBLE_EQ(s.bytes_per_rank_per_step, 1000);
  EXPECT_DOUBLE_EQ(s.imbalance_mean, 0.05);
  EXPECT_TRUE(std::isnan(s.samples_per_s));
  EXPECT_NE(format_run_summary(run).find("no summary.json"), std::string::npos);
}

// run_json, what `report --format json` gives the scripts: the lines as
// written (unknown and nested keys included, fields not written absent);
// summary.json as written, or the derived figures with null for the unknown
// ones (JSON has no NaN).
TEST_F(ReportTest, RunJsonGivesTheLinesAsWrittenAndTheSummaryWithNullForUnknowns) {
  const json kept = run_json(write_run("kept", "topk", 0.01, 2048));
  ASSERT_EQ(kept.at("steps").size(), 60u);
  ASSERT_EQ(kept.at("evals").size(), 6u);
  EXPECT_EQ(kept.at("steps")[7].at("extra_key"), "ignored");
  EXPECT_EQ(kept.at("evals")[1].at("test_accuracy"), 0.5 + 0.005 * 19);
  EXPECT_EQ(kept.at("summary").at("some_future_key"), json({1, 2}));
  EXPECT_FALSE(kept.at("summary_derived").get<bool>());
  EXPECT_TRUE(kept.at("failure").is_null());

  const json partial = run_json(write_run("partial", "exdyna", 0.01, 1000, 40, false));
  ASSERT_EQ(partial.at("steps").size(), 40u);
  EXPECT_EQ(partial.at("steps")[3].at("bytes_received"), 3000.0);
  EXPECT_FALSE(partial.at("steps")[3].contains("overlapped_s"));  // not written
  EXPECT_TRUE(partial.at("summary_derived").get<bool>());
  EXPECT_EQ(partial.at("summary").at("steps"), 40);
  EXPECT_TRUE(partial.at("summary").at("samples_per_s").is_null());
  ASSERT_EQ(partial.at("warnings").size(), 1u);
  // Every value survives a round trip through text.
  EXPECT_EQ(json::parse(kept.dump()), kept);
}

// The click model's lines: the tables' bytes join the step's traffic, and
// the held-out log-loss and AUC reach the summary, its text and the table.
TEST_F(ReportTest, ClickRunsCountTheTablesBytesAndShowLogLossAndAuc) {
  const fs::path dir = write_run("clicks", "exdyna", 0.01, 1000, 20, /*finished=*/false);
  fs::remove(dir / "metrics.jsonl");
  for (int s = 0; s < 2; ++s) {
    append_line(dir / "metrics.jsonl",
                json{{"kind", "step"},
                     {"step", s},
                     {"epoch", 0.5 * (s + 1)},
                     {"wall_s", 1.0 * (s + 1)},
                     {"bytes_sent", 1000},
                     {"embedding",
                      {{"bytes_sent", 5000 + 2000 * s}, {"touched_rows", 70}, {"union_rows", 200}}}}
                    .dump());
  }
  append_line(dir / "metrics.jsonl", json{{"kind", "eval"},
                                          {"step", 2},
                                          {"epoch", 1.0},
                                          {"wall_s", 2.0},
                                          {"test_accuracy", 0.76},
                                          {"test_loss", 0.4979},
                                          {"train_loss", 0.5},
                                          {"test_auc", 0.7449}}
                                         .dump());
  const RunData run = load_run(dir);
  ASSERT_EQ(run.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(run.steps[1].embedding_bytes_sent, 7000);
  EXPECT_DOUBLE_EQ(run.steps[1].embedding_touched_rows, 70);
  EXPECT_DOUBLE_EQ(run.summary.bytes_per_rank_per_step, 1000 + 6000);
  EXPECT_DOUBLE_EQ(run.summary.test_auc, 0.7449);
  EXPECT_DOUBLE_EQ(run.summary.test_loss, 0.4979);
  EXPECT_NE(format_run_summary(run).find("log-loss 0.4979, AUC 0.7449"), std::string::npos)
      << format_run_summary(run);
  const std::vector<RunData> runs = {run, load_run(write_run("images", "topk", 0.01, 500))};
  const std::string table = format_comparison_table(runs);
  EXPECT_NE(table.find("AUC"), std::string::npos) << table;
  EXPECT_NE(table.find("0.7449"), std::string::npos) << table;
  // The rows per step get their own plot.
  const std::vector<fs::path> pngs = write_plots(std::span(runs).first(1), root_ / "click plots");
  EXPECT_TRUE(std::any_of(pngs.begin(), pngs.end(), [](const fs::path& png) {
    return png.filename() == "embedding_rows.png";
  }));
  // Image runs alone have no such columns.
  EXPECT_EQ(format_comparison_table(std::span(runs).subspan(1)).find("AUC"), std::string::npos);
}

TEST_F(ReportTest, ToleratesATruncatedLastLineWithAWarning) {
  const fs::path dir = write_run("killed", "topk", 0.01, 100, 20, false);
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << R"({"kind":"step","step":20,"epo)";
  const RunData run = load_run(dir);
  EXPECT_EQ(run.steps.size(), 20u);
  ASSERT_EQ(run.warnings.size(), 2u);
  EXPECT_NE(run.warnings[0].find("metrics.jsonl line 23"), std::string::npos) << run.warnings[0];
  EXPECT_NE(run.warnings[0].find("incomplete"), std::string::npos);
}

TEST_F(ReportTest, NullFieldsAreNaNAndUnknownKindsAreSkipped) {
  const fs::path dir = write_run("nulls", "topk", 0.01, 100, 1, false);
  append_line(dir / "metrics.jsonl", R"({"kind":"step","step":1,"loss":null})");
  append_line(dir / "metrics.jsonl", R"({"kind":"checkpoint","step":1})");
  const RunData run = load_run(dir);
  ASSERT_EQ(run.steps.size(), 2u);
  EXPECT_TRUE(std::isnan(run.steps[1].loss));
  EXPECT_TRUE(std::isnan(run.steps[1].bytes_sent));
  EXPECT_DOUBLE_EQ(run.summary.bytes_per_rank_per_step, 100);  // the NaN is left out
  ASSERT_EQ(run.warnings.size(), 2u);
  EXPECT_NE(run.warnings[0].find("unknown kind \"checkpoint\""), std::string::npos);
}

TEST_F(ReportTest, MalformedLinesAreErrorsNamingFileAndLine) {
  const fs::path dir = write_run("bad", "topk", 0.01, 100, 3, false);
  const std::string good = read_text(dir / "metrics.jsonl");
  // Invalid JSON in the middle.
  std::ofstream(dir / "metrics.jsonl") << good << "{not json\n" << good;
  std::string message = load_error(dir);
  EXPECT_NE(message.find("metrics.jsonl line 4"), std::string::npos) << message;
  EXPECT_NE(message.find("not valid JSON"), std::string::npos) << message;
  // A wrongly typed field, even on the last line.
  std::ofstream(dir / "metrics.jsonl") << good << R"({"kind":"step","step":3,"loss":"high"})"
                                       << "\n";
  message = load_error(dir);
  EXPECT_NE(message.find("line 4"), std::string::npos) << message;
  EXPECT_NE(message.find("\"loss\""), std::string::npos) << message;
  // No kind.
  std::ofstream(dir / "metrics.jsonl") << R"({"step":0})"
                                       << "\n"
                                       << good;
  message = load_error(dir);
  EXPECT_NE(message.find("line 1"), std::string::npos) << message;
  EXPECT_NE(message.find("kind"), std::string::npos) << message;
  // A non-integer step.
  std::ofstream(dir / "metrics.jsonl") << R"({"kind":"eval","step":"3"})"
                                       << "\n"
                                       << good;
  EXPECT_NE(load_error(dir).find("\"step\" must be an integer"), std::string::npos);
}

TEST_F(ReportTest, MissingDirectoriesAndFilesAreExplained) {
  std::string message = load_error(root_ / "nowhere");
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
  fs::create_directories(root_ / "empty");
  message = load_error(root_ / "empty");
  EXPECT_NE(message.find("not a run directory"), std::string::npos) << message;
  EXPECT_NE(message.find("config.json and metrics.jsonl missing"), std::string::npos) << message;
  EXPECT_NE(message.find("sparsecomm train --out DIR"), std::string::npos) << message;
  const fs::path dir = write_run("no_metrics", "topk", 0.01, 100, 1);
  fs::remove(dir / "metrics.jsonl");
  message = load_error(dir);
  EXPECT_NE(message.find("metrics.jsonl missing"), std::string::npos) << message;
  std::ofstream(dir / "metrics.jsonl") << "";
  std::ofstream(dir / "config.json") << "[1, 2]";
  EXPECT_NE(load_error(dir).find("config.json is not a JSON object"), std::string::npos);
  std::ofstream(dir / "config.json") << "{\"method\": ";
  EXPECT_NE(load_error(dir).find("config.json is not valid JSON"), std::string::npos);
}

TEST_F(ReportTest, WritersReplaceAndAppend) {
  const fs::path file = root_ / "x.json";
  write_json_atomically(file, json{{"a", 1}});
  write_json_atomically(file, json{{"a", 2}});
  EXPECT_EQ(json::parse(read_text(file)).at("a"), 2);
  EXPECT_EQ(std::distance(fs::directory_iterator(root_), fs::directory_iterator()), 1)
      << "no temporary file left behind";
  append_line(root_ / "l.jsonl", "one");
  append_line(root_ / "l.jsonl", "two");
  EXPECT_EQ(read_text(root_ / "l.jsonl"), "one\ntwo\n");
  EXPECT_THROW(append_line(root_ / "l.jsonl", "a\nb"), InvalidArgument);
  EXPECT_THROW(write_json_atomically(root_ / "missing_dir" / "x.json", json{}), Error);
}

TEST_F(ReportTest, ComparisonTableShowsFiguresAndTheRatioToDense) {
  std::vector<RunData> runs = {load_run(write_run("dense", "dense", 1.0, 48.0 * 1024 * 1024)),
                               load_run(write_run("topk", "topk", 0.01, 1024.0 * 1024)),
                               load_run(write_run("partial", "exdyna", 0.01, 1536, 30, false))};
  const std::string table = format_comparison_table(runs);
  for (const char* expected : {"method", "final acc %", "vs dense", "dense", "topk", "exdyna*",
                               "81.23", "84.56", "12.5", "1.012", "0.046", "48 MiB", "1 MiB",
                               "1.5 KiB", "1/48", "1/32768", "3.00", "1.80", "* no summary.json"}) {
    EXPECT_NE(table.find(expected), std::string::npos) << expected << " missing in\n" << table;
  }
  // Aligned: every row as wide as the header up to the last column.
  std::istringstream lines(table);
  std::string header, rule, row;
  std::getline(lines, header);
  std::getline(lines, rule);
  EXPECT_EQ(rule.find_first_not_of('-'), std::string::npos);
  const std::size_t run_column = header.rfind("run");
  while (std::getline(lines, row) && row.rfind("*", 0) != 0) {
    EXPECT_EQ(row.find(root_.string()), run_column) << row;
  }
  // Without a dense run there is no ratio.
  const std::string no_dense = format_comparison_table(std::span(runs).subspan(1));
  EXPECT_EQ(no_dense.find(" 1/"), std::string::npos) << no_dense;  // " 1/": not in a path
  EXPECT_TRUE(is_dense_run(runs[0]));
  EXPECT_FALSE(is_dense_run(runs[1]));
  EXPECT_EQ(human_bytes(65536), "64 KiB");
  EXPECT_EQ(human_bytes(100), "100 B");
  EXPECT_EQ(human_bytes(NAN), "-");

  const std::string summary = format_run_summary(runs[1]);
  for (const char* expected : {"topk", "mlp", "4 workers", "81.23 %", "84.56 %", "1 MiB",
                               "exchange 1.80 s", "5120 samples/s"}) {
    EXPECT_NE(summary.find(expected), std::string::npos) << expected << " missing in\n" << summary;
  }
}

TEST_F(ReportTest, LabelsUseDirectoryNamesWhenMethodsRepeat) {
  std::vector<RunData> runs = {load_run(write_run("a", "topk", 0.01, 1)),
                               load_run(write_run("b", "topk", 0.01, 1)),
                               load_run(write_run("c", "dense", 1, 1))};
  EXPECT_EQ(run_labels(runs), (std::vector<std::string>{"a", "b", "dense"}));
}

TEST_F(ReportTest, TableShowsWhenEachRunReachesTheFirstRunsAccuracy) {
  const auto run_with = [&](const std::string& name, const std::string& sync,
                            std::vector<EvalRecord> evals) {
    RunData run = load_run(write_run(name, "dense", 1.0, 1024));
    run.summary.sync = sync;
    run.evals = std::move(evals);
    run.summary.test_accuracy = run.evals.back().test_accuracy;
    return run;
  };
  const std::vector<RunData> runs = {
      run_with("bsp", "bsp", {{10, 1.0, 4.0, 0.85, 0, 0}, {20, 2.0, 8.0, 0.9, 0, 0}}),
      run_with("ssp", "ssp:2", {{10, 1.0, 3.0, 0.87, 0, 0}, {20, 2.0, 6.5, 0.91, 0, 0}}),
      run_with("asp", "asp", {{10, 1.0, 2.0, 0.80, 0, 0}, {20, 2.0, 4.0, 0.89, 0, 0}})};
  std::string header, bsp, ssp, asp;
  // The header and the three rows of a table (the rule skipped).
  const auto read_rows = [&](const std::string& table) {
    std::istringstream lines(table);
    std::string rule;
    for (std::string* line : {&header, &rule, &bsp, &ssp, &asp}) std::getline(lines, *line);
  };
  const std::string table = format_comparison_table(runs);
  read_rows(table);
  EXPECT_NE(header.find("s to 90.00%"), std::string::npos) << table;
  EXPECT_NE(header.find("epochs to"), std::string::npos) << table;
  const auto column = [&](const std::string& row, const std::string& title) {
    // The right-aligned cell that ends where the header's title ends.
    const std::size_t end = header.find(title) + title.size();
    const std::size_t begin = row.rfind(' ', end - 1) + 1;
    return row.substr(begin, end - begin);
  };
  EXPECT_EQ(bsp.substr(0, 10), "dense@bsp ");
  EXPECT_EQ(ssp.substr(0, 12), "dense@ssp:2 ");
  EXPECT_EQ(column(bsp, "s to 90.00%"), "8.0");
  EXPECT_EQ(column(ssp, "s to 90.00%"), "6.5");
  EXPECT_EQ(column(asp, "s to 90.00%"), "-");
  EXPECT_EQ(column(bsp, "epochs to"), "2.00");
  EXPECT_EQ(column(asp, "epochs to"), "-");
  EXPECT_EQ(run_labels(runs), (std::vector<std::string>{"dense@bsp", "dense@ssp:2", "dense@asp"}));

  // With a margin of 3.5 points the target is 86.5%: SSP reaches it at its
  // first evaluation, BSP and ASP at their second.
  const std::string margin = format_comparison_table(runs, 3.5);
  read_rows(margin);
  EXPECT_NE(header.find("s to 86.50%"), std::string::npos) << margin;
  EXPECT_EQ(column(bsp, "s to 86.50%"), "8.0");
  EXPECT_EQ(column(ssp, "s to 86.50%"), "3.0");
  EXPECT_EQ(column(asp, "s to 86.50%"), "4.0");
  EXPECT_THROW(format_comparison_table(runs, -1.0), InvalidArgument);
  EXPECT_THROW(format_comparison_table(runs, NAN), InvalidArgument);

  // Without summary.json the sync model comes from config.json.
  const RunSummary derived = derive_summary(
      json{{"method", "topk"}, {"servers", 1}, {"sync", "ssp"}, {"staleness", 3}}, {}, {});
  EXPECT_EQ(run_name(derived), "topk@ssp:3");
  EXPECT_EQ(run_name(derive_summary(json{{"method", "topk"}, {"servers", 1}}, {}, {})), "topk@bsp");
  EXPECT_EQ(run_name(derive_summary(json{{"method", "topk"}}, {}, {})), "topk");
}

// gnuplot-nox is part of the setup; its absence is a failure, not a skip.
void expect_png(const fs::path& path) {
  ASSERT_TRUE(fs::is_regular_file(path)) << path;
  const std::string bytes = read_text(path);
  ASSERT_GT(bytes.size(), 1000u) << path;
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << path;
}

TEST_F(ReportTest, WritesPngPlotsWithGnuplot) {
  ASSERT_EQ(std::system("command -v gnuplot >/dev/null 2>&1"), 0)
      << "gnuplot is not installed: `apt-get install gnuplot-nox` (the setup script installs "
         "it); the report plots need it";
  std::vector<RunData> runs = {load_run(write_run("dense run", "dense", 1.0, 4e6)),
                               load_run(write_run("top k's run", "topk", 0.01, 8e4)),
                               load_run(write_run("partial", "exdyna", 0.01, 6e4, 30, false))};
  const fs::path out = root_ / "compare plots";
  const std::vector<fs::path> pngs = write_plots(runs, out);
  std::vector<std::string> names;
  for (const fs::path& png : pngs) names.push_back(png.filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"accuracy_vs_time.png", "accuracy_vs_epoch.png",
                                             "density_ratio.png", "time_breakdown.png",
                                             "bytes_per_step.png"}));
  for (const fs::path& png : pngs) expect_png(png);
  for (const char* file : {"plots.gp", "breakdown.dat", "run0_steps.dat", "run2_evals.dat"}) {
    EXPECT_TRUE(fs::is_regular_file(out / file)) << file;
  }
  EXPECT_NE(read_text(out / "breakdown.dat").find("\"exdyna\""), std::string::npos);
  // The accuracy axis starts a point below the lowest halfway accuracy (the
  // partial run's second of three evaluations, 59.5%), and the first run's
  // final accuracy is drawn as the target.
  const std::string script = read_text(out / "plots.gp");
  EXPECT_NE(script.find("set yrange [58:*]"), std::string::npos) << script;
  EXPECT_NE(script.find("dense: final 81.23%"), std::string::npos) << script;

  // One run, plotted into its own directory: full axis, no target line.
  const std::vector<fs::path> single = write_plots(std::span(runs).subspan(1, 1), runs[1].dir);
  EXPECT_EQ(single.size(), 5u);
  for (const fs::path& png : single) expect_png(png);
  const std::string single_script = read_text(runs[1].dir / "plots.gp");
  EXPECT_EQ(single_script.find("final "), std::string::npos) << single_script;
}

TEST_F(ReportTest, PlotsShowTheOverlapOfPipelinedRuns) {
  ASSERT_EQ(std::system("command -v gnuplot >/dev/null 2>&1"), 0) << "gnuplot is not installed";
  const std::vector<RunData> runs = {
      load_run(write_run("pipelined", "dense", 1.0, 4e6, 60, true, 0.01)),
      load_run(write_run("after backward", "dense", 1.0, 4e6))};
  EXPECT_DOUBLE_EQ(runs[0].steps[0].overlapped_s, 0.01);
  EXPECT_TRUE(std::isnan(runs[1].steps[0].overlapped_s));
  const fs::path out = root_ / "overlap plots";
  const std::vector<fs::path> pngs = write_plots(runs, out);
  ASSERT_EQ(pngs.back().filename(), "overlap.png");
  expect_png(pngs.back());
  // Column 8 of the step data: overlapped / (selection + exchange) = 0.25.
  std::istringstream steps(read_text(out / "run0_steps.dat"));
  std::string line;
  while (std::getline(steps, line) && line.starts_with("#")) {
  }
  std::istringstream fields(line);
  std::vector<std::string> columns;
  for (std::string field; fields >> field;) columns.push_back(field);
  ASSERT_EQ(columns.size(), 12u) << line;
  EXPECT_NEAR(std::stod(columns[7]), 0.25, 1e-12);
  EXPECT_NEAR(std::stod(columns[8]), 0.25, 1e-12);
  // The unpipelined run's overlap is NaN (a gap in the plot); no tables.
  EXPECT_NE(read_text(out / "run1_steps.dat").find(" NaN NaN 0 0 0\n"), std::string::npos);
}

TEST_F(ReportTest, PlotsSkipWhatARunHasNoDataFor) {
  const fs::path dir = root_ / "fresh";
  fs::create_directories(dir);
  write_json_atomically(dir / "config.json", json{{"method", "topk"}});
  append_line(dir / "metrics.jsonl", R"({"kind":"step","step":0,"density_ratio":1.1})");
  const std::vector<RunData> runs = {load_run(dir)};
  const std::vector<fs::path> pngs = write_plots(runs, dir / "plots");
  ASSERT_EQ(pngs.size(), 1u);
  EXPECT_EQ(pngs[0].filename(), "density_ratio.png");
  expect_png(pngs[0]);
}

TEST_F(ReportTest, MissingGnuplotSaysHowToInstallIt) {
  const std::vector<RunData> runs = {load_run(write_run("r", "topk", 0.01, 1))};
  try {
    write_plots(runs, root_ / "out", PlotOptions{.gnuplot = "no-such-gnuplot-binary"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install gnuplot-nox"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(write_plots({}, root_ / "out"), InvalidArgument);
}

// report --timeline's figures from a trace whose answers are known: rank 1
// computes longer at both steps, rank 0 waits 3 ms on it, and rank 0's
// exchange on its own thread runs 2 of its 4 ms beside its compute.
TEST(TimelineSummary, GivesTimesWaitsTheSlowestRankAndTheOverlap) {
  const auto span = [](int pid, int tid, const char* name, const char* cat, double ts_us,
                       double dur_us, nlohmann::json args) {
    return nlohmann::json{{"ph", "X"},  {"pid", pid},  {"tid", tid},    {"name", name},
                          {"cat", cat}, {"ts", ts_us}, {"dur", dur_us}, {"args", args}};
  };
  nlohmann::json events = nlohmann::json::array(
      {{{"ph", "M"}, {"pid", 0}, {"name", "process_name"}, {"args", {{"name", "rank 0"}}}},
       span(0, 0, "buckets ready", "compute", 0, 10000, {{"step", 0}}),
       span(0, 1, "group exchange", "sync", 8000, 4000, {{"step", 0}}),
       span(0, 1, "wait recv", "wait", 9000, 3000, {{"step", 0}, {"peer", 1}, {"bytes", 64}}),
       span(1, 0, "buckets ready", "compute", 0, 12000, {{"step", 0}}),
       span(1, 1, "group exchange", "sync", 12000, 1000, {{"step", 0}}),
       span(0, 0, "buckets ready", "compute", 20000, 5000, {{"step", 1}}),
       span(1, 0, "buckets ready", "compute", 20000, 6000, {{"step", 1}}),
       {{"ph", "C"}, {"pid", 0}, {"name", "K/k"}, {"ts", 1.0}, {"args", {{"value", 1.0}}}}});
  const report::TimelineSummary s = report::summarize_timeline({{"traceEvents", events}});
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_NEAR(s.ranks[0].seconds.at("buckets ready"), 0.015, 1e-12);
  EXPECT_NEAR(s.ranks[0].wait_s, 0.003, 1e-12);
  EXPECT_EQ(s.ranks[0].waited_most_on, 1);
  EXPECT_EQ(s.ranks[1].waited_most_on, -1);
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.slowest_steps.at(1), 2);
  // 2 of rank 0's 4 ms and none of rank 1's 1 ms ran beside compute.
  EXPECT_NEAR(s.overlap_fraction, 2.0 / 5.0, 1e-12);
  EXPECT_NEAR(s.ranks[0].overlap_fraction, 0.5, 1e-12);
  EXPECT_EQ(s.ranks[1].overlap_fraction, 0.0);
  const std::string text = report::format_timeline_summary(s);
  EXPECT_NE(text.find("rank 1 (0.003 s)"), std::string::npos) << text;
  EXPECT_NE(text.find("overlap: 40.0%"), std::string::npos) << text;
  EXPECT_THROW(report::summarize_timeline(nlohmann::json::object()), InvalidArgument);

  // The PNG of the first steps, a data file per category drawn.
  const testing::ScratchDir scratch("timeline_plot");
  const fs::path png = report::write_timeline_plot({{"traceEvents", events}}, scratch.path(), 1);
  EXPECT_GT(fs::file_size(png), 0u);
  for (const char* category : {"compute", "sync", "wait"}) {
    EXPECT_TRUE(fs::exists(scratch.path() / fmt::format("timeline_{}.dat", category))) << category;
  }
  EXPECT_THROW(
      report::write_timeline_plot({{"traceEvents", nlohmann::json::array()}}, scratch.path()),
      InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm::report
