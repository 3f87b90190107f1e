#include "sparsecomm/comm/delayed.h"

#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

DelayedCommunicator::DelayedCommunicator(Communicator& inner, std::chrono::microseconds delay)
    : inner_(inner), delay_(delay) {
  if (delay.count() < 0) {
    throw InvalidArgument(fmt::format("a message delay must be >= 0 us, got {}", delay.count()));
  }
  set_timeout(inner.timeout());
}

Request DelayedCommunicator::isend(std::span<const std::byte> data, int dst, int tag) {
  std::this_thread::sleep_for(delay_);
  ++messages_sent_;
  return inner_.isend(data, dst, tag);
}

Request DelayedCommunicator::irecv(std::span<std::byte> data, int src, int tag) {
  return inner_.irecv(data, src, tag);
}

std::chrono::microseconds default_message_delay() {
  const char* env = std::getenv("SPARSECOMM_MESSAGE_DELAY_US");
  if (env == nullptr || *env == '\0') return std::chrono::microseconds(0);
  char* end = nullptr;
  const long long us = std::strtoll(env, &end, 10);
  if (end == env || *end != '\0' || us < 0) {
    throw InvalidArgument(
        fmt::format("SPARSECOMM_MESSAGE_DELAY_US='{}' is not a number of microseconds >= 0", env));
  }
  return std::chrono::microseconds(us);
}

}  // namespace sparsecomm
