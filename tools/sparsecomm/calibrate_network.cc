#include "calibrate_network.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/timer.h"

namespace sparsecomm::cli {
namespace {

// One round of the model: every rank sends `out` to rank r+1 while
// receiving `in` from r-1 (full duplex, every link busy).
void ring_round(Communicator& comm, std::span<const std::byte> out, std::span<std::byte> in) {
  constexpr int kTag = 7001;
  const int n = comm.size(), r = comm.rank();
  Request recv = comm.irecv(in, (r + n - 1) % n, kTag);
  Request send = comm.isend(out, (r + 1) % n, kTag);
  recv.wait();
  send.wait();
}

// What this host's NICs have sent, and which host this is. Hosts are told
// apart by their interfaces' names and hardware addresses, not by hostname:
// the emulated cluster's namespaces share one.
struct NicReading {
  std::uint64_t host = 0;
  double tx_bytes = 0.0;
  bool readable = false;
};

NicReading read_nic() {
  namespace fs = std::filesystem;
  NicReading reading;
  std::string identity;
  std::error_code error;
  for (const fs::directory_entry& device : fs::directory_iterator("/sys/class/net", error)) {
    const std::string name = device.path().filename().string();
    if (name == "lo") continue;
    std::ifstream tx(device.path() / "statistics" / "tx_bytes");
    std::ifstream address(device.path() / "address");
    double bytes = 0.0;
    std::string mac;
    if (!(tx >> bytes) || !(address >> mac)) continue;
    reading.tx_bytes += bytes;
    reading.readable = true;
    identity += name + "=" + mac + ";";
  }
  reading.host = std::hash<std::string>{}(identity);
  return reading;
}

// The wire bytes per rank while `body` runs on every rank: what all hosts'
// NICs sent, over the ranks (ranks sharing a host share its counter).
// nullopt when a rank cannot read its NIC counters.
std::optional<double> wire_bytes_per_rank(Communicator& comm, const std::function<void()>& body) {
  comm.barrier();
  const NicReading before = read_nic();
  body();
  comm.barrier();
  const NicReading after = read_nic();
  const std::vector<NicReading> all =
      allgather_value(comm, NicReading{.host = after.host,
                                       .tx_bytes = after.tx_bytes - before.tx_bytes,
                                       .readable = before.readable && after.readable});
  std::map<std::uint64_t, double> by_host;
  for (const NicReading& rank : all) {
    if (!rank.readable) return std::nullopt;
    by_host[rank.host] = rank.tx_bytes;
  }
  double total = 0.0;
  for (const auto& [host, bytes] : by_host) total += bytes;
  return total / comm.size();
}

}  // namespace

double ring_round_seconds(Communicator& comm, std::size_t bytes, int rounds, int iters) {
  std::vector<std::byte> out(bytes, std::byte{1}), in(bytes);
  std::vector<double> mine;
  for (int it = 0; it <= iters; ++it) {  // iteration 0 warms up
    comm.barrier();
    Stopwatch clock;
    for (int round = 0; round < rounds; ++round) ring_round(comm, out, in);
    if (it > 0) mine.push_back(clock.seconds() / rounds);
  }
  return median_of_rank_max(comm, mine);
}

std::optional<WireFraming> measure_wire_framing(Communicator& comm, std::size_t bulk_bytes) {
  constexpr int kRounds = 250;
  const int n = comm.size();
  std::array<std::byte, 8> out{}, in{};
  auto rounds = [&](int count) {
    return [&, count] {
      for (int round = 0; round < count; ++round) ring_round(comm, out, in);
    };
  };
  const std::optional<double> few = wire_bytes_per_rank(comm, rounds(kRounds / 5));
  const std::optional<double> many = wire_bytes_per_rank(comm, rounds(kRounds));
  if (!few || !many) return std::nullopt;
  WireFraming framing;
  framing.per_message =
      std::max(0.0, (*many - *few) / (kRounds - kRounds / 5) - static_cast<double>(out.size()));
  // The bulk overhead is mostly headers and acknowledgements, and how many
  // acknowledgements TCP sends depends on timing (delayed or immediate):
  // one all-reduce on a busy host can count 8% where the next counts 5%.
  // The median of three all-reduces keeps one such outlier out.
  constexpr int kBulkRepeats = 3;
  std::vector<float> data(bulk_bytes / sizeof(float), 1.0f);
  const AllreduceOptions ring;
  const double payload = 2.0 * (n - 1) * static_cast<double>(bulk_bytes) / n;
  std::vector<double> per_byte;
  for (int repeat = 0; repeat < kBulkRepeats; ++repeat) {
    const std::optional<double> bulk =
        wire_bytes_per_rank(comm, [&] { allreduce(comm, std::span<float>(data), ring); });
    if (!bulk) return std::nullopt;
    per_byte.push_back(std::max(0.0, (*bulk - payload) / payload));
  }
  std::ranges::nth_element(per_byte, per_byte.begin() + kBulkRepeats / 2);
  framing.per_byte = per_byte[kBulkRepeats / 2];
  return framing;
}

double ring_allreduce_seconds(Communicator& comm, std::size_t bytes, int iters) {
  std::vector<float> data(bytes / sizeof(float), 1.0f);
  std::vector<double> mine;
  for (int it = 0; it <= iters; ++it) {
    comm.barrier();
    Stopwatch clock;
    allreduce(comm, std::span<float>(data), AllreduceOptions{});
    if (it > 0) mine.push_back(clock.seconds());
  }
  return median_of_rank_max(comm, mine);
}

}  // namespace sparsecomm::cli
