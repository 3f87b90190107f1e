#include "sparsecomm/sync/selection_step.h"

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

SelectionStep::SelectionStep(SchemeParts parts, NonFinitePolicy policy)
    : parts_(std::move(parts)), policy_(policy) {
  if (!parts_.sparsifier || !parts_.memory) {
    throw InvalidArgument("[sync] SelectionStep needs a sparsifier and a memory");
  }
  if (parts_.traits.every_coordinate) {
    throw InvalidArgument(fmt::format(
        "[sync] {} selects every coordinate and compresses in its exchange's value codec ({}); "
        "a selection without the exchange would send the full gradient: use it through the DDP "
        "hook or `sparsecomm train`, or choose a sparsifier",
        parts_.sparsifier->name(), value_encoding_name(parts_.exchange_options.values)));
  }
  if (parts_.memory->finishes_average()) {
    throw InvalidArgument(fmt::format(
        "[sync] memory={} applies a running estimate that only the exchange can finish; a "
        "selection without the exchange cannot use it (use memory=ef, or a Synchronizer)",
        parts_.memory->name()));
  }
}

const SparseSelection& SelectionStep::select(std::span<const float> gradient,
                                             const StepContext& ctx, Communicator& comm) {
  skipped_ = !agree_all_finite(gradient, ctx, comm, policy_, finite_flags_);
  if (skipped_) {
    selection_.clear();
    counts_.assign(static_cast<std::size_t>(comm.size()), 0);
    return selection_;
  }
  parts_.memory->accumulate(gradient);
  const std::span<float> accumulated = parts_.memory->accumulated();
  parts_.sparsifier->select(accumulated, ctx, comm, selection_);
  const SparseSelection* sent = &selection_;
  if (!selection_.known.empty()) {
    try {
      selection_.expand_known(accumulated, merged_);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("[sync] {}: {}", parts_.sparsifier->name(), e.what()));
    }
    sent = &merged_;
  }
  parts_.memory->take_sent(*sent);

  // The counts exclude the known ranges, as the exchanges' counts do.
  const std::size_t mine = selection_.size();
  counts_.resize(static_cast<std::size_t>(comm.size()));  // no allocation after the first step
  comm.allgather(std::as_bytes(std::span<const std::size_t>(&mine, 1)),
                 std::as_writable_bytes(std::span<std::size_t>(counts_)));
  std::size_t union_size = 0;
  for (const std::size_t count : counts_) union_size += count;
  const ExchangeOutcome outcome{counts_, union_size,
                                parts_.sparsifier->target(gradient.size(), ctx)};
  parts_.sparsifier->observe(outcome, ctx);
  return *sent;
}

void SelectionStep::save(StateWriter& writer) const { save_scheme_state(parts_, writer); }

void SelectionStep::load(StateReader& reader) { load_scheme_state(parts_, reader); }

}  // namespace sparsecomm
