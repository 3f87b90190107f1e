// Sums a vector over 3 ranks (threads) with sparsecomm's ring all-reduce and
// checks the result: the smallest complete use of the installed library.
#include <cstdio>
#include <vector>

#include <sparsecomm/collectives/allreduce.h>
#include <sparsecomm/comm/thread/thread_world.h>

int main() {
  bool ok = true;
  sparsecomm::run_thread_world(3, [&](sparsecomm::Communicator& comm) {
    std::vector<float> values(1000, static_cast<float>(comm.rank() + 1));
    sparsecomm::allreduce(comm, values);
    for (float v : values) ok = ok && v == 6.0f;
  });
  std::printf("%s\n", ok ? "consumer: ring all-reduce over 3 ranks is correct" : "consumer: WRONG");
  return ok ? 0 : 1;
}
