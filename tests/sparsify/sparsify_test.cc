// The sparsify layer above the kernels: options, the registry, the gradient
// memories and every scheme's selection rules (docs/algorithms.md
// "Sparsifiers"), each checked against a short reference on random and
// crafted inputs.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "error_message.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sparsify/kernels/topk.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm {
namespace {

// --- helpers ---------------------------------------------------------------

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// Uniform in [-1, 1), a pure function of (seed, i): the same on every run.
float uniform_value(std::uint64_t seed, std::size_t i) {
  const Philox rng(seed);
  const std::uint32_t bits = rng.block(i, 0)[0] >> 8;
  return static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f;
}

// Roughly normal (sum of 4 uniforms), scaled: spreads magnitudes like a
// gradient does.
std::vector<float> random_vector(std::size_t d, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> x(d);
  for (std::size_t i = 0; i < d; ++i) {
    float s = 0.0f;
    for (std::size_t j = 0; j < 4; ++j) s += uniform_value(seed * 7919 + j, i);
    x[i] = scale * s;
  }
  return x;
}

// Standard normal by Box-Muller from Philox uniforms.
std::vector<float> normal_vector(std::size_t d, std::uint64_t seed) {
  const Philox rng(seed);
  std::vector<float> x(d);
  for (std::size_t i = 0; i < d; ++i) {
    const auto b = rng.block(i, 1);
    const double u1 = (static_cast<double>(b[0]) + 1.0) / 4294967296.0;  // (0, 1]
    const double u2 = static_cast<double>(b[1]) / 4294967296.0;
    x[i] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return x;
}

// Heavy-tailed: mostly small values, a few very large ones.
std::vector<float> heavy_tailed_vector(std::size_t d, std::uint64_t seed) {
  std::vector<float> x = random_vector(d, seed);
  for (std::size_t i = 0; i < d; ++i) {
    const float u = uniform_value(seed + 99, i);
    if (u > 0.98f) x[i] *= 1000.0f;
  }
  return x;
}

SchemeOptions options_of(std::initializer_list<const char*> settings) {
  SchemeOptions options;
  for (const char* s : settings) options.set(s);
  return options;
}

std::string message_of(const std::function<void()>& fn) {
  return testing::error_message<InvalidArgument>(fn);
}

const schemes::DensitySparsifier& as_density(const Sparsifier& s) {
  return dynamic_cast<const schemes::DensitySparsifier&>(s);
}

// Expects a valid selection of `a`: strictly ascending indices in range and
// values equal to a at them.
void expect_valid_selection(const SparseSelection& s, std::span<const float> a) {
  ASSERT_EQ(s.indices.size(), s.values.size());
  for (std::size_t j = 0; j < s.size(); ++j) {
    ASSERT_LT(s.indices[j], a.size());
    if (j > 0) {
      ASSERT_LT(s.indices[j - 1], s.indices[j]);
    }
    ASSERT_EQ(s.values[j], a[s.indices[j]]) << "at " << s.indices[j];
  }
}

std::vector<Index> indices_at_least(std::span<const float> a, float threshold) {
  std::vector<Index> out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(a[i]) >= threshold) out.push_back(static_cast<Index>(i));
  }
  return out;
}

std::vector<Index> indices_of(const SparseSelection& s) {
  return {s.indices.begin(), s.indices.end()};
}

// Runs fn(comm) on one rank.
void on_one_rank(const std::function<void(Communicator&)>& fn) { run_thread_world(1, fn); }

// --- options -----------------------------------------------------------------

TEST(Options, ParsesKeyEqualsValue) {
  SchemeOptions options;
  options.set("density=0.5");
  options.set(" seed = 7 ");
  options.set("name=");
  EXPECT_TRUE(options.has("density"));
  EXPECT_EQ(options.values().at("seed"), "7");
  EXPECT_EQ(options.values().at("name"), "");
  EXPECT_TRUE(contains(message_of([&] { options.set("density"); }), "expected key=value"));
  EXPECT_TRUE(contains(message_of([&] { options.set("=3"); }), "empty key"));
}

TEST(Options, NumberValidatesRangeAndSyntax) {
  const auto opts = options_of(
      {"density=1.5", "a=0", "b=-1", "c=junk", "d=0.25", "e=1e-3", "f=nan", "g=1.0x", "h=inf"});
  EXPECT_EQ(opts.number("topk", "missing", 0.01, 0, 1, true), 0.01);
  EXPECT_EQ(opts.number("topk", "d", 0.01, 0, 1, true), 0.25);
  EXPECT_EQ(opts.number("topk", "e", 0.01, 0, 1, true), 1e-3);
  EXPECT_EQ(message_of([&] { opts.number("topk", "density", 0.01, 0, 1, true); }),
            "[topk] option density=1.5 is outside (0, 1]");
  EXPECT_EQ(message_of([&] { opts.number("topk", "a", 0.01, 0, 1, true); }),
            "[topk] option a=0 is outside (0, 1]");
  EXPECT_EQ(message_of([&] { opts.number("topk", "b", 0.01, 0, 1, false); }),
            "[topk] option b=-1 is outside [0, 1]");
  EXPECT_EQ(message_of([&] { opts.number("topk", "c", 0.01, 0, 1, true); }),
            "[topk] option c=junk is not a number");
  EXPECT_TRUE(contains(message_of([&] { opts.number("topk", "f", 0.01, 0, 1); }), "not a number"));
  EXPECT_TRUE(contains(message_of([&] { opts.number("topk", "g", 0.01, 0, 1); }), "not a number"));
  EXPECT_EQ(message_of([&] { opts.number("x", "h", 0, 0, 5); }),
            "[x] option h=inf is outside [0, 5]");
  EXPECT_EQ(opts.number("x", "h", 0, 0, std::numeric_limits<double>::infinity()),
            std::numeric_limits<double>::infinity());
  EXPECT_EQ(
      message_of([&] { opts.number("x", "b", 0, 0, std::numeric_limits<double>::infinity()); }),
      "[x] option b=-1 is outside [0, inf)");
}

TEST(Options, IntegerFlagAndChoice) {
  const auto opts = options_of({"n=42", "m=4.5", "big=99999999999999999999", "neg=-3", "f1=true",
                                "f2=off", "f3=maybe", "v=fp16", "w=fp8"});
  EXPECT_EQ(opts.integer("s", "n", 0, 0, 100), 42);
  EXPECT_EQ(opts.integer("s", "missing", 5, 0, 100), 5);
  EXPECT_EQ(message_of([&] { opts.integer("s", "m", 0, 0, 100); }),
            "[s] option m=4.5 is not an integer");
  EXPECT_TRUE(
      contains(message_of([&] { opts.integer("s", "big", 0, 0, 100); }), "outside [0, 100]"));
  EXPECT_EQ(message_of([&] { opts.integer("s", "neg", 0, 0, 100); }),
            "[s] option neg=-3 is outside [0, 100]");
  EXPECT_TRUE(opts.flag("s", "f1", false));
  EXPECT_FALSE(opts.flag("s", "f2", true));
  EXPECT_TRUE(opts.flag("s", "missing", true));
  EXPECT_TRUE(
      contains(message_of([&] { opts.flag("s", "f3", true); }), "f3=maybe is not a boolean"));
  EXPECT_EQ(opts.choice("s", "v", "fp32", {"fp32", "fp16", "bf16"}), "fp16");
  EXPECT_EQ(opts.choice("s", "missing", "fp32", {"fp32", "fp16", "bf16"}), "fp32");
  EXPECT_EQ(message_of([&] {
              opts.choice("s", "w", "fp32", {"fp32", "fp16", "bf16"});
            }),
            "[s] option w=fp8 is not one of: fp32, fp16, bf16");
}

TEST(Options, UnknownKeysListTheValidOnes) {
  const std::vector<OptionSpec> specs = {{"density", "0.01", ""}, {"seed", "0", ""}};
  EXPECT_NO_THROW(options_of({"density=0.1"}).check_known("topk", specs));
  EXPECT_EQ(message_of([&] { options_of({"densty=0.1"}).check_known("topk", specs); }),
            "[topk] unknown option 'densty'; valid options: density, seed");
}

// --- registry ----------------------------------------------------------------

TEST(Registry, ListsTheSchemesInOrder) {
  std::vector<std::string> names;
  for (const auto& info : scheme_registry()) {
    names.push_back(info.name);
    EXPECT_FALSE(info.summary.empty()) << info.name;
    std::set<std::string> option_names;
    for (const auto& spec : info.options) option_names.insert(spec.name);
    for (const auto& common : common_option_specs()) {
      // The dense quantizers send every coordinate: no density.
      const bool applies = common.name != "density" || !info.traits.every_coordinate;
      EXPECT_EQ(option_names.count(common.name), applies ? 1u : 0u)
          << info.name << ", " << common.name;
    }
  }
  const std::vector<std::string> expected = {
      "topk",   "threshold",       "randomk", "dgc",  "gaussiank", "cltk",    "micro",
      "exdyna", "exdyna-faithful", "deft",    "qsgd", "terngrad",  "signsgd", "natural"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(scheme_names(),
            "topk, threshold, randomk, dgc, gaussiank, cltk, micro, exdyna, exdyna-faithful, deft, "
            "qsgd, terngrad, signsgd, natural");
}

TEST(Registry, UnknownSchemeListsTheValidNames) {
  EXPECT_EQ(message_of([] { make_scheme("topq", {}); }),
            "[registry] unknown scheme 'topq'; valid schemes: topk, threshold, randomk, dgc, "
            "gaussiank, cltk, micro, exdyna, exdyna-faithful, deft, qsgd, terngrad, signsgd, "
            "natural");
}

TEST(Registry, RejectsInvalidOptionsForEveryScheme) {
  for (const auto& info : scheme_registry()) {
    const std::string& name = info.name;
    SCOPED_TRACE(name);
    const bool every_coordinate = info.traits.every_coordinate;
    for (const char* bad : {"density=0", "density=1.5", "density=-1"}) {
      EXPECT_TRUE(contains(
          message_of([&] { make_scheme(name, options_of({bad})); }),
          every_coordinate ? "unknown option 'density'"
                           : "[" + name + "] option " + std::string(bad) + " is outside (0, 1]"));
    }
    if (!every_coordinate) {
      EXPECT_TRUE(contains(message_of([&] { make_scheme(name, options_of({"density=junk"})); }),
                           "density=junk is not a number"));
    }
    const std::string unknown = message_of([&] { make_scheme(name, options_of({"speed=3"})); });
    EXPECT_TRUE(contains(unknown, "unknown option 'speed'"));
    EXPECT_TRUE(contains(unknown, "valid options:"));
    EXPECT_TRUE(contains(unknown, std::string(every_coordinate ? "" : "density, ") +
                                      "exchange, values, encode_indices, memory, momentum, decay, "
                                      "clip_norm, clip_ratio, seed"));
    EXPECT_TRUE(contains(message_of([&] { make_scheme(name, options_of({"values=fp8"})); }),
                         "values=fp8 is not one of: fp32, fp16, bf16"));
    EXPECT_TRUE(contains(message_of([&] { make_scheme(name, options_of({"exchange=ring"})); }),
                         "exchange=ring is not one of: union, allgather, sparse-allreduce"));
    EXPECT_TRUE(contains(message_of([&] { make_scheme(name, options_of({"seed=-2"})); }),
                         "seed=-2 is outside"));
    EXPECT_TRUE(contains(message_of([&] { make_scheme(name, options_of({"memory=lots"})); }),
                         "memory=lots is not one of: "));
    if (!every_coordinate) {
      EXPECT_NO_THROW(make_scheme(name, options_of({"density=1"})));
    }
  }
}

TEST(Registry, DefaultsFollowTheSpecification) {
  struct Expected {
    const char* name;
    ExchangePattern exchange;
    const char* memory;
  };
  for (const Expected& e : {Expected{"topk", ExchangePattern::kSparseAllgather, "ef"},
                            Expected{"threshold", ExchangePattern::kSparseAllgather, "ef"},
                            Expected{"randomk", ExchangePattern::kSharedIndices, "ef"},
                            Expected{"dgc", ExchangePattern::kSparseAllgather, "momentum"},
                            Expected{"gaussiank", ExchangePattern::kSparseAllgather, "ef"},
                            Expected{"cltk", ExchangePattern::kSharedIndices, "ef"}}) {
    SCOPED_TRACE(e.name);
    const SchemeParts parts = make_scheme(e.name, {});
    EXPECT_EQ(parts.sparsifier->name(), e.name);
    EXPECT_EQ(parts.exchange, e.exchange);
    EXPECT_EQ(parts.traits.default_exchange(), e.exchange);
    EXPECT_EQ(parts.memory->name(), e.memory);
    EXPECT_EQ(parts.exchange_options.values, ValueEncoding::kFloat32);
    EXPECT_TRUE(parts.exchange_options.encode_indices);
    EXPECT_EQ(as_density(*parts.sparsifier).density(), 0.01);
    EXPECT_EQ(parts.sparsifier->target(1000, {}), 10u);
  }
  const SchemeParts parts =
      make_scheme("topk", options_of({"density=0.25", "exchange=union", "values=bf16",
                                      "encode_indices=false", "memory=none"}));
  EXPECT_EQ(parts.exchange, ExchangePattern::kUnionAllreduce);
  EXPECT_EQ(parts.exchange_options.values, ValueEncoding::kBFloat16);
  EXPECT_FALSE(parts.exchange_options.encode_indices);
  EXPECT_EQ(parts.memory->name(), "none");
  EXPECT_EQ(parts.sparsifier->target(1000, {}), 250u);
}

TEST(Registry, TraitsAreDeclaredByTheBuiltParts) {
  // Only the partition schemes span the model (no buckets), and only the
  // momentum-correction memory applies momentum, spike clip or not; the
  // registry's name-based answer for the optimizer agrees with the parts.
  for (const SchemeInfo& info : scheme_registry()) {
    SCOPED_TRACE(info.name);
    const bool partitioned =
        info.name == "micro" || info.name == "exdyna" || info.name == "exdyna-faithful";
    const SchemeParts parts = make_scheme(info.name, {});
    EXPECT_EQ(parts.traits.spans_the_model, partitioned);
    EXPECT_EQ(info.traits.spans_the_model, partitioned);
    EXPECT_EQ(parts.memory->applies_momentum(), info.name == "dgc");
    EXPECT_EQ(scheme_applies_momentum(info.name, {}), info.name == "dgc");
    // The dense quantizers send everything: a momentum correction masked
    // where sent would reset every step, so they do not offer it.
    if (info.traits.every_coordinate) continue;
    for (const char* clip : {"clip_ratio=0", "clip_ratio=2"}) {
      const SchemeOptions momentum = options_of({"memory=momentum", clip});
      EXPECT_TRUE(make_scheme(info.name, momentum).memory->applies_momentum()) << clip;
      EXPECT_TRUE(scheme_applies_momentum(info.name, momentum)) << clip;
      const SchemeOptions ef = options_of({"memory=ef", clip});
      EXPECT_FALSE(make_scheme(info.name, ef).memory->applies_momentum()) << clip;
      EXPECT_FALSE(scheme_applies_momentum(info.name, ef)) << clip;
    }
  }
}

TEST(Registry, SharedExchangeOnlyForIdenticalSelections) {
  for (const char* name : {"topk", "threshold", "dgc", "gaussiank"}) {
    EXPECT_TRUE(contains(message_of([&] { make_scheme(name, options_of({"exchange=shared"})); }),
                         "exchange=shared needs every rank to select the same indices"))
        << name;
  }
  for (const char* name : {"randomk", "cltk"}) {
    EXPECT_EQ(make_scheme(name, options_of({"exchange=shared"})).exchange,
              ExchangePattern::kSharedIndices);
    EXPECT_EQ(make_scheme(name, options_of({"exchange=sparse-allreduce"})).exchange,
              ExchangePattern::kSparseAllreduce);
  }
}

TEST(Registry, SchemeSpecificOptions) {
  EXPECT_TRUE(contains(message_of([] { make_scheme("randomk", options_of({"rescale=true"})); }),
                       "[randomk] option rescale=true needs memory=none"));
  EXPECT_EQ(make_scheme("randomk", options_of({"rescale=true", "memory=none"})).memory->name(),
            "none");
  EXPECT_TRUE(contains(message_of([] { make_scheme("topk", options_of({"rescale=true"})); }),
                       "unknown option 'rescale'"));
  EXPECT_TRUE(contains(message_of([] { make_scheme("threshold", options_of({"lambda=-1"})); }),
                       "lambda=-1 is outside [0, inf)"));
  EXPECT_TRUE(contains(message_of([] { make_scheme("dgc", options_of({"momentum=1"})); }),
                       "momentum=1 must be below 1"));
  EXPECT_TRUE(contains(message_of([] { make_scheme("dgc", options_of({"momentum=-0.5"})); }),
                       "momentum=-0.5 is outside [0, 1]"));
  EXPECT_TRUE(contains(message_of([] {
                         make_scheme("dgc", options_of({"memory=ef", "clip_norm=1"}));
                       }),
                       "belong to memory=momentum"));
  EXPECT_TRUE(contains(message_of([] { make_scheme("dgc", options_of({"warmup_epochs=-1"})); }),
                       "warmup_epochs=-1 is outside [0, inf)"));
  EXPECT_EQ(make_scheme("dgc", options_of({"memory=ef"})).memory->name(), "ef");
  // Momentum correction is a memory every scheme may use; the optimizer must
  // then apply no momentum, which scheme_applies_momentum() tells.
  EXPECT_EQ(make_scheme("exdyna", options_of({"memory=momentum"})).memory->name(), "momentum");
  EXPECT_TRUE(contains(message_of([] { make_scheme("topk", options_of({"clip_norm=1"})); }),
                       "[topk] options momentum and clip_norm belong to memory=momentum"));
  EXPECT_TRUE(contains(message_of([] { make_scheme("topk", options_of({"memory=velocity"})); }),
                       "memory=velocity is not one of: ef, none, momentum"));
  EXPECT_TRUE(scheme_applies_momentum("dgc", options_of({})));
  EXPECT_FALSE(scheme_applies_momentum("dgc", options_of({"memory=ef"})));
  EXPECT_TRUE(scheme_applies_momentum("exdyna", options_of({"memory=momentum"})));
  EXPECT_FALSE(scheme_applies_momentum("exdyna", options_of({})));
  EXPECT_FALSE(scheme_applies_momentum("dense", options_of({})));
}

// --- memories ----------------------------------------------------------------

std::vector<float> to_vector(std::span<const float> x) { return {x.begin(), x.end()}; }

TEST(Memory, ErrorFeedbackAccumulatesAndKeepsTheResidual) {
  auto memory = make_error_feedback();
  EXPECT_EQ(memory->name(), "ef");
  const std::vector<float> g1 = {1, -2, 3, 0.5f};
  const std::vector<float> g2 = {0.25f, 1, -1, 2};
  memory->accumulate(g1);
  EXPECT_EQ(to_vector(memory->accumulated()), g1);
  memory->accumulated()[1] = 0.0f;  // what an exchange of index 1 leaves
  const std::vector<Index> sent = {1};
  memory->after_exchange(sent);
  EXPECT_EQ(to_vector(memory->accumulated()), (std::vector<float>{1, 0, 3, 0.5f}));
  EXPECT_DOUBLE_EQ(memory->residual_norm(), std::sqrt(1.0 + 9.0 + 0.25));
  memory->accumulate(g2);
  EXPECT_EQ(to_vector(memory->accumulated()), (std::vector<float>{1.25f, 1, 2, 2.5f}));
  const std::vector<float> wrong(3, 1.0f);
  EXPECT_TRUE(contains(message_of([&] { memory->accumulate(wrong); }),
                       "the gradient has 3 elements, but the memory holds 4"));

  StateWriter writer;
  memory->save(writer);
  auto restored = make_error_feedback();
  StateReader reader(writer.bytes());
  restored->load(reader);
  EXPECT_TRUE(reader.at_end());
  EXPECT_EQ(to_vector(restored->accumulated()), to_vector(memory->accumulated()));
  restored->accumulate(g1);
  memory->accumulate(g1);
  EXPECT_EQ(to_vector(restored->accumulated()), to_vector(memory->accumulated()));
  // A different memory's state is refused.
  auto other = make_no_memory();
  StateReader wrong_reader(writer.bytes());
  EXPECT_THROW(other->load(wrong_reader), Error);
}

// decay < 1: what was held back fades, e = decay * e + g; the option reaches
// the memory through every scheme's options and belongs to memory=ef only.
TEST(Memory, ErrorFeedbackWithADecayFadesWhatWasHeldBack) {
  auto memory = make_error_feedback(0.5);
  memory->accumulate(std::vector<float>{4, -2});
  memory->accumulate(std::vector<float>{1, 1});
  EXPECT_EQ(to_vector(memory->accumulated()), (std::vector<float>{3, 0}));
  for (const double bad : {0.0, -0.5, 1.5}) {
    EXPECT_THROW(make_error_feedback(bad), InvalidArgument) << bad;
  }
  SchemeParts parts = make_scheme("topk", options_of({"decay=0.5", "clip_ratio=0"}));
  parts.memory->accumulate(std::vector<float>{4, -2});
  parts.memory->accumulate(std::vector<float>{1, 1});
  EXPECT_EQ(to_vector(parts.memory->accumulated()), (std::vector<float>{3, 0}));
  EXPECT_TRUE(contains(message_of([] { make_scheme("topk", options_of({"decay=0"})); }), "decay"));
  EXPECT_TRUE(contains(message_of([] {
                         make_scheme("topk", options_of({"decay=0.9", "memory=ef21"}));
                       }),
                       "option decay belongs to memory=ef"));
}

TEST(Memory, ErrorFeedbackNormOfALongVector) {
  auto memory = make_error_feedback();
  const std::vector<float> g = random_vector(1001, 5);
  memory->accumulate(g);
  double expected = 0.0;
  for (const float v : g) expected += static_cast<double>(v) * v;
  EXPECT_NEAR(memory->residual_norm(), std::sqrt(expected), 1e-12 * std::sqrt(expected));
}

TEST(Memory, NoMemoryDropsWhatWasNotSent) {
  auto memory = make_no_memory();
  EXPECT_EQ(memory->name(), "none");
  const std::vector<float> g = {1, -2, 3};
  memory->accumulate(g);
  EXPECT_EQ(to_vector(memory->accumulated()), g);
  memory->after_exchange({});
  EXPECT_EQ(to_vector(memory->accumulated()), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(memory->residual_norm(), 0.0);
  memory->accumulate(g);
  EXPECT_EQ(to_vector(memory->accumulated()), g);
  StateWriter writer;
  memory->save(writer);
  auto restored = make_no_memory();
  StateReader reader(writer.bytes());
  restored->load(reader);
  EXPECT_EQ(restored->accumulated().size(), 3u);
}

TEST(Memory, RescaledNoMemoryMultipliesByDOverK) {
  auto memory = schemes::make_rescaled_no_memory(0.1);
  const std::vector<float> g = random_vector(95, 3);  // k = 9, d/k = 95/9
  memory->accumulate(g);
  const float scale = static_cast<float>(95.0 / 9.0);
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_EQ(memory->accumulated()[i], scale * g[i]);
}

// Reads the momentum memory's state: tag, u, v (see memory.cc).
void read_momentum_state(const GradientMemory& memory, std::vector<float>& u,
                         std::vector<float>& v) {
  StateWriter writer;
  memory.save(writer);
  StateReader reader(writer.bytes());
  reader.expect_tag("memory.momentum");
  reader.value<std::uint8_t>();
  u = reader.array<float>();
  reader.value<std::uint8_t>();
  v = reader.array<float>();
}

TEST(Memory, MomentumCorrectionFollowsTheUpdateRuleAndMasks) {
  const double m = 0.9;
  auto memory = make_momentum_correction(m);
  EXPECT_EQ(memory->name(), "momentum");
  const std::size_t d = 64;
  std::vector<float> u_ref(d, 0.0f);
  std::vector<float> v_ref(d, 0.0f);
  const auto mf = static_cast<float>(m);
  for (int step = 0; step < 5; ++step) {
    const std::vector<float> g = random_vector(d, 100 + static_cast<std::uint64_t>(step));
    memory->accumulate(g);
    for (std::size_t i = 0; i < d; ++i) {
      u_ref[i] = mf * u_ref[i] + g[i];
      v_ref[i] += u_ref[i];
    }
    EXPECT_EQ(to_vector(memory->accumulated()), v_ref);
    // Transmit every third position from step's offset: the exchange zeroes
    // v there (fp32), the memory zeroes u there.
    std::vector<Index> sent;
    for (std::size_t i = static_cast<std::size_t>(step) % 3; i < d; i += 3) {
      sent.push_back(static_cast<Index>(i));
      memory->accumulated()[i] = 0.0f;
      v_ref[i] = 0.0f;
      u_ref[i] = 0.0f;
    }
    memory->after_exchange(sent);
    std::vector<float> u, v;
    read_momentum_state(*memory, u, v);
    EXPECT_EQ(u, u_ref);
    EXPECT_EQ(v, v_ref);
    double norm = 0.0;
    for (const float x : v_ref) norm += static_cast<double>(x) * x;
    EXPECT_NEAR(memory->residual_norm(), std::sqrt(norm), 1e-12 * (1.0 + std::sqrt(norm)));
  }
  // Resume bit-exactly.
  StateWriter writer;
  memory->save(writer);
  auto restored = make_momentum_correction(m);
  StateReader reader(writer.bytes());
  restored->load(reader);
  const std::vector<float> g = random_vector(d, 999);
  memory->accumulate(g);
  restored->accumulate(g);
  EXPECT_EQ(to_vector(restored->accumulated()), to_vector(memory->accumulated()));
}

TEST(Memory, MomentumCorrectionClipsTheLocalGradient) {
  auto memory = make_momentum_correction(0.5, /*clip_norm=*/1.0);
  const std::vector<float> g = {3, 4};  // norm 5 -> scaled by 0.2
  memory->accumulate(g);
  EXPECT_FLOAT_EQ(memory->accumulated()[0], 0.6f);
  EXPECT_FLOAT_EQ(memory->accumulated()[1], 0.8f);
  const std::vector<float> small = {0.3f, 0.4f};  // norm 0.5: untouched
  memory->accumulate(small);
  // u = 0.5 * (0.6, 0.8) + (0.3, 0.4) = (0.6, 0.8); v = (1.2, 1.6)
  EXPECT_FLOAT_EQ(memory->accumulated()[0], 1.2f);
  EXPECT_FLOAT_EQ(memory->accumulated()[1], 1.6f);
  EXPECT_THROW(make_momentum_correction(1.0), InvalidArgument);
  EXPECT_THROW(make_momentum_correction(0.9, -1.0), InvalidArgument);
}

// --- inverse normal CDF --------------------------------------------------------

TEST(InverseNormalCdf, MatchesKnownQuantilesAndInvertsPhi) {
  using schemes::inverse_normal_cdf;
  EXPECT_EQ(inverse_normal_cdf(0.5), 0.0);
  EXPECT_NEAR(inverse_normal_cdf(0.975), 1.959963984540054, 1e-13);
  EXPECT_NEAR(inverse_normal_cdf(0.995), 2.5758293035489004, 1e-13);
  EXPECT_NEAR(inverse_normal_cdf(0.9995), 3.2905267314919255, 1e-12);
  EXPECT_NEAR(inverse_normal_cdf(0.8413447460685429), 1.0, 1e-13);
  EXPECT_NEAR(inverse_normal_cdf(0.025), -1.959963984540054, 1e-13);
  EXPECT_TRUE(std::isinf(inverse_normal_cdf(0.0)));
  EXPECT_TRUE(std::isinf(inverse_normal_cdf(1.0)));
  EXPECT_TRUE(std::isnan(inverse_normal_cdf(-0.1)));
  EXPECT_TRUE(std::isnan(inverse_normal_cdf(1.5)));
  // Phi(Phi^-1(p)) == p to near machine precision, tails included (both
  // branches of the approximation and the switch point).
  for (double p : {1e-300, 1e-100, 1e-20, 1e-10, 1e-6, 5e-4, 0.01, 0.02425, 0.0243, 0.1, 0.3, 0.49,
                   0.5001, 0.7, 0.9, 0.97575, 0.99, 0.999999}) {
    const double x = inverse_normal_cdf(p);
    const double back = 0.5 * std::erfc(-x / std::sqrt(2.0));
    EXPECT_NEAR(back / p, 1.0, 1e-13) << "p=" << p;
    // Symmetry, where 1 - p is still exact enough to say something.
    if (p < 0.5 && p >= 1e-6) {
      EXPECT_NEAR(-inverse_normal_cdf(1.0 - p) / x, 1.0, 1e-9) << "p=" << p;
    }
  }
}

// --- schemes -------------------------------------------------------------------

TEST(TopKScheme, SelectsExactlyKLikeTheReference) {
  on_one_rank([](Communicator& comm) {
    for (const std::size_t d :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
      for (const char* density : {"density=0.001", "density=0.05", "density=1"}) {
        auto parts = make_scheme("topk", options_of({density}));
        const auto a = heavy_tailed_vector(d, d + 1);
        SparseSelection s;
        parts.sparsifier->select(a, {}, comm, s);
        const std::size_t k = parts.sparsifier->target(d, {});
        EXPECT_EQ(s.size(), k);
        expect_valid_selection(s, a);
        SparseSelection expected;
        topk_reference(a, k, 0, expected);
        EXPECT_EQ(indices_of(s), indices_of(expected)) << "d=" << d << " " << density;
      }
    }
  });
}

TEST(ThresholdScheme, SelectsAtLeastLambda) {
  on_one_rank([](Communicator& comm) {
    const std::size_t d = 10000;
    const auto a = random_vector(d, 11);
    {
      auto parts = make_scheme("threshold", options_of({"lambda=2.5"}));
      SparseSelection s;
      parts.sparsifier->select(a, {}, comm, s);
      expect_valid_selection(s, a);
      EXPECT_EQ(indices_of(s), indices_at_least(a, 2.5f));
      EXPECT_GT(s.size(), 0u);
    }
    {
      // Reference default: 1/(2*sqrt(k)) with k = 100.
      auto parts = make_scheme("threshold", options_of({"density=0.01"}));
      SparseSelection s;
      parts.sparsifier->select(a, {}, comm, s);
      EXPECT_EQ(indices_of(s), indices_at_least(a, static_cast<float>(1.0 / (2.0 * 10.0))));
    }
  });
}

TEST(RandomKScheme, AllRanksDrawTheSameDistinctSortedIndices) {
  for (const int n : {1, 2, 3, 4, 7, 8}) {
    run_thread_world(n, [](Communicator& comm) {
      for (const std::size_t d :
           {std::size_t{1}, std::size_t{10}, std::size_t{1000}, std::size_t{4097}}) {
        auto parts = make_scheme("randomk", options_of({"density=0.3", "seed=12345"}));
        // Each rank sees different values; the indices must not depend on them.
        const auto a = random_vector(d, static_cast<std::uint64_t>(comm.rank()) + 1);
        std::vector<Index> previous;
        for (std::int64_t step = 0; step < 4; ++step) {
          SparseSelection s;
          StepContext ctx;
          ctx.step = step;
          parts.sparsifier->select(a, ctx, comm, s);
          expect_valid_selection(s, a);
          EXPECT_EQ(s.size(), parts.sparsifier->target(d, ctx));
          // Identical on every rank: compare with rank 0's by broadcast.
          std::vector<Index> root = indices_of(s);
          comm.broadcast(writable_bytes_of(std::span<Index>(root)), 0);
          EXPECT_EQ(indices_of(s), root) << "rank " << comm.rank() << " step " << step;
          if (step > 0 && d >= 1000) {
            EXPECT_NE(indices_of(s), previous) << "step " << step;
          }
          previous = indices_of(s);
        }
      }
    });
  }
}

TEST(RandomKScheme, DependsOnSeedAndStepOnlyAndIsUniform) {
  on_one_rank([](Communicator& comm) {
    const std::size_t d = 50;
    const std::vector<float> a(d, 1.0f);
    auto first = make_scheme("randomk", options_of({"density=0.1", "seed=1"}));
    auto again = make_scheme("randomk", options_of({"density=0.1", "seed=1"}));
    auto other = make_scheme("randomk", options_of({"density=0.1", "seed=2"}));
    // Every index is drawn with probability k/d = 0.1: over T steps its
    // count is Binomial(T, 0.1); allow 6 standard deviations.
    const int steps = 4000;
    std::vector<int> hits(d, 0);
    int same_as_other = 0;
    for (int step = 0; step < steps; ++step) {
      StepContext ctx;
      ctx.step = step;
      SparseSelection s1, s2, s3;
      first.sparsifier->select(a, ctx, comm, s1);
      again.sparsifier->select(a, ctx, comm, s2);
      other.sparsifier->select(a, ctx, comm, s3);
      ASSERT_EQ(indices_of(s1), indices_of(s2));
      same_as_other += indices_of(s1) == indices_of(s3) ? 1 : 0;
      for (const Index i : s1.indices) ++hits[i];
    }
    EXPECT_LT(same_as_other, 5);
    const double mean = steps * 0.1;
    const double sd = std::sqrt(steps * 0.1 * 0.9);
    for (std::size_t i = 0; i < d; ++i) {
      EXPECT_NEAR(hits[i], mean, 6 * sd) << "index " << i;
    }
  });
}

// Checks a DGC selection against the rules of docs/algorithms.md "DGC".
void expect_dgc_rules(const Sparsifier& dgc, const SparseSelection& s, std::span<const float> a,
                      std::size_t k) {
  expect_valid_selection(s, a);
  const schemes::ThresholdSearch& search = as_density(dgc).last_search();
  ASSERT_GE(search.rounds, 1);
  ASSERT_LE(search.rounds, 10);
  EXPECT_EQ(search.found, indices_at_least(a, search.threshold).size());
  const double found = static_cast<double>(search.found);
  if (found > 1.3 * static_cast<double>(k)) {
    SparseSelection expected;
    topk_reference(a, k, 0, expected);
    EXPECT_EQ(indices_of(s), indices_of(expected));
  } else {
    EXPECT_EQ(indices_of(s), indices_at_least(a, search.threshold));
    if (found < 0.8 * static_cast<double>(k)) {
      EXPECT_EQ(search.rounds, 10);
    }
  }
  if (search.rounds > 1 && search.rounds < 10) {
    EXPECT_GE(found, 0.8 * static_cast<double>(k));
  }
}

TEST(DgcScheme, SelectionFollowsTheRules) {
  for (const int n : {1, 3}) {
    run_thread_world(n, [](Communicator& comm) {
      int retried = 0;
      int trimmed = 0;
      for (const std::size_t d : {std::size_t{1}, std::size_t{50}, std::size_t{999},
                                  std::size_t{20000}, std::size_t{150001}}) {
        for (const char* density : {"density=0.001", "density=0.01", "density=0.2"}) {
          auto parts = make_scheme("dgc", options_of({density, "seed=3"}));
          for (std::int64_t step = 0; step < 4; ++step) {
            StepContext ctx;
            ctx.step = step;
            const auto seed = static_cast<std::uint64_t>(comm.rank() * 100 + step) + d;
            const auto a = step % 2 == 0 ? heavy_tailed_vector(d, seed) : random_vector(d, seed);
            SparseSelection s;
            parts.sparsifier->select(a, ctx, comm, s);
            const std::size_t k = parts.sparsifier->target(d, ctx);
            expect_dgc_rules(*parts.sparsifier, s, a, k);
            const auto& search = as_density(*parts.sparsifier).last_search();
            retried += search.rounds > 1 ? 1 : 0;
            trimmed += static_cast<double>(search.found) > 1.3 * static_cast<double>(k) ? 1 : 0;
          }
        }
      }
      EXPECT_GT(trimmed, 0);
      EXPECT_GT(retried, 0);  // the inputs are fixed: both branches are exercised
    });
  }
}

TEST(DgcScheme, SmallVectorsSampleEverythingAndTrimTies) {
  on_one_rank([](Communicator& comm) {
    // d <= 1000: the sample is the whole vector, the threshold the exact k-th
    // magnitude. 20 ties at the top with k = 10: trimmed to the lowest 10.
    std::vector<float> a = random_vector(1000, 8, 0.01f);
    for (std::size_t i = 0; i < 20; ++i) a[50 * i + 7] = (i % 2 != 0) ? -5.0f : 5.0f;
    auto parts = make_scheme("dgc", options_of({"density=0.01"}));
    SparseSelection s;
    parts.sparsifier->select(a, {}, comm, s);
    ASSERT_EQ(s.size(), 10u);
    for (std::size_t j = 0; j < 10; ++j) EXPECT_EQ(s.indices[j], 50 * j + 7);
    // 12 ties: within 1.3k, all kept.
    std::vector<float> b = random_vector(1000, 8, 0.01f);
    for (std::size_t i = 0; i < 12; ++i) b[80 * i + 3] = 5.0f;
    parts.sparsifier->select(b, {}, comm, s);
    EXPECT_EQ(s.size(), 12u);
    EXPECT_EQ(as_density(*parts.sparsifier).last_search().rounds, 1);
  });
}

TEST(DgcScheme, WarmupLowersTheDensityEpochByEpoch) {
  auto parts = make_scheme("dgc", options_of({"density=0.001", "warmup_epochs=4"}));
  const std::size_t d = 1000000;
  const double expected[] = {0.2511886, 0.0630957, 0.0158489, 0.0039811, 0.001, 0.001};
  for (int e = 0; e < 6; ++e) {
    StepContext ctx;
    ctx.epoch = e;
    const std::size_t k = parts.sparsifier->target(d, ctx);
    EXPECT_NEAR(static_cast<double>(k) / d, expected[e], 2e-6) << "epoch " << e;
  }
  StepContext half;
  half.epoch = 0.5;  // fractional epochs interpolate: c^(1.5/5)
  EXPECT_NEAR(static_cast<double>(parts.sparsifier->target(d, half)) / d, std::pow(0.001, 0.3),
              2e-6);
  auto plain = make_scheme("dgc", options_of({"density=0.001"}));
  EXPECT_EQ(plain.sparsifier->target(d, {}), 1000u);
}

TEST(GaussianKScheme, ThresholdFromMomentsAndCountCorrection) {
  on_one_rank([](Communicator& comm) {
    // Normal data: the first threshold lands in [2k/3, 4k/3] (the count is
    // about k +- 3 sqrt(k)).
    const std::size_t d = 200000;
    const auto a = normal_vector(d, 21);
    auto parts = make_scheme("gaussiank", options_of({"density=0.01"}));
    SparseSelection s;
    parts.sparsifier->select(a, {}, comm, s);
    const std::size_t k = 2000;
    const auto& search = as_density(*parts.sparsifier).last_search();
    EXPECT_EQ(search.rounds, 1);
    const Moments m = moments(a);
    const double z = 2.5758293035489004;
    EXPECT_EQ(search.threshold, static_cast<float>(std::abs(m.mean) + m.stddev * z));
    EXPECT_EQ(indices_of(s), indices_at_least(a, search.threshold));
    EXPECT_GE(3 * s.size(), 2 * k);
    EXPECT_LE(3 * s.size(), 4 * k);
  });
}

TEST(GaussianKScheme, SelectionFollowsTheRules) {
  on_one_rank([](Communicator& comm) {
    int retried = 0;
    for (const std::size_t d : {std::size_t{1}, std::size_t{10}, std::size_t{1000},
                                std::size_t{10000}, std::size_t{100000}}) {
      for (const char* density : {"density=0.001", "density=0.01", "density=0.3"}) {
        for (std::uint64_t seed = 0; seed < 3; ++seed) {
          auto parts = make_scheme("gaussiank", options_of({density}));
          // seed 2: 5% large values: the Gaussian threshold finds too many,
          // then none (all equal), and the count correction runs out.
          std::vector<float> a = seed == 0 ? normal_vector(d, d) : heavy_tailed_vector(d, d + seed);
          if (seed == 2) {
            for (std::size_t i = 0; i < d; ++i) a[i] = i % 20 == 0 ? 1.0f : 0.0f;
          }
          SparseSelection s;
          parts.sparsifier->select(a, {}, comm, s);
          expect_valid_selection(s, a);
          const std::size_t k = parts.sparsifier->target(d, {});
          const auto& search = as_density(*parts.sparsifier).last_search();
          if (search.rounds == 0) continue;  // sigma == 0
          ASSERT_LE(search.rounds, 5);
          if (search.found == 0) {  // an empty last pass: the exact top-k instead
            EXPECT_EQ(s.size(), k);
            continue;
          }
          EXPECT_EQ(s.size(), search.found);
          EXPECT_EQ(indices_of(s), indices_at_least(a, search.threshold));
          const bool inside = 3 * s.size() >= 2 * k && 3 * s.size() <= 4 * k;
          if (!inside) {
            EXPECT_EQ(search.rounds, 5) << "d=" << d << " " << density;
          }
          retried += search.rounds > 1 ? 1 : 0;
        }
      }
    }
    EXPECT_GT(retried, 0);
  });
}

TEST(GaussianKScheme, AnEmptyLastPassFallsBackToTheExactTopK) {
  on_one_rank([](Communicator& comm) {
    // 15% ones, the rest zeros: mu + 2.576 sigma = 1.07 selects nothing,
    // 0.8 times that selects all 150 ones (too many), 1.25 times that
    // nothing again: the five passes alternate and end empty.
    const std::size_t d = 1000;
    std::vector<float> a(d, 0.0f);
    for (std::size_t i = 0; i < d; ++i) a[i] = i % 20 < 3 ? 1.0f : 0.0f;
    auto parts = make_scheme("gaussiank", options_of({"density=0.01"}));
    SparseSelection s;
    parts.sparsifier->select(a, {}, comm, s);
    const auto& search = as_density(*parts.sparsifier).last_search();
    EXPECT_EQ(search.rounds, 5);
    EXPECT_EQ(search.found, 0u);
    ASSERT_EQ(s.size(), 10u);
    expect_valid_selection(s, a);
    for (const float v : s.values) EXPECT_EQ(v, 1.0f);
  });
}

TEST(GaussianKScheme, ConstantVectors) {
  on_one_rank([](Communicator& comm) {
    auto parts = make_scheme("gaussiank", options_of({"density=0.1"}));
    SparseSelection s;
    const std::vector<float> zeros(100, 0.0f);
    parts.sparsifier->select(zeros, {}, comm, s);
    EXPECT_TRUE(s.empty());
    const std::vector<float> constant(100, -0.5f);
    parts.sparsifier->select(constant, {}, comm, s);
    ASSERT_EQ(s.size(), 10u);
    for (std::size_t j = 0; j < 10; ++j) {
      EXPECT_EQ(s.indices[j], j);
      EXPECT_EQ(s.values[j], -0.5f);
    }
  });
}

TEST(CltKScheme, LeaderTopKOnEveryRank) {
  for (const int n : {1, 2, 3, 4, 7, 8}) {
    run_thread_world(n, [](Communicator& comm) {
      for (const std::size_t d :
           {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{5003}}) {
        auto parts = make_scheme("cltk", options_of({"density=0.02"}));
        for (std::int64_t step = 0; step < 3; ++step) {
          StepContext ctx;
          ctx.step = step;
          const auto a = random_vector(d, static_cast<std::uint64_t>(comm.rank() * 10 + step));
          SparseSelection s;
          parts.sparsifier->select(a, ctx, comm, s);
          const std::size_t k = parts.sparsifier->target(d, ctx);
          EXPECT_EQ(s.size(), k);
          expect_valid_selection(s, a);
          std::vector<Index> root = indices_of(s);
          const int leader = static_cast<int>(step % comm.size());
          comm.broadcast(writable_bytes_of(std::span<Index>(root)), 0);
          EXPECT_EQ(indices_of(s), root);
          if (comm.rank() == leader) {
            SparseSelection expected;
            topk_reference(a, k, 0, expected);
            EXPECT_EQ(indices_of(s), indices_of(expected));
          }
        }
      }
    });
  }
}

TEST(Schemes, StatelessSaveLoadChecksTheTag) {
  for (const auto& info : scheme_registry()) {
    auto parts = make_scheme(info.name, {});
    StateWriter writer;
    parts.sparsifier->save(writer);
    auto again = make_scheme(info.name, {});
    StateReader reader(writer.bytes());
    EXPECT_NO_THROW(again.sparsifier->load(reader));
    EXPECT_TRUE(reader.at_end());
    auto other = make_scheme(info.name == "topk" ? "dgc" : "topk", {});
    StateReader wrong(writer.bytes());
    EXPECT_THROW(other.sparsifier->load(wrong), Error);
  }
}

}  // namespace
}  // namespace sparsecomm
