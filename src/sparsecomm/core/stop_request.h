#pragma once
// A request to stop training at the next step boundary, process-wide.
//
// `sparsecomm train` installs handlers for SIGTERM, SIGINT and SIGUSR1 (what
// schedulers send before they end a job: SLURM, Kubernetes, `--signal=USR1@T`):
// the first such signal only records the request; the trainers agree on it
// among the ranks at a step boundary, checkpoint there, write summary.json
// marked as stopped, and return (docs/architecture.md, "Stopping on a
// signal"). A second signal ends the process at once, with the signal's
// default action. Library users and tests call request_stop() instead.
//
// Everything here is async-signal-safe where a handler calls it and
// thread-safe everywhere.

#include <string>

namespace sparsecomm {

// The exit status of a run that stopped on request at a step boundary and
// left a checkpoint to resume from (EX_TEMPFAIL of sysexits.h: incomplete,
// try again).
inline constexpr int kStoppedExitStatus = 75;

// Installs the handlers (idempotent). A signal that was ignored when the
// process started (nohup's SIGINT) stays ignored.
void install_stop_signal_handlers();

// Records a request as if `signal` had arrived (0: a request by call).
void request_stop(int signal = 0) noexcept;
// Whether a stop was requested since the process started (or since
// clear_stop_request()).
bool stop_requested() noexcept;
// What asked: "SIGTERM", "SIGINT", "SIGUSR1", or "a request" (request_stop()
// without a signal); empty when nothing did.
std::string stop_reason();
// Forgets the request (tests; a program that trains again after a stop).
void clear_stop_request() noexcept;

}  // namespace sparsecomm
