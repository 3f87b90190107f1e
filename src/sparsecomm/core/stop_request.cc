#include "sparsecomm/core/stop_request.h"

#include <atomic>
#include <csignal>

#include <signal.h>

namespace sparsecomm {
namespace {

// -1: no request; 0: request_stop() without a signal; otherwise the signal.
std::atomic<int> requested{-1};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler stores into it");

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};

extern "C" void on_stop_signal(int signal) {
  int none = -1;
  if (requested.compare_exchange_strong(none, signal)) return;
  // The second signal: the default action (termination) at once.
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
  raise(signal);
}

}  // namespace

void install_stop_signal_handlers() {
  for (const int signal : kStopSignals) {
    struct sigaction previous {};
    sigaction(signal, nullptr, &previous);
    if (previous.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // interrupted reads and writes carry on
    sigaction(signal, &action, nullptr);
  }
}

void request_stop(int signal) noexcept {
  int none = -1;
  requested.compare_exchange_strong(none, signal);
}

bool stop_requested() noexcept { return requested.load() >= 0; }

std::string stop_reason() {
  switch (const int signal = requested.load()) {
    case -1:
      return "";
    case 0:
      return "a request";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "signal " + std::to_string(signal);
  }
}

void clear_stop_request() noexcept { requested.store(-1); }

}  // namespace sparsecomm
