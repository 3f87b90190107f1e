#pragma once
// The one list of synchronization schemes: names -> factories with declared,
// validated options. The CLI, the benchmarks and the tests all use it.

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/sparsify/memory.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sparsify/sparsifier.h"

namespace sparsecomm {

// What the rest of the project knows of a scheme without building it,
// declared once on its registry entry (sparsify/schemes/<name>.cc): sync/
// decides bucketing from it, ps/ which synchronization models may push with
// it, perf/ how a step is priced.
struct SchemeTraits {
  // Who picks the indices. It decides the default exchange, and the price.
  enum class Selection {
    kIndependent,  // each rank from its whole vector alone: sparse allgather
    kShared,       // every rank the same indices from a shared seed: values all-reduced
    kLeader,       // one rank selects and broadcasts the indices: values all-reduced
    kPartitioned,  // each rank in its own part of the vector: union all-reduce
  };
  Selection selection = Selection::kIndependent;
  // Selects over the whole vector at once (partitions that span the model):
  // it cannot run per bucket.
  bool spans_the_model = false;
  // The ranks agree on a same-step threshold capped per rank by default (one
  // more histogram in the first round; ExDyna's).
  bool capped_threshold = false;
  // The partitions are contiguous ranges (MiCRO's); else scattered blocks.
  bool ranged_partitions = false;
  // Sends whole pieces as known ranges (DEFT's; SparseSelection::known).
  bool whole_pieces = false;
  // Why the performance model cannot price the scheme; empty when it can.
  std::string_view unpriced_because = {};
  // Sends every coordinate every step (the dense quantizers): no density
  // option, no index on the wire; the value codec is the compression.
  bool every_coordinate = false;
  // The values= default (the quantizers' own codec; fp32 for the rest).
  ValueEncoding default_values = ValueEncoding::kFloat32;
  // The options the device path implements (the DDP hook selecting on the
  // gradients' own device, python/src/device_sync.cc): "name" takes any
  // value, "name=value" that value only. Empty: the scheme has no device
  // path and runs on the host.
  std::span<const std::string_view> device_options = {};

  // Its selections carry known ranges (DEFT's pieces; the dense
  // quantizers' whole vector), which the ok-topk pattern cannot carry.
  bool sends_known_ranges() const { return whole_pieces || every_coordinate; }
  // Every rank selects the same indices: the "shared" exchange applies.
  bool identical_selections() const {
    return selection == Selection::kShared || selection == Selection::kLeader;
  }
  // select() runs collectives among the ranks (an agreed threshold, a
  // leader's broadcast, all-gathered counts), so all ranks select in the
  // same step: the parameter server takes such pushes under BSP only.
  bool selects_together() const {
    return selection == Selection::kPartitioned || selection == Selection::kLeader;
  }
  // The exchange the scheme was designed with (docs/algorithms.md).
  ExchangePattern default_exchange() const;
};

// A built scheme: the sparsifier plus how it is exchanged and remembered.
struct SchemeParts {
  std::unique_ptr<Sparsifier> sparsifier;
  std::unique_ptr<GradientMemory> memory;
  ExchangePattern exchange = ExchangePattern::kUnionAllreduce;
  ExchangeOptions exchange_options;
  SchemeTraits traits;  // the registry entry's
};

struct SchemeInfo {
  std::string name;     // "topk", "dgc", ...
  std::string summary;  // one line for --help
  SchemeTraits traits;
  std::vector<OptionSpec> options;  // scheme-specific + the common ones
  std::function<SchemeParts(const SchemeOptions&)> make;
};

// Options every scheme accepts: density (in (0, 1]; not for the schemes
// that send every coordinate), exchange (pattern name, default: the
// scheme's own), values (a value_codec.h encoding), encode_indices,
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

// The exchange patterns (option exchange=) a scheme with `traits` accepts:
// union, allgather and sparse-allreduce always; ok-topk unless it sends
// known ranges; shared when every rank selects the same indices.
std::vector<std::string> exchange_choices(const SchemeTraits& traits);

// "topk, threshold, randomk, ..." for messages.
std::string scheme_names();

}  // namespace sparsecomm
