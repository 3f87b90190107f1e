#include "sparsecomm/sync/sparsify_exchange_step.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sync/load_balance.h"

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
  const Stopwatch agreement;
  const bool finite = agree_all_finite(gradient, ctx, comm, policy, finite_flags);
  metrics.agreement_s = agreement.seconds();
  if (!finite) {
    std::fill(gradient.begin(), gradient.end(), 0.0f);
    metrics.skipped_nonfinite = true;
    metrics.exchange_s = metrics.agreement_s;
  }
  return finite;
}

SparsifyExchangeStep::SparsifyExchangeStep(SchemeParts parts, NonFinitePolicy policy)
    : parts_(std::move(parts)),
      policy_(policy),
      exchanger_(make_sparse_exchange(parts_.exchange, parts_.exchange_options)) {
  if (!parts_.sparsifier || !parts_.memory) {
    throw InvalidArgument(
        fmt::format("[sync] SparsifyExchangeStep needs a sparsifier and a memory (got {}{})",
                    parts_.sparsifier ? "a sparsifier" : "no sparsifier",
                    parts_.memory ? " and a memory" : " and no memory"));
  }
}

StepMetrics SparsifyExchangeStep::synchronize(std::span<float> gradient, const StepContext& ctx,
                                              Communicator& comm) {
  StepMetrics metrics;
  metrics.step = ctx.step;
  metrics.numel = gradient.size();
  metrics.target = parts_.sparsifier->target(gradient.size(), ctx);

  // Agreeing is communication: its time joins the exchange's.
  Stopwatch agreement;
  const bool finite = agree_all_finite(gradient, ctx, comm, policy_, finite_flags_);
  const double agreement_s = agreement.seconds();
  if (!finite) {
    std::fill(gradient.begin(), gradient.end(), 0.0f);
    metrics.skipped_nonfinite = true;
    metrics.residual_norm = parts_.memory->residual_norm();
    return metrics;
  }

  metrics.gradient_norm = std::sqrt(sum_of_squares(gradient));
  const std::int64_t clipped_before = parts_.memory->clipped_steps();
  Stopwatch watch;
  parts_.memory->accumulate(gradient);
  metrics.gradient_clipped = parts_.memory->clipped_steps() != clipped_before;
  const std::span<float> accumulated = parts_.memory->accumulated();
  metrics.accumulate_s = watch.seconds();

  watch.restart();
  parts_.sparsifier->select(accumulated, ctx, comm, selection_);
  metrics.selection_s = watch.seconds();

  // The gradient is in the memory now: the average goes straight into it.
  watch.restart();
  exchanger_->exchange(comm, selection_, accumulated, gradient, result_);
  metrics.agreement_s = agreement_s;
  metrics.exchange_s = watch.seconds() + agreement_s;
  // The sparsifier's own small collectives (histogram rounds) are
  // communication: counted with the exchange.
  const SelectionStats& own = parts_.sparsifier->last_stats();
  metrics.selection_collective_s = own.collective_s;
  metrics.selection_collectives = own.collective_rounds;
  metrics.candidate_passes = own.candidate_passes;
  metrics.selection_s = std::max(0.0, metrics.selection_s - own.collective_s);
  metrics.exchange_s += own.collective_s;

  // What was sent can be non-finite although every gradient was finite:
  // g + e (or DGC's momentum and velocity) can overflow. A NaN or inf that
  // one rank sent reaches every rank's average, so all ranks see it without
  // a message. The memory has already sent and subtracted the values, so no
  // policy can undo the step: it always ends the run.
  if (!all_finite(gradient)) {
    throw NonFiniteGradient(fmt::format(
        "[sync] rank {}: step {}: the synchronized gradient holds NaN or inf although every "
        "rank's gradient was finite: the {} memory overflowed (its residual norm is {:.3g}); "
        "lower the learning rate",
        comm.rank(), ctx.step, parts_.memory->name(), parts_.memory->residual_norm()));
  }

  parts_.memory->after_exchange(result_.transmitted);
  if (parts_.memory->finishes_average()) parts_.memory->finish(gradient);
  const ExchangeOutcome outcome{result_.counts, result_.union_size, metrics.target};
  parts_.sparsifier->observe(outcome, ctx);

  metrics.selected = selection_.size();
  metrics.union_size = result_.union_size;
  metrics.density_ratio = metrics.target == 0 ? 0.0
                                              : static_cast<double>(result_.union_size) /
                                                    static_cast<double>(metrics.target);
  metrics.imbalance = imbalance_of(result_.counts);
  metrics.residual_norm = parts_.memory->residual_norm();
  metrics.bytes_sent = result_.bytes_sent;
  metrics.bytes_received = result_.bytes_received;
  metrics.index_bytes_raw = result_.index_bytes_raw;
  metrics.index_bytes_encoded = result_.index_bytes_encoded;
  metrics.value_bits = wire_bits_per_value(parts_.exchange_options.values);
  return metrics;
}

// Layout: tag ("sparse_sync", the name checkpoints have always used),
// scheme name, memory, sparsifier.
void save_scheme_state(const SchemeParts& parts, StateWriter& writer) {
  writer.tag("sparse_sync");
  writer.string(parts.sparsifier->name());
  parts.memory->save(writer);
  parts.sparsifier->save(writer);
}

void load_scheme_state(SchemeParts& parts, StateReader& reader) {
  reader.expect_tag("sparse_sync");
  const std::string scheme = reader.string();
  if (scheme != parts.sparsifier->name()) {
    throw Error(fmt::format("[sync] the saved state is of scheme '{}', this run uses '{}'", scheme,
                            parts.sparsifier->name()));
  }
  parts.memory->load(reader);
  parts.sparsifier->load(reader);
}

void SparsifyExchangeStep::save(StateWriter& writer) const { save_scheme_state(parts_, writer); }

void SparsifyExchangeStep::load(StateReader& reader) { load_scheme_state(parts_, reader); }

}  // namespace sparsecomm
