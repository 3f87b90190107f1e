#include "sparsecomm/sync/sparsify_sequence.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "sparsecomm/core/timeline.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/estimate.h"

namespace sparsecomm {
namespace {

// "2" or "0, 3".
std::string rank_list(const std::vector<std::uint8_t>& finite_flags) {
  std::string out;
  for (std::size_t r = 0; r < finite_flags.size(); ++r) {
    if (finite_flags[r] != 0) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(r);
  }
  return out;
}

}  // namespace

NonFinitePolicy parse_nonfinite_policy(std::string_view name) {
  if (name == "skip") return NonFinitePolicy::kSkip;
  if (name == "stop") return NonFinitePolicy::kStop;
  throw InvalidArgument(
      fmt::format("[sync] unknown non-finite policy '{}'; valid policies: skip, stop", name));
}

bool agree_all_finite(std::span<const float> gradient, const StepContext& ctx, Communicator& comm,
                      NonFinitePolicy policy, std::vector<std::uint8_t>& finite_flags) {
  const std::uint8_t finite = all_finite(gradient) ? 1 : 0;
  finite_flags.resize(static_cast<std::size_t>(comm.size()));
  comm.allgather(std::as_bytes(std::span<const std::uint8_t>(&finite, 1)),
                 std::as_writable_bytes(std::span<std::uint8_t>(finite_flags)));
  if (std::find(finite_flags.begin(), finite_flags.end(), std::uint8_t{0}) == finite_flags.end()) {
    return true;
  }
  if (policy == NonFinitePolicy::kStop) {
    throw NonFiniteGradient(fmt::format(
        "[sync] rank {}: step {}: non-finite gradient (NaN or inf) on rank(s) {}; policy 'stop'",
        comm.rank(), ctx.step, rank_list(finite_flags)));
  }
  return false;
}

bool begin_finite_step(std::span<float> gradient, const StepContext& ctx, Communicator& comm,
                       NonFinitePolicy policy, std::vector<std::uint8_t>& finite_flags,
                       StepMetrics& metrics) {
  metrics.step = ctx.step;
  metrics.numel = gradient.size();
  TimedSpan agreement("agree finite", "exchange");
  const bool finite = agree_all_finite(gradient, ctx, comm, policy, finite_flags);
  metrics.agreement_s = agreement.stop();
  if (!finite) {
    std::fill(gradient.begin(), gradient.end(), 0.0f);
    metrics.skipped_nonfinite = true;
    metrics.exchange_s = metrics.agreement_s;
  }
  return finite;
}

SparsifySequence::SparsifySequence(SchemeParts parts, std::string_view caller)
    : parts_(std::move(parts)), caller_(caller) {
  if (!parts_.sparsifier || !parts_.memory) {
    throw InvalidArgument(fmt::format("{} needs a sparsifier and a memory (got {}{})", caller_,
                                      parts_.sparsifier ? "a sparsifier" : "no sparsifier",
                                      parts_.memory ? " and a memory" : " and no memory"));
  }
}

const SparseSelection& SparsifySequence::select(std::span<const float> gradient,
                                                const StepContext& ctx, Communicator& comm,
                                                SelectTimes* times) {
  const std::int64_t clipped_before = parts_.memory->clipped_steps();
  TimedSpan accumulate("accumulate", "selection");
  parts_.memory->accumulate(gradient);
  const std::span<float> accumulated = parts_.memory->accumulated();
  const double accumulate_s = accumulate.stop();
  TimedSpan select("select", "selection");
  parts_.sparsifier->select(accumulated, ctx, comm, selection_);
  const double selection_s = select.stop();
  if (times != nullptr) {
    times->accumulate_s = accumulate_s;
    times->selection_s = selection_s;
    times->clipped = parts_.memory->clipped_steps() != clipped_before;
    times->own = parts_.sparsifier->last_stats();
  }
  return selection_;
}

const SparseSelection& SparsifySequence::written_out(const SparseSelection& selection) {
  try {
    selection.expand_known(parts_.memory->accumulated(), written_out_);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(
        fmt::format("{}, scheme '{}': {}", caller_, parts_.sparsifier->name(), e.what()));
  }
  return written_out_;
}

void SparsifySequence::exchanged(std::span<const Index> transmitted, std::span<float> average) {
  parts_.memory->after_exchange(transmitted);
  if (parts_.memory->finishes_average()) parts_.memory->finish(average);
}

void SparsifySequence::observe(std::span<const std::size_t> counts, std::size_t union_size,
                               std::size_t target, const StepContext& ctx) {
  const ExchangeOutcome outcome{counts, union_size, target};
  parts_.sparsifier->observe(outcome, ctx);
}

void SparsifySequence::save(StateWriter& writer) const {
  writer.tag("sparse_sync");
  writer.string(parts_.sparsifier->name());
  parts_.memory->save(writer);
  parts_.sparsifier->save(writer);
}

void SparsifySequence::load(StateReader& reader) {
  reader.expect_tag("sparse_sync");
  const std::string scheme = reader.string();
  if (scheme != parts_.sparsifier->name()) {
    throw Error(fmt::format("[sync] the saved state is of scheme '{}', this run uses '{}'", scheme,
                            parts_.sparsifier->name()));
  }
  parts_.memory->load(reader);
  parts_.sparsifier->load(reader);
}

}  // namespace sparsecomm
