#pragma once
// Checks of row_sparse_sum shared by the thread suite (row_exchange_test.cc)
// and the MPI suite (row_exchange_mpi_test.cc): every rank builds its own
// row set from a seed, and every rank can rebuild every other rank's, so
// the expected sum is computed locally, in rank order, bit for bit.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/collectives/row_exchange.h"
#include "sparsecomm/comm/communicator.h"

namespace sparsecomm::testing {

enum class RowSet {
  kOverlapping,  // each rank a random set, plus a set common to all
  kDisjoint,     // every row belongs to one random rank
  kEmptyOnSome,  // odd ranks touch nothing
  kEmptyOnAll,   // nobody touches anything
  kAll,          // every rank touches every row
};

inline std::string row_set_name(RowSet set) {
  switch (set) {
    case RowSet::kOverlapping:
      return "overlapping";
    case RowSet::kDisjoint:
      return "disjoint";
    case RowSet::kEmptyOnSome:
      return "empty-on-some";
    case RowSet::kEmptyOnAll:
      return "empty-on-all";
    case RowSet::kAll:
      return "all";
  }
  return "?";
}

inline std::uint64_t row_hash(std::uint64_t seed, std::uint64_t a, std::uint64_t b,
                              std::uint64_t c) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ a * 0xBF58476D1CE4E5B9ull ^
                    b * 0x94D049BB133111EBull ^ c * 0xD6E8FEB86659FD93ull;
  x ^= x >> 31;
  x *= 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

struct RowCase {
  std::size_t rows = 0;
  std::size_t width = 1;
  RowSet set = RowSet::kOverlapping;
  std::uint64_t seed = 1;
};

inline bool touches(const RowCase& c, int n, int rank, std::size_t row) {
  const auto r = static_cast<std::uint64_t>(rank);
  switch (c.set) {
    case RowSet::kOverlapping:
      return row_hash(c.seed, 1, r, row) % 5 == 0 || row_hash(c.seed, 2, 0, row) % 7 == 0;
    case RowSet::kDisjoint:
      return row_hash(c.seed, 3, 0, row) % static_cast<std::uint64_t>(n) == r &&
             row_hash(c.seed, 4, 0, row) % 3 == 0;
    case RowSet::kEmptyOnSome:
      return r % 2 == 0 && row_hash(c.seed, 1, r, row) % 4 == 0;
    case RowSet::kEmptyOnAll:
      return false;
    case RowSet::kAll:
      return true;
  }
  return false;
}

// Rank `rank`'s gradient: its touched rows, values with fractional bits so
// the order of additions shows in the result.
inline RowSparse rank_rows(const RowCase& c, int n, int rank) {
  RowSparse g;
  g.reset(c.rows, c.width);
  for (std::size_t row = 0; row < c.rows; ++row) {
    if (!touches(c, n, rank, row)) continue;
    g.ids.push_back(static_cast<Index>(row));
    for (std::size_t k = 0; k < c.width; ++k) {
      const std::uint64_t h = row_hash(c.seed, 5, static_cast<std::uint64_t>(rank), row * 131 + k);
      g.values.push_back(static_cast<float>(static_cast<double>(h % 2000001) / 1000.0 - 1000.0) /
                         3.0f);
    }
  }
  return g;
}

// `values` as the receivers of their `encoding` see them.
inline void round_through(ValueEncoding encoding, UninitVector<float>& values) {
  std::vector<std::byte> wire(values.size() * fixed_value_bytes(encoding));
  encode_values(values, encoding, wire);
}

// The sum every rank must end with: each touched row, rounded to the value
// encoding, summed in rank order from 0; with `round_sum` (the split
// all-reduce, whose owners send their sums in the encoding) rounded again.
inline RowSparse expected_sum(const RowCase& c, int n,
                              ValueEncoding encoding = ValueEncoding::kFloat32,
                              bool round_sum = false) {
  std::vector<RowSparse> all;
  for (int r = 0; r < n; ++r) {
    all.push_back(rank_rows(c, n, r));
    round_through(encoding, all.back().values);
  }
  RowSparse sum;
  sum.reset(c.rows, c.width);
  std::vector<float> row(c.width);
  for (std::size_t id = 0; id < c.rows; ++id) {
    bool touched = false;
    std::fill(row.begin(), row.end(), 0.0f);
    for (const RowSparse& g : all) {
      const auto it = std::lower_bound(g.ids.begin(), g.ids.end(), static_cast<Index>(id));
      if (it == g.ids.end() || *it != id) continue;
      touched = true;
      const auto j = static_cast<std::size_t>(it - g.ids.begin());
      for (std::size_t k = 0; k < c.width; ++k) row[k] += g.values[j * c.width + k];
    }
    if (!touched) continue;
    sum.ids.push_back(static_cast<Index>(id));
    sum.values.insert(sum.values.end(), row.begin(), row.end());
  }
  if (round_sum) round_through(encoding, sum.values);
  return sum;
}

inline std::vector<RowCase> row_cases(int n) {
  std::vector<RowCase> cases;
  std::uint64_t seed = 7;
  // 0 rows, fewer rows than ranks (empty ranges), a table of several ranges.
  for (const std::size_t rows :
       {std::size_t{0}, static_cast<std::size_t>(n > 1 ? n - 1 : 1), std::size_t{997}}) {
    for (const std::size_t width : {std::size_t{1}, std::size_t{3}, std::size_t{16}}) {
      for (const RowSet set : {RowSet::kOverlapping, RowSet::kDisjoint, RowSet::kEmptyOnSome,
                               RowSet::kEmptyOnAll, RowSet::kAll}) {
        cases.push_back({rows, width, set, seed++});
      }
    }
  }
  return cases;
}

// Every case with both methods and every value encoding: ids and values
// bit-identical to the expected sum, the report's per-rank counts and union
// right, and a 16-bit encoding sending fewer bytes than fp32.
inline void check_row_sparse_sums(Communicator& comm) {
  const int n = comm.size();
  for (const RowCase& c : row_cases(n)) {
    const RowSparse mine = rank_rows(c, n, comm.rank());
    for (const RowExchange method : {RowExchange::kAllgather, RowExchange::kSparseAllreduce}) {
      std::uint64_t fp32_bytes = 0;
      for (const ValueEncoding encoding :
           {ValueEncoding::kFloat32, ValueEncoding::kBFloat16, ValueEncoding::kFloat16}) {
        const RowSparse want =
            expected_sum(c, n, encoding, method == RowExchange::kSparseAllreduce);
        const std::string what = fmt::format(
            "n {} rank {} rows {} width {} {} {} {}", n, comm.rank(), c.rows, c.width,
            row_set_name(c.set), row_exchange_name(method), value_encoding_name(encoding));
        RowSparse sum;
        RowExchangeReport report;
        row_sparse_sum(comm, mine, method, sum, &report, encoding);
        if (encoding == ValueEncoding::kFloat32) {
          fp32_bytes = report.bytes_sent;
        } else if (mine.touched() > 0 && n > 1 && method == RowExchange::kAllgather) {
          EXPECT_LT(report.bytes_sent, fp32_bytes) << what;
        }
        EXPECT_EQ(sum.rows, c.rows) << what;
        EXPECT_EQ(sum.width, c.width) << what;
        ASSERT_EQ(std::vector<Index>(sum.ids.begin(), sum.ids.end()),
                  std::vector<Index>(want.ids.begin(), want.ids.end()))
            << what;
        ASSERT_EQ(sum.values.size(), want.values.size()) << what;
        EXPECT_TRUE(std::equal(sum.values.begin(), sum.values.end(), want.values.begin(),
                               [](float a, float b) {
                                 return std::bit_cast<std::uint32_t>(a) ==
                                        std::bit_cast<std::uint32_t>(b);
                               }))
            << what << ": the sums differ in some bit";
        EXPECT_EQ(report.union_rows, want.touched()) << what;
        ASSERT_EQ(report.touched.size(), static_cast<std::size_t>(n)) << what;
        for (int q = 0; q < n; ++q) {
          EXPECT_EQ(report.touched[q], rank_rows(c, n, q).touched()) << what << " rank " << q;
        }
        if (n > 1 && want.touched() > 0) {
          EXPECT_GT(report.bytes_received, 0u) << what;
        }
      }
    }
  }
}

// The row owners' push and pull, every case and value encoding:
//  - push: each rank's `owned` is the expected sum's rows of its range, bit
//    for bit (the sum in rank order of the rounded rows);
//  - pull: each rank wants its own row set of a table whose row r holds
//    known values; every wanted row arrives, rounded once by the encoding.
inline void check_row_owners(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (const RowCase& c : row_cases(n)) {
    const RowSparse mine = rank_rows(c, n, r);
    const std::size_t lo = row_owner_begin(c.rows, n, r);
    const std::size_t hi = row_owner_begin(c.rows, n, r + 1);
    // The table the pull reads: row i, column k holds a value with
    // fractional bits (so rounding shows).
    const auto table_value = [&](std::size_t i, std::size_t k) {
      return static_cast<float>(i * 1000 + k) / 7.0f - 3.0f;
    };
    std::vector<float> shard;
    for (std::size_t i = lo; i < hi; ++i) {
      for (std::size_t k = 0; k < c.width; ++k) shard.push_back(table_value(i, k));
    }
    for (const ValueEncoding encoding :
         {ValueEncoding::kFloat32, ValueEncoding::kBFloat16, ValueEncoding::kFloat16}) {
      const std::string what =
          fmt::format("n {} rank {} rows {} width {} {} {}", n, r, c.rows, c.width,
                      row_set_name(c.set), value_encoding_name(encoding));
      const RowSparse sum = expected_sum(c, n, encoding);
      RowSparse want;
      want.reset(c.rows, c.width);
      for (std::size_t j = 0; j < sum.touched(); ++j) {
        if (sum.ids[j] < lo || sum.ids[j] >= hi) continue;
        want.ids.push_back(sum.ids[j]);
        want.values.insert(want.values.end(), sum.row(j).begin(), sum.row(j).end());
      }
      RowSparse owned;
      RowExchangeReport report;
      push_rows_to_owners(comm, mine, owned, &report, encoding);
      ASSERT_EQ(std::vector<Index>(owned.ids.begin(), owned.ids.end()),
                std::vector<Index>(want.ids.begin(), want.ids.end()))
          << what;
      EXPECT_TRUE(std::equal(
          owned.values.begin(), owned.values.end(), want.values.begin(), want.values.end(),
          [](float a, float b) {
            return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
          }))
          << what << ": the owned sums differ in some bit";
      EXPECT_EQ(report.union_rows, want.touched()) << what;

      RowSparse pulled;
      report = {};
      pull_rows_from_owners(comm, mine.ids, shard, c.rows, c.width, pulled, &report, encoding);
      ASSERT_EQ(std::vector<Index>(pulled.ids.begin(), pulled.ids.end()),
                std::vector<Index>(mine.ids.begin(), mine.ids.end()))
          << what;
      UninitVector<float> expected;
      for (const Index id : mine.ids) {
        for (std::size_t k = 0; k < c.width; ++k) expected.push_back(table_value(id, k));
      }
      round_through(encoding, expected);
      EXPECT_TRUE(
          std::equal(pulled.values.begin(), pulled.values.end(), expected.begin(), expected.end(),
                     [](float a, float b) {
                       return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
                     }))
          << what << ": a pulled row differs in some bit";
      // Rows from other ranks' ranges arrive over the wire.
      const bool remote = std::any_of(mine.ids.begin(), mine.ids.end(),
                                      [&](Index id) { return id < lo || id >= hi; });
      if (remote) {
        EXPECT_GT(report.bytes_received, 0u) << what;
      }
    }
  }
}

}  // namespace sparsecomm::testing
