// Sums a vector over 3 ranks (threads) with sparsecomm's ring all-reduce and
// checks the result: the smallest complete use of the installed library.
#include <array>
#include <cstdio>
#include <vector>

#include <sparsecomm/collectives/allreduce.h>
#include <sparsecomm/comm/thread/thread_world.h>

int main() {
  constexpr int kRanks = 3;
  // One verdict per rank: each thread writes only its own slot, and
  // run_thread_world joins the threads before main reads them.
  std::array<bool, kRanks> correct{};
  sparsecomm::run_thread_world(kRanks, [&](sparsecomm::Communicator& comm) {
    std::vector<float> values(1000, static_cast<float>(comm.rank() + 1));
    sparsecomm::allreduce(comm, values);
    bool all_six = true;
    for (float v : values) all_six = all_six && v == 6.0f;
    correct[static_cast<std::size_t>(comm.rank())] = all_six;
  });
  bool ok = true;
  for (bool c : correct) ok = ok && c;
  std::printf("%s\n", ok ? "consumer: ring all-reduce over 3 ranks is correct" : "consumer: WRONG");
  return ok ? 0 : 1;
}
