// Row-sparse gradients: coalescing an uncoalesced gradient, and the
// checks every user of a RowSparse relies on.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/row_sparse.h"

namespace sparsecomm {
namespace {

TEST(RowSparse, CoalescingSumsRepeatedIdsInLookupOrder) {
  const std::vector<Index> ids{5, 2, 5, 9, 2, 5};
  const std::vector<float> rows{1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60};  // width 2
  RowSparse g;
  coalesce_rows(ids, rows, 10, 2, g);
  EXPECT_EQ(std::vector<Index>(g.ids.begin(), g.ids.end()), (std::vector<Index>{2, 5, 9}));
  EXPECT_EQ(std::vector<float>(g.values.begin(), g.values.end()),
            (std::vector<float>{2 + 5, 20 + 50, 1 + 3 + 6, 10 + 30 + 60, 4, 40}));
  EXPECT_NO_THROW(check_row_sparse(g, "coalesced"));
  // No lookups: an empty gradient of the table's shape.
  coalesce_rows({}, {}, 10, 2, g);
  EXPECT_EQ(g.touched(), 0u);
  EXPECT_EQ(g.rows, 10u);
}

TEST(RowSparse, CoalescingRejectsIdsOutsideTheTableAndSizesThatDisagree) {
  RowSparse g;
  const std::vector<Index> ids{1, 10};
  const std::vector<float> rows{1, 2};
  try {
    coalesce_rows(ids, rows, 10, 1, g);
    ADD_FAILURE() << "id 10 accepted for 10 rows";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lookup 1 has id 10"), std::string::npos) << e.what();
  }
  EXPECT_THROW(coalesce_rows(ids, rows, 20, 2, g), InvalidArgument);  // 2 lookups need 4 values
  EXPECT_THROW(coalesce_rows(ids, rows, 20, 0, g), InvalidArgument);  // no width
}

TEST(RowSparse, MalformedGradientsAreNamedWithTheFix) {
  RowSparse g;
  g.reset(10, 2);
  g.ids = {3, 2};
  g.values = {1, 1, 1, 1};
  try {
    check_row_sparse(g, "g");
    ADD_FAILURE() << "unsorted ids accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("coalesce_rows"), std::string::npos) << e.what();
  }
  g.ids = {2, 10};
  EXPECT_THROW(check_row_sparse(g, "g"), InvalidArgument);  // id 10 of 10 rows
  g.ids = {2, 3};
  g.values = {1, 1, 1};
  EXPECT_THROW(check_row_sparse(g, "g"), InvalidArgument);  // 3 values for 2 rows of 2
  g.values = {1, 1, 1, 1};
  EXPECT_NO_THROW(check_row_sparse(g, "g"));
  g.width = 0;
  g.values = {};
  g.ids = {};
  EXPECT_THROW(check_row_sparse(g, "g"), InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm
