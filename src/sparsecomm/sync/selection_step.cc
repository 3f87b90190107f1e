#include "sparsecomm/sync/selection_step.h"

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

SelectionStep::SelectionStep(SchemeParts parts, NonFinitePolicy policy)
    : sequence_(std::move(parts), "[sync] SelectionStep"), policy_(policy) {
  const SchemeParts& scheme = sequence_.parts();
  if (scheme.traits.every_coordinate) {
    throw InvalidArgument(fmt::format(
        "[sync] {} selects every coordinate and compresses in its exchange's value codec ({}); "
        "a selection without the exchange would send the full gradient: use it through the DDP "
        "hook or `sparsecomm train`, or choose a sparsifier",
        scheme.sparsifier->name(), value_encoding_name(scheme.exchange_options.values)));
  }
  if (scheme.memory->finishes_average()) {
    throw InvalidArgument(fmt::format(
        "[sync] memory={} applies a running estimate that only the exchange can finish; a "
        "selection without the exchange cannot use it (use memory=ef, or a Synchronizer)",
        scheme.memory->name()));
  }
}

const SparseSelection& SelectionStep::select(std::span<const float> gradient,
                                             const StepContext& ctx, Communicator& comm) {
  skipped_ = !agree_all_finite(gradient, ctx, comm, policy_, finite_flags_);
  if (skipped_) {
    counts_.assign(static_cast<std::size_t>(comm.size()), 0);
    return empty_;
  }
  const SparseSelection& selection = sequence_.select(gradient, ctx, comm);
  const SparseSelection& sent =
      selection.known.empty() ? selection : sequence_.written_out(selection);
  sequence_.sent(sent);

  // The counts exclude the known ranges, as the exchanges' counts do.
  const std::size_t mine = selection.size();
  counts_.resize(static_cast<std::size_t>(comm.size()));  // no allocation after the first step
  comm.allgather(std::as_bytes(std::span<const std::size_t>(&mine, 1)),
                 std::as_writable_bytes(std::span<std::size_t>(counts_)));
  std::size_t union_size = 0;
  for (const std::size_t count : counts_) union_size += count;
  sequence_.observe(counts_, union_size, sequence_.target(gradient.size(), ctx), ctx);
  return sent;
}

void SelectionStep::save(StateWriter& writer) const { sequence_.save(writer); }

void SelectionStep::load(StateReader& reader) { sequence_.load(reader); }

}  // namespace sparsecomm
