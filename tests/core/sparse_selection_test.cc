// SparseSelection's own operations: the checks every consumer relies on (the
// exchanges, SelectionStep, the parameter-server push) and the writing-out
// of known ranges into explicit entries.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_message.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm {
namespace {

using testing::error_message;

SparseSelection selection(std::vector<Index> indices, std::vector<float> values,
                          std::vector<Range> known = {}) {
  SparseSelection s;
  s.indices.assign(indices.begin(), indices.end());
  s.values.assign(values.begin(), values.end());
  s.known = std::move(known);
  return s;
}

TEST(SparseSelection, KnownRangesAreWrittenOutInOrderWithTheirAccumulatedValues) {
  const std::vector<float> accumulated = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const SparseSelection sel = selection({0, 5, 9}, {-1, -5, -9}, {{2, 4}, {6, 7}});
  SparseSelection out;
  out.known = {{0, 1}};  // replaced
  sel.expand_known(accumulated, out);
  EXPECT_EQ(std::vector<Index>(out.indices.begin(), out.indices.end()),
            (std::vector<Index>{0, 2, 3, 5, 6, 9}));
  EXPECT_EQ(std::vector<float>(out.values.begin(), out.values.end()),
            (std::vector<float>{-1, 2, 3, -5, 6, -9}));
  EXPECT_TRUE(out.known.empty());
  // No known ranges: the selection itself.
  selection({1, 2}, {7, 8}).expand_known(accumulated, out);
  EXPECT_EQ(out.size(), 2u);
  EXPECT_EQ(out.values[1], 8.0f);
}

TEST(SparseSelection, MalformedSelectionsAreRefusedSayingWhatIsWrong) {
  const std::vector<float> accumulated(10, 1.0f);
  SparseSelection out;
  auto message = [&](const SparseSelection& sel) {
    return error_message<InvalidArgument>([&] { sel.expand_known(accumulated, out); });
  };
  EXPECT_EQ(message(selection({3, 3}, {1, 1}))
                .rfind("the selection must be strictly "
                       "ascending indices below d = 10",
                       0),
            0u);
  EXPECT_NE(message(selection({10}, {1})).find("index 0 is 10"), std::string::npos);
  EXPECT_NE(message(selection({1}, {1}, {{5, 4}})).find("known ranges must be ascending"),
            std::string::npos);
  EXPECT_NE(message(selection({1}, {1}, {{4, 6}, {5, 8}})).find("follows a range ending at 6"),
            std::string::npos);
  EXPECT_NE(message(selection({5}, {1}, {{4, 6}}))
                .find("selected index 5 lies in the known "
                      "range [4, 6)"),
            std::string::npos);
  EXPECT_NE(message(selection({1, 2}, {1})).find("2 indices but 1 values"), std::string::npos);
  EXPECT_NO_THROW(selection({1, 7}, {}, {{2, 5}}).check(10));  // values unchecked there
}

// The walk over layers and gaps covers [0, numel) once, in order, and names a
// layer that overlaps the one before it or runs past the end.
TEST(LayersAndGaps, CoverTheVectorInOrderAndRefuseOverlaps) {
  const std::vector<LayerSpan> layers = {{"a", 2, 3, 0}, {"b", 5, 4, 2}, {"c", 12, 1, 0}};
  std::vector<std::string> seen;
  for_each_layer_and_gap("[t]", 15, layers,
                         [&](std::size_t begin, std::size_t end, const LayerSpan* layer) {
                           seen.push_back((layer != nullptr ? layer->name : std::string("gap")) +
                                          " " + std::to_string(begin) + "-" + std::to_string(end));
                         });
  EXPECT_EQ(seen, (std::vector<std::string>{"gap 0-2", "a 2-5", "gap 5-5", "b 5-9", "gap 9-12",
                                            "c 12-13", "gap 13-15"}));
  auto walk = [](std::vector<LayerSpan> spans, std::size_t numel) {
    return error_message([&] {
      for_each_layer_and_gap("[t]", numel, spans,
                             [](std::size_t, std::size_t, const LayerSpan*) {});
    });
  };
  EXPECT_EQ(walk({{"a", 0, 4, 0}, {"b", 3, 2, 0}}, 10),
            "[t] layer 'b' ([3, 5)) is not inside the 10-element gradient after the layers "
            "before it");
  EXPECT_NE(walk({{"a", 8, 4, 0}}, 10).find("layer 'a' ([8, 12))"), std::string::npos);
  EXPECT_NE(walk({{"a", 0, std::size_t{1} << 63, 0},
                  {"b", std::size_t{1} << 63, std::size_t{1} << 63, 0}},
                 10)
                .find("layer 'a'"),
            std::string::npos);
}

}  // namespace
}  // namespace sparsecomm
