// The Ok-Topk pattern (collectives/ok_topk.cc) on thread ranks: the average
// holds exactly the survivors' sums, each rank's residual gives up exactly
// its values there, about as many entries survive as one rank selected,
// each rank's traffic stays O(k) as n grows and stays balanced when the
// selections crowd into one part of the vector, and what it cannot carry is
// refused.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_message.h"
#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"

namespace sparsecomm {
namespace {

using testing::error_message;

constexpr std::chrono::milliseconds kTimeout{20000};

// Multiples of 1/4 in [-1.75, 1.75] (never 0): every sum of them is exact.
float value_at(int rank, std::size_t i) {
  const Philox rng(99);
  return static_cast<float>(static_cast<int>(rng.below(14, static_cast<std::uint64_t>(rank), i)) -
                            7 + (rng.below(14, static_cast<std::uint64_t>(rank), i) >= 7 ? 1 : 0)) /
         4.0f;
}

// `count` distinct ascending indices below `limit`, drawn for `rank`.
std::vector<Index> selection_of(int rank, std::size_t count, std::size_t limit) {
  const Philox rng(7);
  std::vector<Index> out;
  for (std::size_t j = 0; out.size() < count; ++j) {
    out.push_back(static_cast<Index>(rng.below(limit, static_cast<std::uint64_t>(rank), j)));
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return out;
}

struct Outcome {
  std::vector<float> out;
  std::vector<float> residual;
  std::vector<Index> transmitted;
  ExchangeResult result;
};

Outcome exchange_once(Communicator& comm, std::size_t numel, std::span<const Index> chosen) {
  Outcome o;
  o.residual.resize(numel);
  for (std::size_t i = 0; i < numel; ++i) o.residual[i] = value_at(comm.rank(), i);
  o.out.assign(numel, -1.0f);
  SparseSelection selection;
  selection.indices.assign(chosen.begin(), chosen.end());
  const auto exchanger = make_sparse_exchange(ExchangePattern::kOkTopk, {});
  exchanger->exchange(comm, selection, o.residual, o.out, o.result);
  o.transmitted.assign(o.result.transmitted.begin(), o.result.transmitted.end());
  return o;
}

TEST(OkTopk, TheAverageHoldsTheSurvivorsSumsAndEachResidualGivesUpExactlyItsOwn) {
  for (const int n : {1, 2, 3, 4, 7, 8}) {
    run_thread_world(
        n,
        [&](Communicator& comm) {
          constexpr std::size_t kNumel = 5000;
          constexpr std::size_t kCount = 50;
          const std::vector<Index> mine = selection_of(comm.rank(), kCount, kNumel);
          const Outcome o = exchange_once(comm, kNumel, mine);
          // The survivors: where the average is not 0.
          std::vector<double> sums(kNumel, 0.0);
          std::vector<char> in_union(kNumel, 0);
          for (int q = 0; q < n; ++q) {
            for (const Index i : selection_of(q, kCount, kNumel)) {
              sums[i] += value_at(q, i);
              in_union[i] = 1;
            }
          }
          std::size_t survivors = 0;
          for (std::size_t i = 0; i < kNumel; ++i) {
            if (o.out[i] == 0.0f) continue;
            ++survivors;
            ASSERT_TRUE(in_union[i]) << "rank " << comm.rank() << ": " << i;
            EXPECT_EQ(o.out[i], static_cast<float>(sums[i] / n)) << i;
          }
          EXPECT_LE(survivors, o.result.union_size);
          // About as many survive as one rank selected (each owner rounds up).
          EXPECT_GE(o.result.union_size, std::min<std::size_t>(kCount, survivors));
          EXPECT_LE(o.result.union_size, kCount + static_cast<std::size_t>(n));
          // Error feedback: a - what was sent, and only at this rank's own indices.
          std::size_t t = 0;
          for (std::size_t i = 0; i < kNumel; ++i) {
            const bool sent = t < o.transmitted.size() && o.transmitted[t] == i;
            if (sent) ++t;
            EXPECT_EQ(o.residual[i], sent ? 0.0f : value_at(comm.rank(), i)) << i;
          }
          for (const Index i : o.transmitted) {
            EXPECT_TRUE(std::binary_search(mine.begin(), mine.end(), i));
          }
          EXPECT_EQ(o.result.counts, std::vector<std::size_t>(static_cast<std::size_t>(n), kCount));
        },
        kTimeout);
  }
}

TEST(OkTopk, EveryRankSendsOfOrderKAsTheRanksGrowAndTheRegionsFollowTheSelections) {
  std::vector<std::uint64_t> sent_at;
  for (const int n : {4, 16}) {
    std::vector<std::uint64_t> received(static_cast<std::size_t>(n));
    std::uint64_t most_sent = 0;
    run_thread_world(
        n,
        [&](Communicator& comm) {
          // Every rank's 2000 picks crowd into the first tenth of d.
          const std::vector<Index> mine = selection_of(comm.rank(), 2000, 100'000);
          const Outcome o = exchange_once(comm, 1'000'000, mine);
          received[static_cast<std::size_t>(comm.rank())] = o.result.bytes_received;
          if (comm.rank() == 0) most_sent = o.result.bytes_sent;
        },
        kTimeout);
    const double mean = std::accumulate(received.begin(), received.end(), 0.0) / n;
    const auto most = *std::max_element(received.begin(), received.end());
    EXPECT_LT(static_cast<double>(most), 2.0 * mean) << n << " ranks: an owner got far more";
    sent_at.push_back(most_sent);
  }
  // 4 times the ranks: far less than 4 times the bytes (an allgather's grow
  // with n k); the small collectives add O(n) bytes.
  EXPECT_LT(sent_at[1], 3 * sent_at[0] / 2);
}

TEST(OkTopk, WhatItCannotCarryIsRefused) {
  ExchangeOptions fp16;
  fp16.values = ValueEncoding::kFloat16;
  EXPECT_NE(error_message([&] {
              make_sparse_exchange(ExchangePattern::kOkTopk, fp16);
            }).find("use values=fp32"),
            std::string::npos);
  EXPECT_EQ(parse_exchange_pattern("ok-topk"), ExchangePattern::kOkTopk);
  run_thread_world(
      2,
      [&](Communicator& comm) {
        SparseSelection selection;
        selection.known.push_back(Range{10, 20});
        std::vector<float> a(100, 1.0f), out(100);
        ExchangeResult result;
        const auto exchanger = make_sparse_exchange(ExchangePattern::kOkTopk, {});
        EXPECT_NE(error_message([&] {
                    exchanger->exchange(comm, selection, a, out, result);
                  }).find("no known ranges"),
                  std::string::npos);
      },
      kTimeout);
}

}  // namespace
}  // namespace sparsecomm
