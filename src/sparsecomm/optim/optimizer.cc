#include "sparsecomm/optim/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/optim/adamw.h"
#include "sparsecomm/optim/muon.h"
#include "sparsecomm/optim/sgd.h"

namespace sparsecomm {

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"sgd", "adamw", "muon"};
  return names;
}

std::unique_ptr<FlatOptimizer> make_flat_optimizer(const OptimizerOptions& options) {
  if (options.name == "sgd") return std::make_unique<FlatSgd>(options.sgd);
  if (options.name == "adamw") return std::make_unique<FlatAdamW>(options.adamw);
  if (options.name == "muon") return std::make_unique<FlatMuon>(options.muon, options.adamw);
  throw InvalidArgument(fmt::format("'{}' is not an optimizer; valid: {}", options.name,
                                    fmt::join(optimizer_names(), ", ")));
}

}  // namespace sparsecomm
