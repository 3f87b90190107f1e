#pragma once
// DelayedCommunicator: every message leaves `delay` after it is posted.
// The latency that the emulated links lack (their tc shapes bandwidth but
// this kernel has no netem), for checking the latency terms of the
// performance model (docs/algorithms.md, "Performance model").
//
// isend() blocks its caller for `delay`, then posts the message on the
// wrapped communicator: each message pays the delay in series, as the
// model's rounds do. The collectives are Communicator's defaults on this
// point-to-point (never the wrapped backend's own), so every message of
// every collective is delayed; there is no native all-reduce.
//
// run_world() wraps every rank's communicator in one when
// WorldOptions::message_delay is set (SPARSECOMM_MESSAGE_DELAY_US).

#include <chrono>
#include <cstdint>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm {

class DelayedCommunicator final : public Communicator {
 public:
  // `inner` must outlive this; its timeout is taken over.
  DelayedCommunicator(Communicator& inner, std::chrono::microseconds delay);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string_view backend() const override { return inner_.backend(); }
  Request isend(std::span<const std::byte> data, int dst, int tag) override;
  Request irecv(std::span<std::byte> data, int src, int tag) override;

  std::chrono::microseconds delay() const { return delay_; }
  // Messages this rank has sent through it (each one delayed).
  std::uint64_t messages_sent() const { return messages_sent_; }

 private:
  Communicator& inner_;
  std::chrono::microseconds delay_;
  std::uint64_t messages_sent_ = 0;
};

// The delay of SPARSECOMM_MESSAGE_DELAY_US (0 when unset); InvalidArgument
// when it is not a number of microseconds >= 0.
std::chrono::microseconds default_message_delay();

}  // namespace sparsecomm
