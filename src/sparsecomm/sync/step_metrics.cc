#include "sparsecomm/sync/step_metrics.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iterator>

#include <fmt/format.h>

namespace sparsecomm {
namespace {

// JSON has no inf/NaN: those become null.
std::string number(double value) {
  return std::isfinite(value) ? fmt::format("{}", value) : std::string("null");
}

// total.f += part.f for each field f (of one type).
template <class T>
void add_fields(StepMetrics& total, const StepMetrics& part,
                std::initializer_list<T StepMetrics::*> fields) {
  for (T StepMetrics::*field : fields) total.*field += part.*field;
}

}  // namespace

StepMetrics combined(std::span<const StepMetrics> parts) {
  StepMetrics total;
  if (parts.empty()) return total;
  total.step = parts.front().step;
  total.value_bits = parts.front().value_bits;
  bool bits_from_method = parts.front().target > 0;
  double residual_squares = 0.0;
  double gradient_squares = 0.0;
  for (const StepMetrics& m : parts) {
    add_fields(total, m,
               {&StepMetrics::numel, &StepMetrics::target, &StepMetrics::selected,
                &StepMetrics::union_size, &StepMetrics::skip_subject, &StepMetrics::dense_numel});
    add_fields(total, m,
               {&StepMetrics::accumulate_s, &StepMetrics::selection_s, &StepMetrics::exchange_s,
                &StepMetrics::agreement_s, &StepMetrics::selection_collective_s,
                &StepMetrics::overlapped_s});
    add_fields(total, m, {&StepMetrics::selection_collectives, &StepMetrics::candidate_passes});
    add_fields(total, m,
               {&StepMetrics::bytes_sent, &StepMetrics::bytes_received,
                &StepMetrics::host_bytes_sent, &StepMetrics::host_bytes_received,
                &StepMetrics::index_bytes_raw, &StepMetrics::index_bytes_encoded});
    total.imbalance = std::max(total.imbalance, m.imbalance);
    residual_squares += m.residual_norm * m.residual_norm;
    gradient_squares += m.gradient_norm * m.gradient_norm;
    if (!bits_from_method && m.target > 0) {
      total.value_bits = m.value_bits;
      bits_from_method = true;
    }
    total.gradient_clipped = total.gradient_clipped || m.gradient_clipped;
    total.skipped_nonfinite = total.skipped_nonfinite || m.skipped_nonfinite;
  }
  total.residual_norm = std::sqrt(residual_squares);
  total.gradient_norm = std::sqrt(gradient_squares);
  total.density_ratio =
      total.target == 0 ? 0.0
                        : static_cast<double>(total.union_size) / static_cast<double>(total.target);
  return total;
}

std::string to_json_line(const StepMetrics& m) {
  std::string out;
  out.reserve(512);
  fmt::format_to(
      std::back_inserter(out),
      R"({{"step":{},"numel":{},"target":{},"selected":{},"union_size":{},)"
      R"("density_ratio":{},"imbalance":{},"residual_norm":{},"gradient_norm":{},)"
      R"("accumulate_s":{},"selection_s":{},"exchange_s":{},"agreement_s":{},)"
      R"("selection_collective_s":{},"selection_collectives":{},"candidate_passes":{},)"
      R"("bytes_sent":{},"bytes_received":{},"host_bytes_sent":{},"host_bytes_received":{},)"
      R"("index_bytes_raw":{},)"
      R"("index_bytes_encoded":{},"value_bits":{},"skip_subject":{},"dense_numel":{},"overlapped_s":{},"gradient_clipped":{},)"
      R"("skipped_nonfinite":{}}})",
      m.step, m.numel, m.target, m.selected, m.union_size, number(m.density_ratio),
      number(m.imbalance), number(m.residual_norm), number(m.gradient_norm), number(m.accumulate_s),
      number(m.selection_s), number(m.exchange_s), number(m.agreement_s),
      number(m.selection_collective_s), m.selection_collectives, m.candidate_passes, m.bytes_sent,
      m.bytes_received, m.host_bytes_sent, m.host_bytes_received, m.index_bytes_raw,
      m.index_bytes_encoded, number(m.value_bits), m.skip_subject, m.dense_numel,
      number(m.overlapped_s), m.gradient_clipped, m.skipped_nonfinite);
  return out;
}

}  // namespace sparsecomm
