#include "sparsecomm/sync/sparsify_exchange_step.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timeline.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sync/load_balance.h"

namespace sparsecomm {

SparsifyExchangeStep::SparsifyExchangeStep(SchemeParts parts, NonFinitePolicy policy)
    : sequence_(std::move(parts), "[sync] SparsifyExchangeStep"),
      policy_(policy),
      exchanger_(
          make_sparse_exchange(sequence_.parts().exchange, sequence_.parts().exchange_options)) {}

StepMetrics SparsifyExchangeStep::synchronize(std::span<float> gradient, const StepContext& ctx,
                                              Communicator& comm) {
  StepMetrics metrics;
  metrics.step = ctx.step;
  metrics.numel = gradient.size();
  metrics.target = sequence_.target(gradient.size(), ctx);

  // Agreeing is communication: its time joins the exchange's.
  TimedSpan agreement("agree finite", "exchange");
  const bool finite = agree_all_finite(gradient, ctx, comm, policy_, finite_flags_);
  const double agreement_s = agreement.stop();
  if (!finite) {
    std::fill(gradient.begin(), gradient.end(), 0.0f);
    metrics.skipped_nonfinite = true;
    metrics.residual_norm = sequence_.memory().residual_norm();
    return metrics;
  }

  metrics.gradient_norm = std::sqrt(sum_of_squares(gradient));
  SparsifySequence::SelectTimes times;
  const SparseSelection& selection = sequence_.select(gradient, ctx, comm, &times);
  metrics.gradient_clipped = times.clipped;
  metrics.accumulate_s = times.accumulate_s;

  // The gradient is in the memory now: the average goes straight into it.
  TimedSpan exchange("exchange", "exchange");
  exchanger_->exchange(comm, selection, sequence_.accumulated(), gradient, result_);
  metrics.agreement_s = agreement_s;
  metrics.exchange_s = exchange.stop() + agreement_s;
  // The sparsifier's own small collectives (histogram rounds) are
  // communication: counted with the exchange.
  metrics.selection_collective_s = times.own.collective_s;
  metrics.selection_collectives = times.own.collective_rounds;
  metrics.candidate_passes = times.own.candidate_passes;
  metrics.selection_s = std::max(0.0, times.selection_s - times.own.collective_s);
  metrics.exchange_s += times.own.collective_s;

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
        comm.rank(), ctx.step, sequence_.memory().name(), sequence_.memory().residual_norm()));
  }

  sequence_.exchanged(result_.transmitted, gradient);
  sequence_.observe(result_.counts, result_.union_size, metrics.target, ctx);

  metrics.selected = selection.size();
  metrics.union_size = result_.union_size;
  metrics.density_ratio = metrics.target == 0 ? 0.0
                                              : static_cast<double>(result_.union_size) /
                                                    static_cast<double>(metrics.target);
  metrics.imbalance = imbalance_of(result_.counts);
  metrics.residual_norm = sequence_.memory().residual_norm();
  metrics.bytes_sent = result_.bytes_sent;
  metrics.bytes_received = result_.bytes_received;
  metrics.index_bytes_raw = result_.index_bytes_raw;
  metrics.index_bytes_encoded = result_.index_bytes_encoded;
  metrics.value_bits = wire_bits_per_value(sequence_.parts().exchange_options.values);
  return metrics;
}

void SparsifyExchangeStep::save(StateWriter& writer) const { sequence_.save(writer); }

void SparsifyExchangeStep::load(StateReader& reader) { sequence_.load(reader); }

}  // namespace sparsecomm
