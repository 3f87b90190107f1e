#pragma once
// The one list of synchronization schemes: names -> factories with declared,
// validated options. The CLI, the benchmarks and the tests all use it.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/sparsifier.h"

namespace sparsecomm {

// A built scheme: the sparsifier plus how it is exchanged and remembered.
struct SchemeParts {
  std::unique_ptr<Sparsifier> sparsifier;
  std::unique_ptr<GradientMemory> memory;
  ExchangePattern exchange = ExchangePattern::kUnionAllreduce;
  ExchangeOptions exchange_options;
};

struct SchemeInfo {
  std::string name;                 // "topk", "dgc", ...
  std::string summary;              // one line for --help
  std::vector<OptionSpec> options;  // scheme-specific + the common ones
  std::function<SchemeParts(const SchemeOptions&)> make;
};

// Options every scheme accepts: density (in (0, 1]), exchange (pattern name,
// default: the scheme's own), values (fp32|fp16|bf16), encode_indices,
// memory (ef|none|momentum; DGC defaults to momentum), momentum and
// clip_norm (memory=momentum only), seed.
const std::vector<OptionSpec>& common_option_specs();

// All registered schemes, in a fixed order.
const std::vector<SchemeInfo>& scheme_registry();
// The scheme called `name`, or null.
const SchemeInfo* find_scheme(std::string_view name);

// Looks up `name` and builds it. Unknown names and invalid or unknown
// options throw InvalidArgument listing what is valid.
SchemeParts make_scheme(std::string_view name, const SchemeOptions& options);

// True when scheme `name` with `options` uses the momentum-correction memory,
// which applies momentum itself: the optimizer must then apply none. False
// for names that are not schemes (e.g. "dense").
bool scheme_applies_momentum(std::string_view name, const SchemeOptions& options);

// "topk, threshold, randomk, ..." for messages.
std::string scheme_names();

}  // namespace sparsecomm
