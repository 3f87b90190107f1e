// SparsifyExchangeStep end to end on the thread backend: error-feedback conservation
// for every scheme, exchange pattern and value encoding on worlds of 1 to 8
// ranks; non-finite gradients handled alike on every rank; the metrics;
// Random-k's unbiased rescaling; resuming from saved state.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sync/sync_checks.h"

namespace sparsecomm::testing {
namespace {

constexpr std::chrono::milliseconds kTimeout{20000};
const int kWorlds[] = {1, 2, 3, 4, 7, 8};

std::vector<SyncCase> all_cases() {
  std::vector<SyncCase> cases = scheme_pattern_cases();
  // Other memories and options through the same checks.
  cases.push_back({"topk", "allgather", "bf16", {}});
  cases.push_back({"randomk", "shared", "bf16", {}});
  cases.push_back({"topk", "union", "fp32", {"memory=none"}});
  cases.push_back({"randomk", "shared", "fp16", {"memory=none", "rescale=true"}});
  cases.push_back({"dgc", "allgather", "fp32", {"memory=ef"}});
  cases.push_back({"dgc", "union", "bf16", {"warmup_epochs=2", "momentum=0.5"}});
  cases.push_back({"gaussiank", "allgather", "fp32", {"memory=none"}});
  // Block-quantized values (value_codec.h) on the patterns that send them once.
  cases.push_back({"topk", "allgather", "int2", {}});
  cases.push_back({"exdyna", "union", "int2", {}});
  cases.push_back({"exdyna", "allgather", "int4", {}});
  cases.push_back({"exdyna", "union", "int2-sr", {}});
  cases.push_back({"exdyna", "union", "lloyd2", {}});
  cases.push_back({"topk", "allgather", "lloyd2", {}});
  cases.push_back({"randomk", "shared", "int8", {}});
  cases.push_back({"deft", "union", "int4", {}});
  cases.push_back({"dgc", "allgather", "int8-sr", {}});
  // The dense quantizers (every coordinate as a known range), with error
  // feedback so that the residual says what was sent.
  cases.push_back({"qsgd", "shared", "int8-sr", {"memory=ef"}});
  cases.push_back({"terngrad", "allgather", "int2-sr", {"memory=ef"}});
  cases.push_back({"signsgd", "shared", "sign", {}});
  cases.push_back({"signsgd", "union", "sign", {}});
  cases.push_back({"natural", "shared", "nat", {"memory=ef"}});
  cases.push_back({"exdyna", "union", "nat", {}});
  return cases;
}

class Conservation : public ::testing::TestWithParam<SyncCase> {};

TEST_P(Conservation, HoldsExactlyOnEveryRankAndElement) {
  const SyncCase c = GetParam();
  for (const int n : kWorlds) {
    run_thread_world(
        n,
        [&](Communicator& comm) {
          for (const std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{37},
                                      std::size_t{1000}, std::size_t{20011}}) {
            check_conservation(comm, c, d, 3);
          }
        },
        kTimeout);
  }
}

INSTANTIATE_TEST_SUITE_P(AllSchemes, Conservation, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<SyncCase>& param_info) {
                           return case_name(param_info.param);
                         });

TEST(NonFinite, SkipIsAgreedByAllRanks) {
  for (const int n : kWorlds) {
    run_thread_world(
        n,
        [n](Communicator& comm) {
          check_nonfinite(comm, NonFinitePolicy::kSkip, {n - 1}, std::nanf(""));
          check_nonfinite(comm, NonFinitePolicy::kSkip, {0, 2}, INFINITY);
        },
        kTimeout);
  }
}

TEST(NonFinite, StopThrowsOnEveryRankNamingTheRanks) {
  for (const int n : kWorlds) {
    run_thread_world(
        n,
        [n](Communicator& comm) {
          check_nonfinite(comm, NonFinitePolicy::kStop, {n > 1 ? 1 : 0}, std::nanf(""));
          check_nonfinite(comm, NonFinitePolicy::kStop, {0, 3, 6}, -INFINITY);
        },
        kTimeout);
  }
}

// Every gradient finite, but the residual overflows: rank 0 holds 3e38 at
// one position that the top-1 selection passes over on step 0 (a larger
// value wins) and sees again on step 1, so e + g = inf is sent. Under either
// policy every rank stops, saying that the memory overflowed, instead of
// handing an infinite average to the optimizer.
TEST(NonFinite, AnOverflowingResidualStopsEveryRank) {
  for (const NonFinitePolicy policy : {NonFinitePolicy::kStop, NonFinitePolicy::kSkip}) {
    for (const int n : {1, 2, 4}) {
      for (const char* pattern : {"union", "allgather", "sparse-allreduce"}) {
        run_thread_world(
            n,
            [&](Communicator& comm) {
              SchemeOptions options;
              options.set("density=0.125");  // k = 1 of 8
              options.set(std::string("exchange=") + pattern);
              SparsifyExchangeStep sync(make_scheme("topk", options), policy);
              std::string message;
              for (int step = 0; step < 2 && message.empty(); ++step) {
                StepContext ctx;
                ctx.step = step;
                std::vector<float> gradient(8, 0.0f);
                if (comm.rank() == 0) {
                  gradient[7] = 3.0e38f;
                  if (step == 0) gradient[5] = 3.4e38f;
                }
                try {
                  sync.synchronize(gradient, ctx, comm);
                } catch (const NonFiniteGradient& e) {
                  message = e.what();
                  EXPECT_EQ(step, 1);
                }
              }
              EXPECT_NE(message.find("memory overflowed"), std::string::npos)
                  << "n=" << n << " rank " << comm.rank() << " " << pattern << ": " << message;
            },
            kTimeout);
      }
    }
  }
}

TEST(NonFinite, ParsesThePolicy) {
  EXPECT_EQ(parse_nonfinite_policy("skip"), NonFinitePolicy::kSkip);
  EXPECT_EQ(parse_nonfinite_policy("stop"), NonFinitePolicy::kStop);
  try {
    parse_nonfinite_policy("ignore");
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "[sync] unknown non-finite policy 'ignore'; valid policies: skip, stop");
  }
}

TEST(Metrics, DensityRatioAndImbalanceOnACraftedCase) {
  for (const int n : kWorlds) {
    for (const char* exchange : {"allgather", "union", "sparse-allreduce"}) {
      run_thread_world(
          n, [&](Communicator& comm) { check_metrics_formulas(comm, exchange); }, kTimeout);
    }
  }
}

TEST(Metrics, JsonLineHasEveryField) {
  StepMetrics m;
  m.step = 12;
  m.numel = 1000;
  m.target = 10;
  m.selected = 11;
  m.union_size = 40;
  m.density_ratio = 4.0;
  m.imbalance = 0.25;
  m.residual_norm = 1.5e-3;
  m.accumulate_s = 0.001;
  m.selection_s = 2e-05;
  m.exchange_s = 0.5;
  m.bytes_sent = 123;
  m.bytes_received = 456;
  m.host_bytes_sent = 78;
  m.host_bytes_received = 90;
  m.index_bytes_raw = 44;
  m.index_bytes_encoded = 20;
  m.value_bits = 2.25;
  m.skip_subject = 7;
  m.dense_numel = 9;
  m.gradient_norm = 2.5;
  m.gradient_clipped = true;
  m.skipped_nonfinite = false;
  EXPECT_EQ(
      to_json_line(m),
      R"({"step":12,"numel":1000,"target":10,"selected":11,"union_size":40,)"
      R"("density_ratio":4,"imbalance":0.25,"residual_norm":0.0015,"gradient_norm":2.5,)"
      R"("accumulate_s":0.001,)"
      R"("selection_s":2e-05,"exchange_s":0.5,"agreement_s":0,"selection_collective_s":0,)"
      R"("selection_collectives":0,"candidate_passes":0,"bytes_sent":123,"bytes_received":456,)"
      R"("host_bytes_sent":78,"host_bytes_received":90,)"
      R"("index_bytes_raw":44,"index_bytes_encoded":20,"value_bits":2.25,"skip_subject":7,)"
      R"("dense_numel":9,)"
      R"("overlapped_s":0,"gradient_clipped":true,"skipped_nonfinite":false})");
  m.residual_norm = std::nan("");
  m.skipped_nonfinite = true;
  const std::string line = to_json_line(m);
  EXPECT_NE(line.find(R"("residual_norm":null)"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("skipped_nonfinite":true})"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

// The rule by which a step's parts (buckets, the hook's groups) combine:
// counts and times add, norms add in squares, the imbalance is the worst,
// a flag is any part's, K/k is of the totals, and the bits per value are
// the method's even when a dense part came first.
TEST(Metrics, PartsCombineIntoTheStepsRecord) {
  StepMetrics dense;  // a group averaged densely beside the method
  dense.step = 7;
  dense.numel = dense.dense_numel = 100;
  dense.bytes_sent = 400;
  dense.exchange_s = 0.25;
  dense.gradient_norm = 3.0;
  StepMetrics sparse;
  sparse.step = 7;
  sparse.numel = 1000;
  sparse.target = 10;
  sparse.selected = 12;
  sparse.union_size = 30;
  sparse.imbalance = 0.5;
  sparse.residual_norm = 4.0;
  sparse.gradient_norm = 4.0;
  sparse.bytes_sent = 60;
  sparse.exchange_s = 0.5;
  sparse.value_bits = 2.0;
  sparse.gradient_clipped = true;
  StepMetrics other = sparse;
  other.imbalance = 0.25;
  other.gradient_clipped = false;
  other.skipped_nonfinite = true;
  const std::vector<StepMetrics> parts{dense, sparse, other};
  const StepMetrics total = combined(parts);
  EXPECT_EQ(total.step, 7);
  EXPECT_EQ(total.numel, 2100u);
  EXPECT_EQ(total.dense_numel, 100u);
  EXPECT_EQ(total.target, 20u);
  EXPECT_EQ(total.selected, 24u);
  EXPECT_EQ(total.union_size, 60u);
  EXPECT_DOUBLE_EQ(total.density_ratio, 3.0);
  EXPECT_DOUBLE_EQ(total.imbalance, 0.5);
  EXPECT_DOUBLE_EQ(total.residual_norm, std::sqrt(32.0));
  EXPECT_DOUBLE_EQ(total.gradient_norm, std::sqrt(41.0));
  EXPECT_EQ(total.bytes_sent, 520u);
  EXPECT_DOUBLE_EQ(total.exchange_s, 1.25);
  EXPECT_DOUBLE_EQ(total.value_bits, 2.0);
  EXPECT_TRUE(total.gradient_clipped);
  EXPECT_TRUE(total.skipped_nonfinite);
  // Only dense parts: no k, so no K/k; an empty step is a default record.
  EXPECT_DOUBLE_EQ(combined(std::vector<StepMetrics>{dense}).density_ratio, 0.0);
  EXPECT_EQ(combined(std::vector<StepMetrics>{}).numel, 0u);
}

// Random-k with rescale and no memory: over many seeds the estimate of
// sum_i gbar_i, (d/k) * sum over the sample of gbar, is unbiased. Its
// variance for sampling without replacement is d^2 s^2 / k * (d-k)/(d-1),
// s^2 the population variance of gbar; the mean over S seeds must be within
// 5 standard errors of the truth (a false failure has probability < 1e-6),
// and the sample variance within 30% of the formula.
TEST(RandomK, RescaledEstimateIsUnbiased) {
  const std::size_t d = 200;
  const int seeds = 1500;
  run_thread_world(
      2,
      [&](Communicator& comm) {
        std::vector<float> local(d);
        for (std::size_t i = 0; i < d; ++i) {
          local[i] = sync_input(comm.rank(), 0, i) + (comm.rank() == 0 ? 0.3f : 0.0f);
        }
        // gbar as the exchange computes it is (g0 + g1)/2 per element.
        const auto all = gather_all<float>(comm, local);
        double truth = 0.0;
        std::vector<double> gbar(d);
        for (std::size_t i = 0; i < d; ++i) {
          gbar[i] = (static_cast<double>(all[0][i]) + all[1][i]) / 2.0;
          truth += gbar[i];
        }
        double mean = truth / static_cast<double>(d);
        double var = 0.0;
        for (const double v : gbar) var += (v - mean) * (v - mean);
        var /= static_cast<double>(d);
        const double k = 10.0;
        const double dd = static_cast<double>(d);
        const double estimate_var = dd * dd * var / k * (dd - k) / (dd - 1.0);

        double sum = 0.0;
        double sum_sq = 0.0;
        for (int seed = 0; seed < seeds; ++seed) {
          SchemeOptions options;
          options.set("density=0.05");
          options.set("memory=none");
          options.set("rescale=true");
          options.set("seed=" + std::to_string(seed));
          SparsifyExchangeStep sync(make_scheme("randomk", options));
          std::vector<float> gradient = local;
          StepContext ctx;
          ctx.step = seed % 3;
          sync.synchronize(gradient, ctx, comm);
          double estimate = 0.0;
          for (const float v : gradient) estimate += v;
          sum += estimate;
          sum_sq += estimate * estimate;
        }
        const double s = static_cast<double>(seeds);
        const double avg = sum / s;
        const double sample_var = (sum_sq - s * avg * avg) / (s - 1.0);
        EXPECT_NEAR(avg, truth, 5.0 * std::sqrt(estimate_var / s))
            << "truth " << truth << " sd of one estimate " << std::sqrt(estimate_var);
        EXPECT_NEAR(sample_var / estimate_var, 1.0, 0.3);
      },
      kTimeout);
}

// DGC's memory by hand: u = m*u + g, v = v + u, both zero where transmitted
// (fp32), with a non-default momentum.
TEST(DgcMemory, FollowsTheUpdateRuleThroughTheSync) {
  run_thread_world(
      3,
      [](Communicator& comm) {
        SchemeOptions options;
        options.set("density=0.05");
        options.set("momentum=0.5");
        options.set("clip_ratio=0");  // the update rule alone (the clip: spike_clip_test.cc)
        SparsifyExchangeStep sync(make_scheme("dgc", options));
        const std::size_t d = 300;
        std::vector<float> u(d, 0.0f);
        std::vector<float> v(d, 0.0f);
        for (int step = 0; step < 4; ++step) {
          std::vector<float> g(d);
          for (std::size_t i = 0; i < d; ++i) g[i] = sync_input(comm.rank(), step, i);
          for (std::size_t i = 0; i < d; ++i) {
            u[i] = 0.5f * u[i] + g[i];
            v[i] += u[i];
          }
          StepContext ctx;
          ctx.step = step;
          sync.synchronize(g, ctx, comm);
          for (const Index i : sync.last_exchange().transmitted) {
            u[i] = 0.0f;
            v[i] = 0.0f;
          }
          EXPECT_EQ(accumulated_copy(sync), v) << "step " << step;
          EXPECT_EQ(momentum_of(sync.memory()), u) << "step " << step;
        }
      },
      kTimeout);
}

// DEFT's whole pieces (k_l == size_l) join the union as known ranges: no
// rank lists their indices or reads them while selecting, every rank
// transmits them (residual 0 there with fp32), and the union holds them.
TEST(DeftWholePieces, JoinTheUnionWithoutIndexExchange) {
  for (const int n : {1, 3, 4}) {
    run_thread_world(
        n,
        [](Communicator& comm) {
          SchemeOptions options;
          options.set("density=0.3");
          SparsifyExchangeStep sync(make_scheme("deft", options));
          const std::size_t d = 1000;
          // A small layer with a dominant norm: its budget is capped at its size.
          const std::vector<LayerSpan> layers = {{"hot", 0, 10}, {"rest", 10, 990}};
          for (int step = 0; step < 4; ++step) {
            std::vector<float> g(d);
            for (std::size_t i = 0; i < d; ++i) {
              g[i] = i < 10 ? 1000.0f + static_cast<float>(i) : sync_input(comm.rank(), step, i);
            }
            std::vector<float> a = accumulated_copy(sync);
            if (a.empty()) a.assign(d, 0.0f);
            for (std::size_t i = 0; i < d; ++i) a[i] += g[i];
            StepContext ctx;
            ctx.step = step;
            ctx.rank = comm.rank();
            ctx.world = comm.size();
            ctx.layers = layers;
            sync.synchronize(g, ctx, comm);
            const SparseSelection& selection = sync.last_selection();
            const ExchangeResult& result = sync.last_exchange();
            ASSERT_EQ(selection.known.size(), 1u) << "step " << step;
            EXPECT_EQ(selection.known[0].begin, 0u);
            EXPECT_EQ(selection.known[0].end, 10u);
            for (const Index i : selection.indices) EXPECT_GE(i, 10u) << "step " << step;
            for (const Range& r : sync.sparsifier().last_read()) {
              if (r.size() < d) {
                EXPECT_GE(r.begin, 10u) << "whole pieces are not read";
              }
            }
            EXPECT_EQ(result.index_bytes_raw, sizeof(Index) * selection.size());
            std::size_t listed = 0;
            for (const std::size_t c : result.counts) listed += c;
            EXPECT_EQ(result.union_size, listed + 10) << "step " << step;
            const std::vector<float> residual = accumulated_copy(sync);
            std::vector<char> sent(d, 0);
            for (const Index i : result.transmitted) sent[i] = 1;
            for (std::size_t i = 0; i < 10; ++i) {
              EXPECT_EQ(sent[i], 1) << i;
              EXPECT_EQ(g[i], 1000.0f + static_cast<float>(i)) << "mean of equal values";
            }
            std::size_t bad = 0;
            for (std::size_t i = 0; i < d; ++i) {
              bad += (sent[i] != 0 ? residual[i] == 0.0f : residual[i] == a[i]) ? 0 : 1;
            }
            EXPECT_EQ(bad, 0u) << "step " << step << ": conservation";
          }
        },
        kTimeout);
  }
}

// Saving after some steps and loading into a fresh SparsifyExchangeStep resumes
// bit-exactly.
TEST(SparsifyExchangeStepState, ResumesBitExactly) {
  for (const char* scheme : {"topk", "dgc", "randomk", "gaussiank", "cltk", "threshold"}) {
    run_thread_world(
        3,
        [&](Communicator& comm) {
          SchemeOptions options;
          options.set("density=0.03");
          const std::size_t d = 777;
          SparsifyExchangeStep first(make_scheme(scheme, options));
          auto input = [&](int step) {
            std::vector<float> g(d);
            for (std::size_t i = 0; i < d; ++i) g[i] = sync_input(comm.rank(), step, i);
            return g;
          };
          for (int step = 0; step < 3; ++step) {
            auto g = input(step);
            StepContext ctx;
            ctx.step = step;
            first.synchronize(g, ctx, comm);
          }
          StateWriter writer;
          first.save(writer);
          SparsifyExchangeStep second(make_scheme(scheme, options));
          StateReader reader(writer.bytes());
          second.load(reader);
          EXPECT_TRUE(reader.at_end());
          for (int step = 3; step < 6; ++step) {
            auto g1 = input(step);
            auto g2 = g1;
            StepContext ctx;
            ctx.step = step;
            first.synchronize(g1, ctx, comm);
            second.synchronize(g2, ctx, comm);
            EXPECT_EQ(g1, g2) << scheme << " step " << step;
            EXPECT_EQ(accumulated_copy(first), accumulated_copy(second)) << scheme;
          }
          // A different scheme's state is refused.
          SparsifyExchangeStep other(
              make_scheme(std::string(scheme) == "topk" ? "dgc" : "topk", options));
          StateReader wrong(writer.bytes());
          EXPECT_THROW(other.load(wrong), Error);
        },
        kTimeout);
  }
}

// A scheme's own collectives inside select() are exchange time: CLT-k's
// index broadcast is one round on every rank (leader and followers), and
// Top-k, which runs none, reports zero.
TEST(SparsifyExchangeStep, SelectionCollectivesCountAsExchange) {
  for (const char* scheme : {"cltk", "topk"}) {
    run_thread_world(
        3,
        [&](Communicator& comm) {
          SchemeOptions options;
          options.set("density=0.03");
          SparsifyExchangeStep sync(make_scheme(scheme, options));
          for (int step = 0; step < 3; ++step) {
            std::vector<float> g(1000);
            for (std::size_t i = 0; i < g.size(); ++i) g[i] = sync_input(comm.rank(), step, i);
            StepContext ctx;
            ctx.step = step;
            const StepMetrics m = sync.synchronize(g, ctx, comm);
            const int rounds = std::string(scheme) == "cltk" ? 1 : 0;
            EXPECT_EQ(m.selection_collectives, rounds) << scheme << " step " << step;
            if (rounds == 0) {
              EXPECT_EQ(m.selection_collective_s, 0.0) << scheme;
            }
            EXPECT_GE(m.selection_collective_s, 0.0);
            EXPECT_GE(m.exchange_s, m.selection_collective_s + m.agreement_s) << scheme;
          }
        },
        kTimeout);
  }
}

TEST(SparsifyExchangeStep, RejectsMissingParts) {
  EXPECT_THROW(SparsifyExchangeStep(SchemeParts{}), InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm::testing
