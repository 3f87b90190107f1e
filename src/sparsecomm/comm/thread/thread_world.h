#pragma once
// The thread backend: a world of N ranks as N threads of one process (the
// embedded default). Messages are matched per (source, tag) in send order;
// small messages are copied eagerly, large ones are copied once, straight
// from the sender's buffer into the receiver's.

#include <chrono>
#include <functional>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm {

// Runs fn(comm) on `ranks` threads, one per rank, and returns when all have
// returned. If a rank throws, the world is aborted: every pending and later
// call on the other ranks throws PeerFailure naming the failed rank and its
// error; after all threads have joined, the first failure is rethrown.
// `timeout` is each communicator's initial timeout.
void run_thread_world(int ranks, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout = default_timeout());

}  // namespace sparsecomm
