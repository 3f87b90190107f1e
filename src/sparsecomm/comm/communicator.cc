#include "sparsecomm/comm/communicator.h"

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/comm/broadcast_rule.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

std::chrono::milliseconds default_timeout() {
  if (const char* env = std::getenv("SPARSECOMM_TIMEOUT_MS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long long ms = std::strtoll(env, &end, 10);
    if (end == env || *end != '\0' || ms <= 0) {
      throw InvalidArgument(
          fmt::format("SPARSECOMM_TIMEOUT_MS='{}' is not a positive number of milliseconds", env));
    }
    return std::chrono::milliseconds(ms);
  }
  return std::chrono::seconds(60);
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    throw InvalidArgument(where() +
                          fmt::format("timeout must be positive, got {} ms", timeout.count()));
  }
  timeout_ = timeout;
}

std::string Communicator::where() const { return fmt::format("[{}] rank {}: ", backend(), rank()); }

void Communicator::check_peer_and_tag(int peer, int tag, std::string_view op) const {
  if (peer < 0 || peer >= size()) {
    throw InvalidArgument(where() + fmt::format("{}: peer rank {} is outside the world of {} ranks",
                                                op, peer, size()));
  }
  if (tag < 0 || tag > kMaxTag) {
    throw InvalidArgument(where() + fmt::format("{}: tag {} is outside [0, {}]", op, tag, kMaxTag));
  }
}

// Dissemination barrier: ceil(log2 n) rounds of one-byte messages.
void Communicator::barrier() {
  const int n = size();
  const int r = rank();
  std::byte out{1};
  std::byte in{0};
  for (int distance = 1; distance < n; distance *= 2) {
    Request sent = isend({&out, 1}, (r + distance) % n, tags::kBarrier);
    recv({&in, 1}, (r - distance + n) % n, tags::kBarrier);
    sent.wait();
  }
}

void Communicator::broadcast(std::span<std::byte> data, int root) {
  check_peer_and_tag(root, tags::kBroadcast, "broadcast");
  if (broadcast_scatters(size(), data.size())) {
    scatter_allgather_broadcast(data, root);
  } else {
    binomial_broadcast(data, root);
  }
}

// Binomial tree rooted at `root`, in ranks relative to the root.
void Communicator::binomial_broadcast(std::span<std::byte> data, int root) {
  const int n = size();
  const int relative = (rank() - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if ((relative & mask) != 0) {
      recv(data, (relative - mask + root) % n, tags::kBroadcast);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (relative + mask < n) send(data, (relative + mask + root) % n, tags::kBroadcast);
  }
}

// The root sends rank q its block q (chunk_begin's split),
// then the ranks ring-allgather the blocks in place.
void Communicator::scatter_allgather_broadcast(std::span<std::byte> data, int root) {
  const int n = size();
  const int r = rank();
  std::vector<std::size_t> offsets(static_cast<std::size_t>(n) + 1);
  for (int q = 0; q <= n; ++q) {
    offsets[static_cast<std::size_t>(q)] = chunk_begin(data.size(), n, q);
  }
  const auto block = [&](int q) {
    const auto i = static_cast<std::size_t>(q);
    return data.subspan(offsets[i], offsets[i + 1] - offsets[i]);
  };
  if (r == root) {
    std::vector<Request> sent;
    sent.reserve(static_cast<std::size_t>(n) - 1);
    for (int q = 0; q < n; ++q) {
      if (q != root) sent.push_back(isend(block(q), q, tags::kBroadcast));
    }
    for (Request& request : sent) request.wait();
  } else {
    recv(block(r), root, tags::kBroadcast);
  }
  ring_allgather_in_place(data, offsets, tags::kBroadcast);
}

void Communicator::allgather(std::span<const std::byte> mine, std::span<std::byte> all) {
  const std::vector<std::size_t> counts(static_cast<std::size_t>(size()), mine.size());
  allgatherv(mine, all, counts);
}

void Communicator::allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                              std::span<const std::size_t> counts) {
  const int n = size();
  const int r = rank();
  if (counts.size() != static_cast<std::size_t>(n)) {
    throw InvalidArgument(
        where() + fmt::format("allgatherv: {} counts for a world of {} ranks", counts.size(), n));
  }
  std::vector<std::size_t> offsets(static_cast<std::size_t>(n) + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  if (mine.size() != counts[r] || all.size() != offsets.back()) {
    throw InvalidArgument(
        where() +
        fmt::format("allgatherv: got {} bytes to send and {} to receive, counts say {} and {}",
                    mine.size(), all.size(), counts[r], offsets.back()));
  }
  if (!mine.empty()) std::memcpy(all.data() + offsets[r], mine.data(), mine.size());
  ring_allgather_in_place(all, offsets, tags::kAllgather);
}

// Ring: in step j every rank forwards the block it received in step j-1.
void Communicator::ring_allgather_in_place(std::span<std::byte> all,
                                           std::span<const std::size_t> offsets, int tag) {
  const int n = size();
  const int r = rank();
  const auto block = [&](int q) {
    const auto i = static_cast<std::size_t>(q);
    return all.subspan(offsets[i], offsets[i + 1] - offsets[i]);
  };
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  for (int step = 0; step + 1 < n; ++step) {
    Request sent = isend(block((r - step + n) % n), next, tag);
    recv(block((r - step - 1 + n) % n), prev, tag);
    sent.wait();
  }
}

// Pairwise exchange: in round i, send to rank r+i and receive from rank r-i.
void Communicator::alltoallv(std::span<const std::byte> send,
                             std::span<const std::size_t> send_counts, std::span<std::byte> recv,
                             std::span<const std::size_t> recv_counts) {
  const int n = size();
  const int r = rank();
  if (send_counts.size() != static_cast<std::size_t>(n) ||
      recv_counts.size() != static_cast<std::size_t>(n)) {
    throw InvalidArgument(
        where() +
        fmt::format("alltoallv: {} send counts and {} receive counts for a world of {} ranks",
                    send_counts.size(), recv_counts.size(), n));
  }
  std::vector<std::size_t> send_offsets(static_cast<std::size_t>(n) + 1, 0);
  std::vector<std::size_t> recv_offsets(static_cast<std::size_t>(n) + 1, 0);
  std::partial_sum(send_counts.begin(), send_counts.end(), send_offsets.begin() + 1);
  std::partial_sum(recv_counts.begin(), recv_counts.end(), recv_offsets.begin() + 1);
  if (send.size() != send_offsets.back() || recv.size() != recv_offsets.back()) {
    throw InvalidArgument(
        where() + fmt::format("alltoallv: buffers of {} and {} bytes, counts add up to {} and {}",
                              send.size(), recv.size(), send_offsets.back(), recv_offsets.back()));
  }
  if (send_counts[r] != recv_counts[r]) {
    throw InvalidArgument(where() +
                          fmt::format("alltoallv: sends {} bytes to itself but expects {}",
                                      send_counts[r], recv_counts[r]));
  }
  if (send_counts[r] > 0) {
    std::memcpy(recv.data() + recv_offsets[r], send.data() + send_offsets[r], send_counts[r]);
  }
  for (int round = 1; round < n; ++round) {
    const int dst = (r + round) % n;
    const int src = (r - round + n) % n;
    Request incoming =
        irecv(recv.subspan(recv_offsets[src], recv_counts[src]), src, tags::kAlltoall);
    Request sent = isend(send.subspan(send_offsets[dst], send_counts[dst]), dst, tags::kAlltoall);
    incoming.wait();
    sent.wait();
  }
}

void Communicator::native_allreduce(std::span<float>) {
  throw NotSupported(where() + "this backend has no native all-reduce (use --backend mpi)");
}
void Communicator::native_allreduce(std::span<std::int64_t>) {
  throw NotSupported(where() + "this backend has no native all-reduce (use --backend mpi)");
}
void Communicator::native_allgatherv(std::span<const std::byte>, std::span<std::byte>,
                                     std::span<const std::size_t>) {
  throw NotSupported(where() + "this backend has no native allgatherv (use --backend mpi)");
}

void Communicator::native_broadcast(std::span<std::byte>, int) {
  throw NotSupported(where() + "this backend has no native broadcast (use --backend mpi)");
}

}  // namespace sparsecomm
