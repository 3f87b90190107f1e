// PsOptions validation: which push methods PS mode accepts.

#include <algorithm>
#include <array>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/ps/parameter_server.h"

namespace sparsecomm {
namespace {

// Schemes whose selection needs nothing from other ranks.
constexpr std::array<std::string_view, 5> kPerWorkerSchemes = {"topk", "threshold", "randomk",
                                                               "dgc", "gaussiank"};

}  // namespace

std::string ps_push_methods() {
  std::string out = "dense";
  for (const std::string_view name : kPerWorkerSchemes) out += fmt::format(", {}", name);
  return out;
}

void validate_ps_options(const PsOptions& options) {
  const FlatSgd sgd(options.sgd);  // InvalidArgument for bad SGD options
  (void)sgd;
  if (options.push == "dense") {
    if (!options.scheme_options.values().empty()) {
      throw InvalidArgument(fmt::format(
          "[ps] push method 'dense' takes no scheme options (got '{}'); options are for the "
          "sparse methods: {}",
          options.scheme_options.values().begin()->first, ps_push_methods()));
    }
    return;
  }
  if (std::find(kPerWorkerSchemes.begin(), kPerWorkerSchemes.end(), options.push) ==
      kPerWorkerSchemes.end()) {
    const auto& registry = scheme_registry();
    const bool known = std::any_of(registry.begin(), registry.end(), [&](const SchemeInfo& info) {
      return info.name == options.push;
    });
    if (known) {
      throw InvalidArgument(fmt::format(
          "[ps] scheme '{}' is partition-based: it needs a shared step and collectives among the "
          "workers, which PS mode does not provide; PS push methods: {}",
          options.push, ps_push_methods()));
    }
    throw InvalidArgument(fmt::format("[ps] unknown push method '{}'; PS push methods: {}",
                                      options.push, ps_push_methods()));
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
  if (parts.memory && parts.memory->name() == "momentum" && options.sgd.momentum != 0.0) {
    throw InvalidArgument(fmt::format(
        "[ps] scheme '{}' applies momentum on the workers (momentum correction), so the "
        "servers' SGD momentum must be 0 (got {})",
        options.push, options.sgd.momentum));
  }
}

}  // namespace sparsecomm
