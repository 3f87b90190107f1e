#include "sparsecomm/collectives/skip_reduce.h"

#include <string>

#include <fmt/format.h>

#include "sparsecomm/collectives/ring.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/core/timer.h"

namespace sparsecomm {
namespace {

// Mixed into the seed so the rotation stream differs from other users of the
// same seed ("skip-red" in ASCII).
constexpr std::uint64_t kRotationSalt = 0x736b69702d726564ull;

void validate(int world, int skip, const std::string& where) {
  if (world < 1) {
    throw InvalidArgument(where + fmt::format("world size must be >= 1, got {}", world));
  }
  if (skip < 0 || skip > world - 1) {
    throw InvalidArgument(where + fmt::format("skip {} is outside [0, {}] for a world of {} ranks",
                                              skip, world - 1, world));
  }
}

// The parts of the schedule the ring needs (no allocation).
struct Plan {
  int skip = 0;
  int rotation = 0;
  bool protected_buffer = false;
};

Plan plan(int world, std::size_t numel, const SkipReduceOptions& options) {
  Plan p;
  p.rotation = static_cast<int>(Philox(options.seed ^ kRotationSalt)
                                    .below(static_cast<std::uint64_t>(world),
                                           static_cast<std::uint64_t>(options.step),
                                           static_cast<std::uint64_t>(options.bucket)));
  p.protected_buffer = options.protect || numel < options.min_elements;
  p.skip = p.protected_buffer ? 0 : options.skip;
  return p;
}

// Fills `s` in place (reusing its chunk vector's capacity).
void fill_schedule(int world, std::size_t numel, const Plan& p, SkipSchedule& s) {
  s.world = world;
  s.skip = p.skip;
  s.rotation = p.rotation;
  s.protected_buffer = p.protected_buffer;
  s.chunks.resize(static_cast<std::size_t>(world));
  for (int c = 0; c < world; ++c) {
    // In the ring (ring.h) chunk c is received and added at reduce-scatter
    // step j by rank c+j+1+q, from rank c+j+q. The first step is s, so its
    // journey starts at rank c+q+s with that rank's own values, and its last
    // receiver (step n-2) is rank c+q-1, the owner: n-s contributors.
    SkipChunk& chunk = s.chunks[static_cast<std::size_t>(c)];
    chunk.begin = chunk_begin(numel, world, c);
    chunk.end = chunk_begin(numel, world, c + 1);
    chunk.first_contributor = detail::ring_mod(c + p.rotation + p.skip, world);
    chunk.contributors = world - p.skip;
    chunk.owner = detail::chunk_owner(c, p.rotation, world);
  }
}

}  // namespace

bool SkipChunk::dropped(int rank, int world) const {
  return detail::ring_mod(rank - first_contributor, world) >= contributors;
}

SkipSchedule skip_reduce_schedule(int world, std::size_t numel, const SkipReduceOptions& options) {
  validate(world, options.skip, "[skip-reduce] ");
  SkipSchedule schedule;
  fill_schedule(world, numel, plan(world, numel, options), schedule);
  return schedule;
}

void skip_reduce(Communicator& comm, std::span<float> data, const SkipReduceOptions& options,
                 SkipReduceReport* report) {
  const std::string where = fmt::format("[skip-reduce] rank {}: ", comm.rank());
  const int n = comm.size();
  validate(n, options.skip, where);
  if (options.segment_bytes == 0) throw InvalidArgument(where + "segment_bytes must be > 0");

  Stopwatch total;
  const Plan p = plan(n, data.size(), options);
  AllreduceReport phases;
  if (n > 1) {
    detail::RingOptions ring;
    ring.first_step = p.skip;
    ring.rotation = p.rotation;
    ring.segment_bytes = options.segment_bytes;
    ring.component = "skip-reduce";
    if (options.rescale && p.skip > 0) {
      ring.owner_scale = static_cast<float>(n) / static_cast<float>(n - p.skip);
    }
    detail::ring_allreduce(comm, data, ring, phases);
  }
  phases.total_s = total.seconds();

  if (report != nullptr) {
    const bool skipped = p.skip > 0;
    fill_schedule(n, data.size(), p, report->schedule);
    report->phases = phases;
    report->elements_subject_to_skipping = skipped ? data.size() : 0;
    report->effective_density =
        skipped ? static_cast<double>(n - p.skip) / static_cast<double>(n) : 1.0;
  }
}

}  // namespace sparsecomm
