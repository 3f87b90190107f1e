#include "sparsecomm/sync/step_metrics.h"

#include <cmath>
#include <iterator>

#include <fmt/format.h>

namespace sparsecomm {
namespace {

// JSON has no inf/NaN: those become null.
std::string number(double value) {
  return std::isfinite(value) ? fmt::format("{}", value) : std::string("null");
}

}  // namespace

std::string to_json_line(const StepMetrics& m) {
  std::string out;
  out.reserve(512);
  fmt::format_to(
      std::back_inserter(out),
      R"({{"step":{},"numel":{},"target":{},"selected":{},"union_size":{},)"
      R"("density_ratio":{},"imbalance":{},"residual_norm":{},"gradient_norm":{},)"
      R"("accumulate_s":{},"selection_s":{},"exchange_s":{},"agreement_s":{},)"
      R"("selection_collective_s":{},"selection_collectives":{},"candidate_passes":{},)"
      R"("bytes_sent":{},"bytes_received":{},"index_bytes_raw":{},)"
      R"("index_bytes_encoded":{},"value_bits":{},"skip_subject":{},"dense_numel":{},"overlapped_s":{},"gradient_clipped":{},)"
      R"("skipped_nonfinite":{}}})",
      m.step, m.numel, m.target, m.selected, m.union_size, number(m.density_ratio),
      number(m.imbalance), number(m.residual_norm), number(m.gradient_norm), number(m.accumulate_s),
      number(m.selection_s), number(m.exchange_s), number(m.agreement_s),
      number(m.selection_collective_s), m.selection_collectives, m.candidate_passes, m.bytes_sent,
      m.bytes_received, m.index_bytes_raw, m.index_bytes_encoded, number(m.value_bits),
      m.skip_subject, m.dense_numel, number(m.overlapped_s), m.gradient_clipped,
      m.skipped_nonfinite);
  return out;
}

}  // namespace sparsecomm
