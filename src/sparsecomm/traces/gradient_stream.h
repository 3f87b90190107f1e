#pragma once
// Gradient streams: per-(rank, step) gradient vectors for tests and
// benchmarks, so schemes can be compared without training. Two sources:
// a synthetic generator (deterministic, skewed, drifting) and recorded
// traces in the format of docs/algorithms.md "Gradient traces (file format)".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

class GradientStream {
 public:
  virtual ~GradientStream() = default;
  virtual std::size_t numel() const = 0;
  // Steps available (synthetic streams: unbounded, returns INT64_MAX).
  virtual std::int64_t steps() const = 0;
  // Ranks the stream has gradients for (synthetic: any).
  virtual int world() const = 0;
  virtual std::span<const LayerSpan> layers() const = 0;
  // Writes rank `rank`'s raw local gradient at `step` into out (numel()
  // elements). Deterministic: the same (rank, step) always gives the same
  // values. Thread-safe for distinct `out` buffers.
  virtual void fill(int rank, std::int64_t step, std::span<float> out) const = 0;
  virtual std::string describe() const = 0;
};

struct SyntheticStreamOptions {
  std::size_t numel = 1000000;
  int layers = 12;                   // pseudo-layers with geometric sizes
  double layer_scale_range = 100.0;  // largest / smallest layer scale
  // Heavy tails: each element is normal * exp(tail * normal2), so |g| is
  // log-normal-ish mixed; 0 gives plain normals.
  double tail = 1.0;
  // Regional skew: a smooth bump in magnitude over the flat index space, so
  // equal contiguous partitions carry unequal numbers of large elements.
  // 0 disables; 1 means the hottest region is ~e times the coldest.
  double skew = 1.5;
  // Over `drift_steps` steps the overall scale falls by `drift_factor`
  // (geometrically), like a learning-rate decay; 1 disables.
  double drift_factor = 10.0;
  std::int64_t drift_steps = 1000;
  // Fraction of each rank's gradient that is shared by all ranks (the
  // "signal"); the rest is per-rank noise.
  double shared_fraction = 0.5;
  std::uint64_t seed = 1;
};

// The synthetic generator. Construction draws a fixed per-element profile
// and a pool of 2^22 normals (Philox); fill() is then a contiguous
// multiply-add per element (well under 1 ns), so streams of 10^6-10^7
// elements over thousands of steps stay cheap.
std::unique_ptr<GradientStream> make_synthetic_stream(const SyntheticStreamOptions& options);

// A trace's description, meta.json: {"numel", "world", "steps", "source",
// "layers": [{"name", "offset", "size"}, ...]}.
struct TraceMeta {
  std::size_t numel = 0;
  int world = 0;
  std::int64_t steps = 0;
  std::string source;
  std::vector<LayerSpan> layers;  // contiguous from 0, covering numel
};

// Parses and validates meta.json's text; `name` names it in messages.
// Throws InvalidArgument for malformed JSON, missing or mistyped fields,
// world < 1, steps < 1, numel >= 2^32, steps * numel * 4 bytes beyond
// 2^63, or layers that are not contiguous from 0 or do not cover numel (no
// layers: one layer "all").
TraceMeta parse_trace_meta(std::string_view text, std::string_view name);

// Reads a recorded trace directory (meta.json + rank<r>.f32). Throws
// InvalidArgument with the path and what is wrong for a missing or
// inconsistent trace (sizes checked against meta.json).
std::unique_ptr<GradientStream> open_trace(const std::string& directory);

// Writes a trace incrementally: create() writes meta.json (with steps as
// given), append() adds one step of one rank's gradient. Each rank appends
// to its own file, so ranks may append concurrently.
class TraceWriter {
 public:
  // create_files: write meta.json and empty rank files (truncating old
  // ones). In a multi-process job exactly one process creates them, and
  // after that (a barrier) the others attach with create_files = false.
  TraceWriter(std::string directory, std::size_t numel, int world, std::int64_t steps,
              std::vector<LayerSpan> layers, std::string source, bool create_files = true);
  // Appends rank `rank`'s next step; throws after `steps` appends per rank.
  void append(int rank, std::span<const float> gradient);
  const std::string& directory() const { return directory_; }

 private:
  std::string directory_;
  std::size_t numel_;
  int world_;
  std::int64_t steps_;
  std::vector<std::int64_t> written_;
};

}  // namespace sparsecomm
