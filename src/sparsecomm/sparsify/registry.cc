// The scheme registry: the common options, the fixed list of schemes, and
// make_scheme(). Each scheme's own options and build live in its file under
// schemes/; this file only parses what every scheme shares.

#include "sparsecomm/sparsify/registry.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "sparsecomm/collectives/index_codec.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm {
namespace {

using schemes::SchemeDefinition;

// The schemes, in the order --help and the tests list them. One line each.
std::vector<SchemeDefinition> make_definitions() {
  // clang-format off
  return {
      schemes::topk_definition(),
      schemes::threshold_definition(),
      schemes::randomk_definition(),
      schemes::dgc_definition(),
      schemes::gaussiank_definition(),
      schemes::cltk_definition(),
      schemes::micro_definition(),
      schemes::exdyna_definition(),
      schemes::exdyna_faithful_definition(),
      schemes::deft_definition(),
      schemes::qsgd_definition(),
      schemes::terngrad_definition(),
      schemes::signsgd_definition(),
      schemes::natural_definition(),
  };
  // clang-format on
}

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

// The common specs with this scheme's defaults filled in.
std::vector<OptionSpec> specs_for(const SchemeDefinition& definition) {
  std::vector<OptionSpec> specs = definition.options;
  for (OptionSpec spec : common_option_specs()) {
    if (spec.name == "density" && definition.traits.every_coordinate) continue;
    if (spec.name == "values") {
      spec.default_value = std::string(value_encoding_name(definition.traits.default_values));
    } else if (spec.name == "exchange") {
      spec.default_value = std::string(exchange_pattern_name(definition.traits.default_exchange()));
      spec.help = "exchange pattern: " + join(exchange_choices(definition.traits), "|");
    } else if (spec.name == "memory") {
      spec.default_value = definition.memories.front();
      spec.help = "gradient memory: " + join(definition.memories, "|") +
                  " (ef = error feedback, none = drop what is not sent, momentum = DGC's "
                  "momentum correction with masking; the optimizer then applies no momentum, "
                  "ef21 = send the change of each rank's gradient estimate, apply the mean "
                  "estimate)";
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

SchemeParts build(const SchemeDefinition& definition, const SchemeOptions& options) {
  const std::string_view scheme = definition.name;
  options.check_known(scheme, specs_for(definition));

  schemes::CommonOptions common;
  common.scheme = definition.name;
  common.density = definition.traits.every_coordinate
                       ? 1.0
                       : options.number(scheme, "density", 0.01, 0.0, 1.0, /*min_exclusive=*/true);
  common.seed = static_cast<std::uint64_t>(
      options.integer(scheme, "seed", 0, 0, std::numeric_limits<std::int64_t>::max()));
  common.memory =
      options.choice(scheme, "memory", definition.memories.front(), definition.memories);

  SchemeParts parts;
  parts.traits = definition.traits;
  const std::string default_exchange(exchange_pattern_name(definition.traits.default_exchange()));
  if (!definition.traits.identical_selections() && options.has("exchange") &&
      options.values().at("exchange") == "shared") {
    throw InvalidArgument(fmt::format(
        "[{}] option exchange=shared needs every rank to select the same indices, which {} does "
        "not; use one of: {}",
        scheme, scheme, join(exchange_choices(definition.traits), ", ")));
  }
  parts.exchange = parse_exchange_pattern(
      options.choice(scheme, "exchange", default_exchange, exchange_choices(definition.traits)));
  parts.exchange_options.values = parse_value_encoding(
      options.choice(scheme, "values", value_encoding_name(definition.traits.default_values),
                     value_encoding_names()));
  parts.exchange_options.encode_indices = options.flag(scheme, "encode_indices", true);

  const double inf = std::numeric_limits<double>::infinity();
  const double momentum = options.number(scheme, "momentum", 0.9, 0.0, 1.0);
  if (momentum >= 1.0) {
    throw InvalidArgument(fmt::format("[{}] option momentum={} must be below 1", scheme,
                                      options.values().at("momentum")));
  }
  const double clip_norm = options.number(scheme, "clip_norm", 0.0, 0.0, inf);
  if (std::isinf(clip_norm)) {
    throw InvalidArgument(fmt::format("[{}] option clip_norm must be finite (0 = off)", scheme));
  }
  const double decay = options.number(scheme, "decay", 1.0, 0.0, 1.0, /*min_exclusive=*/true);
  if (common.memory != "ef" && options.has("decay")) {
    throw InvalidArgument(
        fmt::format("[{}] option decay belongs to memory=ef (e = decay * e + g), not memory={}",
                    scheme, common.memory));
  }
  if (common.memory != "momentum" && (options.has("momentum") || options.has("clip_norm"))) {
    throw InvalidArgument(
        fmt::format("[{}] options momentum and clip_norm belong to memory=momentum (DGC's momentum "
                    "correction), not memory={}",
                    scheme, common.memory));
  }
  if (common.memory == "ef") parts.memory = make_error_feedback(decay);
  if (common.memory == "none") parts.memory = make_no_memory();
  if (common.memory == "momentum") parts.memory = make_momentum_correction(momentum, clip_norm);
  if (common.memory == "ef21") parts.memory = make_ef21();
  definition.build(options, common, parts);
  if (!parts.sparsifier || !parts.memory) {
    throw Error(fmt::format("[{}] the scheme's build left no {} (a bug in the scheme)", scheme,
                            parts.sparsifier ? "memory" : "sparsifier"));
  }
  // A memory that keeps nothing replays nothing: no clip unless asked for
  // with memory=none, or at density 1 (everything is sent every step).
  // Nothing stays in the memory without one, or when every coordinate goes
  // out at a precision that leaves only float rounding behind.
  const bool keeps_nothing =
      common.memory == "none" ||
      (common.density == 1.0 && !is_block_quantized(parts.exchange_options.values));
  const double clip_ratio =
      options.number(scheme, "clip_ratio", keeps_nothing ? 0.0 : kDefaultSpikeClipRatio, 0.0, inf);
  if (clip_ratio != 0.0 && !(clip_ratio > 1.0 && std::isfinite(clip_ratio))) {
    throw InvalidArgument(fmt::format(
        "[{}] option clip_ratio={} must be a finite number above 1 (a gradient may be that many "
        "times the running mean of the recent ones), or 0 to turn the spike clip off",
        scheme, options.values().at("clip_ratio")));
  }
  if (clip_ratio != 0.0) parts.memory = with_spike_clip(std::move(parts.memory), clip_ratio);
  return parts;
}

}  // namespace

ExchangePattern SchemeTraits::default_exchange() const {
  switch (selection) {
    case Selection::kIndependent:
      return ExchangePattern::kSparseAllgather;
    case Selection::kShared:
    case Selection::kLeader:
      return ExchangePattern::kSharedIndices;
    case Selection::kPartitioned:
      return ExchangePattern::kUnionAllreduce;
  }
  return ExchangePattern::kSparseAllgather;
}

const std::vector<OptionSpec>& common_option_specs() {
  static const std::vector<OptionSpec> specs = {
      {"density", "0.01", "target density c in (0, 1]: k = max(1, floor(c*d)) per step"},
      {"exchange", "(the scheme's own)",
       "exchange pattern: union|allgather|sparse-allreduce|shared"},
      {"values", "fp32",
       "value encoding on the wire: fp32|fp16|bf16, or with allgather, union or shared intB "
       "(B = 8, 4, 2 bits and one scale per 128 values; -sr: stochastic rounding), sign (1 "
       "bit and a scale per 128 values), nat (a power of two in 8 bits, unbiased) or lloyd2 "
       "(2 bits: the sign and one of two magnitudes per 128 values, for selected values); "
       "the residual keeps the rounding error"},
      {"encode_indices", "true", "delta-varint indices on the wire"},
      {"memory", "ef", "gradient memory: ef|none|momentum (dgc: momentum first, its default)"},
      {"momentum", "0.9",
       "memory=momentum only: m of the correction u = m*u + g, v = v + u, in [0, 1)"},
      {"decay", "1",
       "memory=ef only: e = decay*e + g, in (0, 1] (1: plain error feedback; below 1 what was "
       "held back fades, as SparseLoCo's accumulator on --local-steps pseudo-gradients)"},
      {"clip_norm", "0",
       "memory=momentum only: scale g to ||g||_2 <= clip_norm before it enters u (0 = off)"},
      {"clip_ratio", fmt::format("{}", kDefaultSpikeClipRatio),
       "spike clip: scale g down to clip_ratio times the running mean of this rank's recent "
       "gradient norms before it enters the memory, so the memory cannot replay a loss spike "
       "(0 = off, the default with memory=none or density 1; else above 1)"},
      {"seed", "0", "seed of the counter-based random draws (identical on all ranks)"},
  };
  return specs;
}

const std::vector<SchemeInfo>& scheme_registry() {
  static const std::vector<SchemeInfo> registry = [] {
    std::vector<SchemeInfo> out;
    for (SchemeDefinition& definition : make_definitions()) {
      SchemeInfo info;
      info.name = definition.name;
      info.summary = definition.summary;
      info.traits = definition.traits;
      info.options = specs_for(definition);
      info.make = [definition](const SchemeOptions& options) { return build(definition, options); };
      out.push_back(std::move(info));
    }
    return out;
  }();
  return registry;
}

const SchemeInfo* find_scheme(std::string_view name) {
  for (const auto& info : scheme_registry()) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::string scheme_names() {
  std::vector<std::string> names;
  for (const auto& info : scheme_registry()) names.push_back(info.name);
  return join(names, ", ");
}

bool scheme_applies_momentum(std::string_view name, const SchemeOptions& options) {
  const SchemeInfo* info = find_scheme(name);
  if (info == nullptr) return false;
  if (options.has("memory")) return options.values().at("memory") == "momentum";
  for (const auto& spec : info->options) {
    if (spec.name == "memory") return spec.default_value == "momentum";
  }
  return false;
}

SchemeParts make_scheme(std::string_view name, const SchemeOptions& options) {
  if (const SchemeInfo* info = find_scheme(name)) return info->make(options);
  throw InvalidArgument(
      fmt::format("[registry] unknown scheme '{}'; valid schemes: {}", name, scheme_names()));
}

std::vector<std::string> exchange_choices(const SchemeTraits& traits) {
  std::vector<std::string> out = {"union", "allgather", "sparse-allreduce"};
  if (!traits.sends_known_ranges()) out.emplace_back("ok-topk");
  if (traits.identical_selections()) out.emplace_back("shared");
  return out;
}

}  // namespace sparsecomm
