// PsOptions validation: which push methods PS mode accepts, under which
// synchronization models.

#include <string>
#include <string_view>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/sparsify/registry.h"

namespace sparsecomm {
namespace {

// The schemes a push can carry whose workers select together
// (SchemeTraits::selects_together) or not, as "a, b, c". The dense
// quantizers are not among them: they compress through their value codec
// only, and pushes send fp32 values with raw indices.
std::string push_schemes(bool together) {
  std::string out;
  for (const SchemeInfo& info : scheme_registry()) {
    if (info.traits.selects_together() != together || info.traits.every_coordinate) continue;
    if (!out.empty()) out += ", ";
    out += info.name;
  }
  return out;
}

}  // namespace

std::string ps_push_methods() {
  return fmt::format("dense, {} (every --sync model); {} (--sync bsp only)", push_schemes(false),
                     push_schemes(true));
}

bool ps_push_is_partition_based(std::string_view push) {
  const SchemeInfo* info = find_scheme(push);
  return info != nullptr && info->traits.selects_together();
}

void validate_ps_options(const PsOptions& options) {
  make_flat_optimizer(options.optimizer);  // InvalidArgument for bad optimizer options
  if (options.push == "dense") {
    if (!options.scheme_options.values().empty()) {
      throw InvalidArgument(fmt::format(
          "[ps] push method 'dense' takes no scheme options (got '{}'); options are for the "
          "sparse methods: {}",
          options.scheme_options.values().begin()->first, ps_push_methods()));
    }
    return;
  }
  if (options.push == "demo") {
    throw InvalidArgument(fmt::format(
        "[ps] demo is not a push method: every worker applies the sign of the mean of all "
        "workers' coefficients, which servers that only add do not produce; run it without "
        "--servers, or push with one of: {}",
        ps_push_methods()));
  }
  if (options.push == "powersgd" || options.push == "skipreduce") {
    // Both work on the sum inside an all-reduce among the workers: PowerSGD
    // orthonormalizes the summed P before any worker computes its Q, and
    // Skip-Reduce drops steps of the ring; a push carries one worker's
    // gradient to servers that only add.
    throw InvalidArgument(fmt::format(
        "[ps] {} is not a push method: it compresses inside an all-reduce among the workers "
        "({}), which a push to the servers does not have; run it without --servers, or push "
        "with one of: {}",
        options.push,
        options.push == "powersgd" ? "the summed P is orthonormalized before each worker's Q"
                                   : "it skips steps of the ring",
        ps_push_methods()));
  }
  const SchemeInfo* scheme = find_scheme(options.push);
  if (scheme == nullptr) {
    throw InvalidArgument(fmt::format("[ps] unknown push method '{}'; PS push methods: {}",
                                      options.push, ps_push_methods()));
  }
  if (scheme->traits.every_coordinate) {
    throw InvalidArgument(fmt::format(
        "[ps] {} sends every coordinate and compresses through its value codec, which pushes do "
        "not carry (they send fp32 values with raw indices: twice dense's bytes); push dense, or "
        "one of: {}",
        options.push, ps_push_methods()));
  }
  if (ps_push_is_partition_based(options.push) && options.model.kind != SyncModelKind::kBsp) {
    throw InvalidArgument(fmt::format(
        "[ps] scheme '{}' is partition-based: its workers select together (a shared step, "
        "collectives among the workers, all-gathered counts), so PS mode allows it only under "
        "BSP, not under '{}'; use --sync bsp, or a per-worker push method: dense, {}",
        options.push, options.model.name(), push_schemes(false)));
  }
  for (const char* key : {"exchange", "values", "encode_indices"}) {
    if (options.scheme_options.has(key)) {
      throw InvalidArgument(fmt::format(
          "[ps] option '{}' of scheme '{}' does not apply in PS mode: pushes carry fp32 values "
          "and raw shard-relative indices; remove it",
          key, options.push));
    }
  }
  const SchemeParts parts = make_scheme(options.push, options.scheme_options);
  if (ps_push_is_partition_based(options.push)) {
    // The push derives the step's union size K from the declared exchange
    // (PsWorker::push): disjoint selections (union) or identical ones
    // (shared). Any other pattern would need the indices of every worker.
    const ExchangePattern pattern = parts.traits.default_exchange();
    if (pattern != ExchangePattern::kUnionAllreduce && pattern != ExchangePattern::kSharedIndices) {
      throw InvalidArgument(fmt::format(
          "[ps] scheme '{}' declares the '{}' exchange; PS mode supports partition-based schemes "
          "with the 'union' (disjoint selections) or 'shared' (identical selections) exchange",
          options.push, exchange_pattern_name(pattern)));
    }
  }
  if (parts.memory && parts.memory->finishes_average()) {
    throw InvalidArgument(fmt::format(
        "[ps] memory={} applies a running estimate of the mean gradient, which the servers do "
        "not keep; use memory=ef for parameter-server pushes",
        parts.memory->name()));
  }
  if (parts.memory && parts.memory->applies_momentum()) {
    if (options.optimizer.name != "sgd") {
      throw InvalidArgument(fmt::format(
          "[ps] scheme '{}' applies momentum on the workers (momentum correction), which only "
          "SGD on the servers can follow; with --optimizer {} give the scheme -o memory=ef (error "
          "feedback) or use SGD",
          options.push, options.optimizer.name));
    }
    if (options.optimizer.sgd.momentum != 0.0) {
      throw InvalidArgument(fmt::format(
          "[ps] scheme '{}' applies momentum on the workers (momentum correction), so the "
          "servers' SGD momentum must be 0 (got {})",
          options.push, options.optimizer.sgd.momentum));
    }
  }
}

}  // namespace sparsecomm
