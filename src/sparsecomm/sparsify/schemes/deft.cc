#include "sparsecomm/sparsify/schemes/deft.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/kernels/topk.h"
#include "sparsecomm/sparsify/schemes/schemes.h"

namespace sparsecomm {

namespace {
constexpr std::int32_t kNoSelection = -1;
constexpr std::int32_t kWhole = -2;
}  // namespace

std::vector<Range> deft_pieces(std::span<const LayerSpan> layers, std::size_t numel, int world) {
  std::vector<LayerSpan> tensors(layers.begin(), layers.end());
  if (tensors.empty()) tensors.push_back({"all", 0, numel});
  std::vector<Range> pieces;
  const std::size_t limit = numel / static_cast<std::size_t>(world);
  for (const LayerSpan& tensor : tensors) {
    if (tensor.size == 0) continue;
    if (tensor.size > limit && world > 1) {
      for (const Range& part : equal_partitions(tensor.size, world)) {
        if (!part.empty()) pieces.push_back({tensor.offset + part.begin, tensor.offset + part.end});
      }
    } else {
      pieces.push_back({tensor.offset, tensor.offset + tensor.size});
    }
  }
  return pieces;
}

std::vector<std::int64_t> deft_allocate(std::span<const double> norms,
                                        std::span<const Range> pieces, std::size_t k,
                                        bool force_one) {
  const std::size_t count = pieces.size();
  std::vector<std::int64_t> budget(count, 0);
  std::vector<std::size_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  // Descending norm; ties by position so every rank would order alike.
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return norms[a] > norms[b]; });
  auto remaining_k = static_cast<std::int64_t>(k);
  double remaining_norm = 0;
  for (double norm : norms) remaining_norm += norm;
  std::size_t remaining_size = 0;
  for (const Range& piece : pieces) remaining_size += piece.size();
  for (std::size_t position = 0; position < count; ++position) {
    const std::size_t l = order[position];
    const auto size = static_cast<std::int64_t>(pieces[l].size());
    std::int64_t k_l;
    if (remaining_norm > 0) {
      k_l = static_cast<std::int64_t>(
          std::floor(static_cast<double>(remaining_k) * norms[l] / remaining_norm));
    } else {
      // No norm left: split what remains by size.
      k_l = remaining_size > 0 ? static_cast<std::int64_t>(static_cast<double>(remaining_k) *
                                                           static_cast<double>(size) /
                                                           static_cast<double>(remaining_size))
                               : 0;
    }
    if (force_one && k_l < 1 && remaining_k > 0) k_l = 1;
    k_l = std::clamp<std::int64_t>(k_l, 0, std::min(size, remaining_k));
    budget[l] = k_l;
    remaining_k -= k_l;
    remaining_norm = std::max(0.0, remaining_norm - norms[l]);
    remaining_size -= pieces[l].size();
  }
  return budget;
}

std::vector<std::int32_t> deft_pack(std::span<const Range> pieces,
                                    std::span<const std::int64_t> budget, int bins) {
  std::vector<std::int32_t> bin(pieces.size(), kNoSelection);
  std::vector<std::pair<double, std::size_t>> work;
  for (std::size_t l = 0; l < pieces.size(); ++l) {
    if (budget[l] <= 0) continue;
    if (budget[l] == static_cast<std::int64_t>(pieces[l].size())) {
      bin[l] = kWhole;
      continue;
    }
    const double size = static_cast<double>(pieces[l].size());
    const double cost = budget[l] <= 1 ? size : size * std::log2(static_cast<double>(budget[l]));
    work.emplace_back(cost, l);
  }
  // Most expensive first (ties by position), each into the least-loaded bin
  // (ties by lower bin).
  std::stable_sort(work.begin(), work.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<double> load(static_cast<std::size_t>(bins), 0.0);
  for (const auto& [cost, l] : work) {
    const auto lightest =
        static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    bin[l] = static_cast<std::int32_t>(lightest);
    load[lightest] += cost;
  }
  return bin;
}

namespace {

class DeftSparsifier final : public Sparsifier {
 public:
  explicit DeftSparsifier(const DeftOptions& options) : options_(options) {}

  std::string_view name() const override { return "deft"; }
  std::size_t target(std::size_t numel, const StepContext&) const override {
    return target_count(options_.density, numel);
  }

  void select(std::span<const float> accumulated, const StepContext& ctx, Communicator& comm,
              SparseSelection& out) override {
    const int n = comm.size();
    if (plan_.pieces.empty() || numel_ != accumulated.size() || world_ != n) {
      numel_ = accumulated.size();
      world_ = n;
      plan_.pieces = deft_pieces(ctx.layers, numel_, n);
    }
    const std::size_t count = plan_.pieces.size();
    const int leader = static_cast<int>(ctx.step % n);
    plan_.budget.assign(count, 0);
    plan_.bin.assign(count, kNoSelection);
    if (comm.rank() == leader) {
      norms_.assign(count, 0.0);
      for (std::size_t l = 0; l < count; ++l) {
        double sum = 0;
        for (std::size_t i = plan_.pieces[l].begin; i < plan_.pieces[l].end; ++i) {
          sum += static_cast<double>(accumulated[i]) * accumulated[i];
        }
        norms_[l] = std::sqrt(sum);
      }
      plan_.budget = deft_allocate(norms_, plan_.pieces, target(numel_, ctx), options_.force_one);
      plan_.bin = deft_pack(plan_.pieces, plan_.budget, n);
    }
    // The leader's plan, budgets included, on every rank.
    comm.broadcast(writable_bytes_of(std::span<std::int64_t>(plan_.budget)), leader);
    comm.broadcast(writable_bytes_of(std::span<std::int32_t>(plan_.bin)), leader);

    const auto my_bin = static_cast<std::int32_t>((leader + comm.rank()) % n);
    out.clear();
    read_nothing();
    if (comm.rank() == leader) last_read_.push_back({0, numel_});  // the norm pass
    // Pieces are in ascending offset order, so appending keeps indices sorted.
    for (std::size_t l = 0; l < count; ++l) {
      const Range piece = plan_.pieces[l];
      if (plan_.bin[l] == my_bin) {
        record_read(piece);
        topk_.select(accumulated.subspan(piece.begin, piece.size()),
                     static_cast<std::size_t>(plan_.budget[l]), static_cast<Index>(piece.begin),
                     out);
      } else if (plan_.bin[l] == kWhole) {
        // Whole pieces (k_l == size_l): every rank knows them from the plan,
        // so they join the union as known ranges, with no index exchange
        // (their values are still summed). Adjacent ones are merged.
        if (!out.known.empty() && out.known.back().end == piece.begin) {
          out.known.back().end = piece.end;
        } else {
          out.known.push_back(piece);
        }
      }
    }
  }

  void save(StateWriter& writer) const override {
    writer.tag("deft");
    writer.value(options_.density);
  }
  void load(StateReader& reader) override {
    reader.expect_tag("deft");
    const auto density = reader.value<double>();
    if (density != options_.density) {
      throw Error(
          fmt::format("[deft] saved state has density {}, this run {}", density, options_.density));
    }
  }

  const DeftPlan& plan() const { return plan_; }

 private:
  // Adds `piece` to what this step read, joined to the previous piece when
  // contiguous (one pass over both). The leader's norm pass [0, d) ends
  // where no piece begins, so it is never extended.
  void record_read(Range piece) {
    if (!last_read_.empty() && last_read_.back().end == piece.begin) {
      last_read_.back().end = piece.end;
    } else {
      last_read_.push_back(piece);
    }
  }

  DeftOptions options_;
  std::size_t numel_ = 0;
  int world_ = 0;
  DeftPlan plan_;
  std::vector<double> norms_;
  TopKSelector topk_;
};

}  // namespace

std::unique_ptr<Sparsifier> make_deft_sparsifier(const DeftOptions& options) {
  return std::make_unique<DeftSparsifier>(options);
}

std::vector<OptionSpec> deft_option_specs() {
  return {{"force_one", "true", "give every piece k_l >= 1 while budget remains (reference)"}};
}

DeftOptions deft_options_from(const SchemeOptions& options) {
  DeftOptions deft;
  deft.density = options.number("deft", "density", 0.01, 0.0, 1.0, /*min_exclusive=*/true);
  deft.force_one = options.flag("deft", "force_one", true);
  return deft;
}

namespace schemes {

SchemeDefinition deft_definition() {
  return {.name = "deft",
          .summary = "layer pieces, leader's norm-based budgets, bin-packed per-piece exact top-k",
          .traits = {.selection = SchemeTraits::Selection::kPartitioned, .whole_pieces = true},
          .options = deft_option_specs(),
          .build = [](const SchemeOptions& options, const CommonOptions&, SchemeParts& parts) {
            parts.sparsifier = make_deft_sparsifier(deft_options_from(options));
          }};
}

}  // namespace schemes
}  // namespace sparsecomm
