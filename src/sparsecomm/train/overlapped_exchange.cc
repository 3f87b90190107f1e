#include "sparsecomm/train/overlapped_exchange.h"

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"

namespace sparsecomm {

OverlappedExchange::OverlappedExchange(DataParallel& ddp) : ddp_(ddp), values_(ddp.numel()) {}

OverlappedExchange::~OverlappedExchange() {
  if (thread_.joinable()) thread_.join();
}

void OverlappedExchange::start(double epoch) {
  if (pending_) {
    throw InvalidArgument("[overlap] start: the previous round's mean has not been taken");
  }
  pending_ = true;
  failure_ = nullptr;
  thread_ = std::thread([this, epoch, rank = ddp_.communicator().rank()] {
    set_thread_log_rank(rank);
    try {
      metrics_ = ddp_.synchronize(std::span<float>(values_), epoch);
    } catch (...) {
      failure_ = std::current_exception();
    }
  });
}

void OverlappedExchange::settle() {
  if (thread_.joinable()) thread_.join();
  if (failure_) {
    const std::exception_ptr failure = failure_;
    failure_ = nullptr;
    pending_ = false;
    std::rethrow_exception(failure);
  }
}

StepMetrics OverlappedExchange::take() {
  settle();
  pending_ = false;
  return metrics_;
}

void OverlappedExchange::save(StateWriter& writer) {
  settle();
  writer.tag("overlapped-exchange");
  writer.value<std::uint8_t>(pending_ ? 1 : 0);
  if (!pending_) return;
  writer.array<float>(values_);
  // What the step that takes the mean reports.
  const StepMetrics& m = metrics_;
  writer.value<std::int64_t>(m.step);
  for (const std::size_t count : {m.numel, m.target, m.selected, m.union_size, m.dense_numel}) {
    writer.value<std::uint64_t>(count);
  }
  for (const double figure : {m.density_ratio, m.imbalance, m.residual_norm, m.gradient_norm,
                              m.accumulate_s, m.selection_s, m.exchange_s, m.agreement_s}) {
    writer.value<double>(figure);
  }
  writer.value<std::uint64_t>(m.bytes_sent);
  writer.value<std::uint64_t>(m.bytes_received);
  writer.value<std::uint8_t>(m.skipped_nonfinite ? 1 : 0);
}

void OverlappedExchange::load(StateReader& reader) {
  settle();
  reader.expect_tag("overlapped-exchange");
  pending_ = reader.value<std::uint8_t>() != 0;
  if (!pending_) return;
  reader.array_into<float>(std::span<float>(values_));
  StepMetrics m;
  m.step = reader.value<std::int64_t>();
  for (std::size_t* count : {&m.numel, &m.target, &m.selected, &m.union_size, &m.dense_numel}) {
    *count = static_cast<std::size_t>(reader.value<std::uint64_t>());
  }
  for (double* figure : {&m.density_ratio, &m.imbalance, &m.residual_norm, &m.gradient_norm,
                         &m.accumulate_s, &m.selection_s, &m.exchange_s, &m.agreement_s}) {
    *figure = reader.value<double>();
  }
  m.bytes_sent = reader.value<std::uint64_t>();
  m.bytes_received = reader.value<std::uint64_t>();
  m.skipped_nonfinite = reader.value<std::uint8_t>() != 0;
  metrics_ = m;
}

}  // namespace sparsecomm
