// sync_fingerprint: one hash per synchronization case, the proof that a
// refactoring changed no behaviour (scripts/bit-identity.sh runs it at two
// revisions and compares the lines).
//
// A case is a method of the registry (dense, skipreduce, every sparsifier)
// with each exchange pattern, memory and value format it offers, on a world
// of n thread ranks (1..8 unless --worlds says otherwise). Each rank runs a
// few steps of the synthetic stream; its hash covers, step by step, the
// synchronized gradient, the residual error feedback kept, the metrics'
// counts and bytes, and at the end the state a checkpoint would save. The
// case's line: the method, its options, n, and the ranks' hashes combined
// in rank order. A combination the method refuses prints "refused" and the
// message, so a change in what is refused shows too.
//
//   sync_fingerprint [--worlds 1,2,...] [--repeat] [--shard I/N]
//
// --repeat runs every case twice and exits 1 if the two hashes differ
// (every method is deterministic on the thread backend: ctest runs this,
// in shards). --shard I/N runs only the cases whose position in the list
// is I modulo N (0 <= I < N), so N processes share the list.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/hash.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/traces/gradient_stream.h"

namespace sparsecomm {
namespace {

constexpr std::size_t kNumel = 20000;
constexpr int kSteps = 6;

struct Case {
  std::string method;
  std::vector<std::string> options;  // key=value
};

bool offers(const SyncMethodInfo& info, const char* option) {
  for (const OptionSpec& spec : info.options) {
    if (spec.name == option) return true;
  }
  return false;
}

// Every method with each pattern, memory and value format it lists (the
// method's own default where it lists none).
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const SyncMethodInfo& info : sync_methods()) {
    const std::vector<std::string> patterns =
        offers(info, "exchange")
            ? std::vector<std::string>{"union", "allgather", "sparse-allreduce", "ok-topk"}
            : std::vector<std::string>{""};
    const std::vector<std::string> memories =
        offers(info, "memory") ? std::vector<std::string>{"ef", "none", "ef21", "momentum"}
                               : std::vector<std::string>{""};
    const std::vector<std::string> values = offers(info, "values")
                                                ? std::vector<std::string>{"fp32", "bf16"}
                                                : std::vector<std::string>{""};
    for (const std::string& pattern : patterns) {
      for (const std::string& memory : memories) {
        for (const std::string& value : values) {
          Case c{info.name, {}};
          if (offers(info, "density")) c.options.push_back("density=0.02");
          if (!pattern.empty()) c.options.push_back("exchange=" + pattern);
          if (!memory.empty()) c.options.push_back("memory=" + memory);
          if (!value.empty()) c.options.push_back("values=" + value);
          cases.push_back(std::move(c));
        }
      }
    }
  }
  return cases;
}

std::uint64_t hash_floats(std::span<const float> values, std::uint64_t seed) {
  return hash_bytes(std::as_bytes(values), seed);
}

// The hash of one case on n ranks, or the refusal's message.
std::string fingerprint(const Case& c, int n, const GradientStream& stream) {
  SchemeOptions options;
  for (const std::string& item : c.options) options.set(item);
  try {
    make_gradient_sync(c.method, options);
  } catch (const InvalidArgument& e) {
    return fmt::format("refused: {}", e.what());
  }
  std::vector<std::uint64_t> hashes(static_cast<std::size_t>(n));
  run_thread_world(n, [&](Communicator& comm) {
    const std::unique_ptr<GradientSync> sync = make_gradient_sync(c.method, options);
    std::vector<float> gradient(kNumel);
    std::uint64_t h = 0;
    for (int step = 0; step < kSteps; ++step) {
      stream.fill(comm.rank(), step, gradient);
      StepContext ctx{step, 0.01 * step, comm.rank(), n, stream.layers()};
      const StepMetrics m = sync->synchronize(gradient, ctx, comm);
      h = hash_floats(gradient, h);
      h = hash_floats(sync->kept(), h);
      for (const std::uint64_t v :
           {std::uint64_t{m.selected}, std::uint64_t{m.union_size}, m.bytes_sent, m.bytes_received,
            m.index_bytes_raw, m.index_bytes_encoded}) {
        h = hash_combine(h, v);
      }
    }
    StateWriter state;
    sync->save(state);
    hashes[static_cast<std::size_t>(comm.rank())] = hash_bytes(state.bytes(), h);
  });
  std::uint64_t all = 0;
  for (const std::uint64_t h : hashes) all = hash_combine(all, h);
  return fmt::format("{:016x}", all);
}

std::vector<int> parse_worlds(const char* text) {
  std::vector<int> worlds;
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n < 1 || n > 64) {
      throw InvalidArgument(fmt::format("--worlds '{}': give world sizes 1..64, e.g. 1,2,4", text));
    }
    worlds.push_back(static_cast<int>(n));
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') {
      throw InvalidArgument(fmt::format("--worlds '{}': give world sizes 1..64, e.g. 1,2,4", text));
    }
  }
  return worlds;
}

struct Shard {
  std::size_t index = 0;
  std::size_t count = 1;
};

Shard parse_shard(const char* text) {
  unsigned index = 0;
  unsigned count = 0;
  char tail = 0;
  if (std::sscanf(text, "%u/%u%c", &index, &count, &tail) != 2 || count == 0 || index >= count) {
    throw InvalidArgument(fmt::format(
        "--shard '{}': give I/N with 0 <= I < N, e.g. 0/4 for the first of four", text));
  }
  return {index, count};
}

int run(int argc, char** argv) {
  std::vector<int> worlds = {1, 2, 3, 4, 5, 6, 7, 8};
  bool repeat = false;
  Shard shard;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeat") == 0) {
      repeat = true;
    } else if (std::strcmp(argv[i], "--worlds") == 0 && i + 1 < argc) {
      worlds = parse_worlds(argv[++i]);
    } else if (std::strcmp(argv[i], "--shard") == 0 && i + 1 < argc) {
      shard = parse_shard(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: sync_fingerprint [--worlds 1,2,...] [--repeat] [--shard I/N]\n");
      return 2;
    }
  }
  SyntheticStreamOptions stream_options;
  stream_options.numel = kNumel;
  stream_options.layers = 6;
  const std::unique_ptr<GradientStream> stream = make_synthetic_stream(stream_options);
  int differing = 0;
  const std::vector<Case> cases = all_cases();
  for (std::size_t index = shard.index; index < cases.size(); index += shard.count) {
    const Case& c = cases[index];
    std::string label = c.method;
    for (const std::string& item : c.options) label += " " + item;
    for (const int n : worlds) {
      const std::string first = fingerprint(c, n, *stream);
      fmt::print("{} n={} {}\n", label, n, first);
      if (repeat && fingerprint(c, n, *stream) != first) {
        fmt::print(stderr, "not deterministic: {} n={}\n", label, n);
        ++differing;
      }
    }
  }
  return differing == 0 ? 0 : 1;
}

}  // namespace
}  // namespace sparsecomm

int main(int argc, char** argv) {
  try {
    return sparsecomm::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sync_fingerprint: %s\n", e.what());
    return 1;
  }
}
