#include "sparsecomm/traces/gradient_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

double rms(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  return std::sqrt(sum / static_cast<double>(v.size()));
}

SyntheticStreamOptions small_options() {
  SyntheticStreamOptions options;
  options.numel = 200000;
  options.drift_steps = 100;
  return options;
}

TEST(SyntheticStream, IsDeterministicPerRankAndStep) {
  const auto a = make_synthetic_stream(small_options());
  const auto b = make_synthetic_stream(small_options());
  std::vector<float> x(a->numel()), y(a->numel()), z(a->numel());
  a->fill(1, 5, x);
  b->fill(1, 5, y);
  EXPECT_EQ(x, y);
  a->fill(2, 5, z);
  EXPECT_NE(x, z) << "ranks must differ";
  a->fill(1, 6, z);
  EXPECT_NE(x, z) << "steps must differ";
}

TEST(SyntheticStream, LayersTileTheVector) {
  const auto stream = make_synthetic_stream(small_options());
  std::size_t next = 0;
  for (const LayerSpan& layer : stream->layers()) {
    EXPECT_EQ(layer.offset, next);
    EXPECT_GT(layer.size, 0u);
    next += layer.size;
  }
  EXPECT_EQ(next, stream->numel());
}

TEST(SyntheticStream, ScaleDriftsByTheRequestedFactor) {
  const auto stream = make_synthetic_stream(small_options());
  std::vector<float> start(stream->numel()), end(stream->numel()), later(stream->numel());
  stream->fill(0, 0, start);
  stream->fill(0, 100, end);
  stream->fill(0, 150, later);
  // RMS over 200k heavy-tailed elements fluctuates by a few percent.
  EXPECT_NEAR(rms(start) / rms(end), 10.0, 1.5);
  EXPECT_NEAR(rms(end) / rms(later), 1.0, 0.15) << "the drift stops after drift_steps";
}

TEST(SyntheticStream, EqualPartitionsCarryUnequalShares) {
  // The regional skew must make equal contiguous quarters unbalanced in the
  // number of large elements (what ExDyna's balancer exists for).
  auto options = small_options();
  const auto stream = make_synthetic_stream(options);
  std::vector<float> g(stream->numel());
  stream->fill(0, 0, g);
  std::vector<float> magnitudes(g.size());
  std::transform(g.begin(), g.end(), magnitudes.begin(), [](float x) { return std::fabs(x); });
  std::vector<float> sorted = magnitudes;
  const std::size_t k = g.size() / 100;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end(),
                   std::greater<>());
  const float threshold = sorted[k];
  std::vector<int> per_quarter(4, 0);
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (magnitudes[i] > threshold) ++per_quarter[i * 4 / g.size()];
  }
  const int max = *std::max_element(per_quarter.begin(), per_quarter.end());
  const int sum = std::accumulate(per_quarter.begin(), per_quarter.end(), 0);
  EXPECT_GT(4.0 * max / sum - 1.0, 0.2) << "imbalance of equal partitions";
}

TEST(SyntheticStream, RejectsBadOptions) {
  auto options = small_options();
  options.shared_fraction = 1.5;
  EXPECT_THROW(make_synthetic_stream(options), InvalidArgument);
  options = small_options();
  options.layers = 0;
  EXPECT_THROW(make_synthetic_stream(options), InvalidArgument);
  const auto stream = make_synthetic_stream(small_options());
  std::vector<float> wrong(10);
  EXPECT_THROW(stream->fill(0, 0, wrong), InvalidArgument);
}

class TraceTest : public ::testing::Test {
 protected:
  // Records 3 steps of 2 ranks from the synthetic stream.
  void record() {
    auto options = small_options();
    options.numel = 1000;
    source_ = make_synthetic_stream(options);
    std::vector<LayerSpan> layers(source_->layers().begin(), source_->layers().end());
    TraceWriter writer(directory_.string(), source_->numel(), 2, 3, layers, "test");
    std::vector<float> g(source_->numel());
    for (int step = 0; step < 3; ++step) {
      for (int rank = 0; rank < 2; ++rank) {
        source_->fill(rank, step, g);
        writer.append(rank, g);
      }
    }
    EXPECT_THROW(writer.append(0, g), InvalidArgument) << "all steps written";
  }

  const testing::ScratchDir scratch_{"trace-" + testing::current_test_name()};
  const fs::path directory_ = scratch_.path();
  std::unique_ptr<GradientStream> source_;
};

TEST_F(TraceTest, RoundTripsExactly) {
  record();
  const auto trace = open_trace(directory_.string());
  EXPECT_EQ(trace->numel(), 1000u);
  EXPECT_EQ(trace->world(), 2);
  EXPECT_EQ(trace->steps(), 3);
  ASSERT_EQ(trace->layers().size(), source_->layers().size());
  std::vector<float> expected(1000), got(1000);
  for (int step = 0; step < 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      source_->fill(rank, step, expected);
      trace->fill(rank, step, got);
      EXPECT_EQ(got, expected) << "rank " << rank << " step " << step;
    }
  }
  EXPECT_THROW(trace->fill(2, 0, got), InvalidArgument);
  EXPECT_THROW(trace->fill(0, 3, got), InvalidArgument);
}

TEST_F(TraceTest, ATruncatedRankFileIsRefusedWithItsPath) {
  record();
  fs::resize_file(directory_ / "rank1.f32", 1000 * sizeof(float) * 2 + 7);
  try {
    open_trace(directory_.string());
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank1.f32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST_F(TraceTest, MissingOrCorruptMetaIsRefused) {
  EXPECT_THROW(open_trace(directory_.string()), InvalidArgument);
  record();
  std::ofstream(directory_ / "meta.json") << "{\"numel\": 1000, \"world\": ";
  EXPECT_THROW(open_trace(directory_.string()), InvalidArgument);
  std::ofstream(directory_ / "meta.json") << R"({"numel": 1000, "world": 3, "steps": 3})";
  EXPECT_THROW(open_trace(directory_.string()), InvalidArgument) << "rank2.f32 is missing";
}

// The meta.json parser on its own (the byte-span entry point open_trace
// calls): every defect is an InvalidArgument naming the input.
TEST(TraceMetaParse, AcceptsAValidDescription) {
  const TraceMeta meta = parse_trace_meta(
      R"({"numel": 10, "world": 2, "steps": 3, "source": "cnn",
          "layers": [{"name": "a", "offset": 0, "size": 4}, {"name": "b", "offset": 4, "size": 6}]})",
      "m");
  EXPECT_EQ(meta.numel, 10u);
  EXPECT_EQ(meta.world, 2);
  EXPECT_EQ(meta.steps, 3);
  EXPECT_EQ(meta.source, "cnn");
  ASSERT_EQ(meta.layers.size(), 2u);
  EXPECT_EQ(meta.layers[1].offset, 4u);
  const TraceMeta plain = parse_trace_meta(R"({"numel": 5, "world": 1, "steps": 1})", "m");
  ASSERT_EQ(plain.layers.size(), 1u);
  EXPECT_EQ(plain.layers[0].name, "all");
  EXPECT_EQ(plain.layers[0].size, 5u);
}

TEST(TraceMetaParse, RefusesEachDefect) {
  struct Case {
    const char* text;
    const char* expected;
  };
  const Case cases[] = {
      {"", "not a valid trace description"},
      {"[1, 2]", "not a valid trace description"},
      {R"({"numel": 10, "world": 2})", "not a valid trace description"},
      {R"({"numel": "ten", "world": 2, "steps": 3})", "expected a whole number"},
      // Floats and integers past the field's type are refused before any cast
      // (a float past the range would be undefined behaviour; fuzz_trace_meta).
      {R"({"numel": 2.2e78, "world": 2, "steps": 3})", "\"numel\" is 2.2e+78; expected a whole"},
      {R"({"numel": 10.5, "world": 2, "steps": 3})", "expected a whole number"},
      {R"({"numel": 10, "world": 3000000000, "steps": 3})", "\"world\" is 3000000000"},
      {R"({"numel": 10, "world": 2, "steps": 1e300})", "\"steps\" is 1e+300"},
      {R"({"numel": 10, "world": 1, "steps": 1, "layers": [{"name": "a", "offset": 0, "size": -4}]})",
       "\"size\" is -4"},
      {R"({"numel": 10, "world": 0, "steps": 3})", "needs world >= 1"},
      {R"({"numel": 10, "world": 2, "steps": 0})", "needs world >= 1"},
      {R"({"numel": 5000000000, "world": 2, "steps": 3})", "numel < 2^32"},
      {R"({"numel": -1, "world": 2, "steps": 3})", "expected a whole number from 0"},
      {R"({"numel": 4000000000, "world": 1, "steps": 9000000000000000000})", "do not fit"},
      {R"({"numel": 10, "world": 1, "steps": 1, "layers": [{"name": "a", "offset": 2, "size": 8}]})",
       "starts at 2"},
      {R"({"numel": 10, "world": 1, "steps": 1, "layers": [{"name": "a", "offset": 0, "size": 4}]})",
       "layers cover 4 elements, numel is 10"},
      {R"({"numel": 10, "world": 1, "steps": 1,
           "layers": [{"name": "a", "offset": 0, "size": 4},
                      {"name": "b", "offset": 4, "size": 18446744073709551615}]})",
       "runs past numel"},
      {R"({"numel": 10, "world": 1, "steps": 1, "layers": [{"name": "a", "offset": 0}]})",
       "not a valid trace description"},
  };
  for (const Case& c : cases) {
    try {
      parse_trace_meta(c.text, "meta-under-test");
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(c.expected), std::string::npos) << c.text << " -> " << message;
      EXPECT_NE(message.find("meta-under-test"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace sparsecomm
