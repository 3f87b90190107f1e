// Gradient traces on disk (docs/algorithms.md "Gradient traces"): a directory with
// meta.json and rank<r>.f32 (T * d little-endian float32 per rank).

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sparsecomm/core/atomic_file.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/json_numbers.h"
#include "sparsecomm/traces/gradient_stream.h"

static_assert(std::endian::native == std::endian::little,
              "trace files are little-endian float32; add byte swapping for this platform");

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

std::string rank_file(const std::string& directory, int rank) {
  return (fs::path(directory) / fmt::format("rank{}.f32", rank)).string();
}

}  // namespace

TraceMeta parse_trace_meta(std::string_view text, std::string_view name) {
  TraceMeta meta;
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    // A count that is not a whole number in its type's range.
    const auto count = [&]<typename T>(const nlohmann::json& object, const char* key, T) {
      const auto value = json_integer<T>(object.at(key));
      if (!value) {
        throw InvalidArgument(fmt::format(
            "[trace] {}: \"{}\" is {}; expected a whole number from {} to {}", name, key,
            object.at(key).dump(), std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
      }
      return *value;
    };
    meta.numel = count(json, "numel", std::size_t{});
    meta.world = count(json, "world", int{});
    meta.steps = count(json, "steps", std::int64_t{});
    meta.source = json.value("source", std::string("unknown"));
    for (const auto& layer : json.value("layers", nlohmann::json::array())) {
      meta.layers.push_back({layer.at("name").get<std::string>(),
                             count(layer, "offset", std::size_t{}),
                             count(layer, "size", std::size_t{})});
    }
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(
        fmt::format("[trace] {} is not a valid trace description: {}", name, e.what()));
  }
  if (meta.world < 1 || meta.steps < 1 || meta.numel > std::numeric_limits<Index>::max()) {
    throw InvalidArgument(fmt::format(
        "[trace] {}: needs world >= 1, steps >= 1 and numel < 2^32; got world={}, steps={}, "
        "numel={}",
        name, meta.world, meta.steps, meta.numel));
  }
  // Each rank file holds steps * numel floats; keep that byte count in range.
  const auto max_steps = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) /
                         sizeof(float) / std::max<std::uint64_t>(1, meta.numel);
  if (static_cast<std::uint64_t>(meta.steps) > max_steps) {
    throw InvalidArgument(fmt::format("[trace] {}: {} steps of {} floats do not fit in a file",
                                      name, meta.steps, meta.numel));
  }
  std::size_t covered = 0;
  for (const LayerSpan& layer : meta.layers) {
    if (layer.offset != covered) {
      throw InvalidArgument(
          fmt::format("[trace] {}: layer '{}' starts at {} but the previous layers end at {}", name,
                      layer.name, layer.offset, covered));
    }
    if (layer.size > meta.numel - covered) {
      throw InvalidArgument(
          fmt::format("[trace] {}: layer '{}' ({} elements at {}) runs past numel {}", name,
                      layer.name, layer.size, layer.offset, meta.numel));
    }
    covered += layer.size;
  }
  if (meta.layers.empty()) {
    meta.layers.push_back({"all", 0, meta.numel});
  } else if (covered != meta.numel) {
    throw InvalidArgument(fmt::format("[trace] {}: layers cover {} elements, numel is {}", name,
                                      covered, meta.numel));
  }
  return meta;
}

namespace {

class TraceStream final : public GradientStream {
 public:
  explicit TraceStream(std::string directory) : directory_(std::move(directory)) {
    const fs::path meta_path = fs::path(directory_) / "meta.json";
    std::ifstream meta_file(meta_path);
    if (!meta_file) {
      throw InvalidArgument(fmt::format(
          "[trace] {} not found: a trace directory holds meta.json and rank<r>.f32 (record one "
          "with `sparsecomm train --record-gradients DIR`)",
          meta_path.string()));
    }
    const std::string text{std::istreambuf_iterator<char>(meta_file),
                           std::istreambuf_iterator<char>()};
    TraceMeta meta = parse_trace_meta(text, meta_path.string());
    numel_ = meta.numel;
    world_ = meta.world;
    steps_ = meta.steps;
    source_ = std::move(meta.source);
    layers_ = std::move(meta.layers);
    const std::uintmax_t expected = static_cast<std::uintmax_t>(steps_) * numel_ * sizeof(float);
    for (int rank = 0; rank < world_; ++rank) {
      const std::string path = rank_file(directory_, rank);
      std::error_code error;
      const std::uintmax_t size = fs::file_size(path, error);
      if (error) {
        throw InvalidArgument(fmt::format("[trace] {} is missing ({}): meta.json says {} ranks",
                                          path, error.message(), world_));
      }
      if (size != expected) {
        throw InvalidArgument(fmt::format(
            "[trace] {} has {} bytes, meta.json implies {} ({} steps x {} floats): the trace is "
            "truncated or does not belong to this meta.json",
            path, size, expected, steps_, numel_));
      }
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        throw InvalidArgument(
            fmt::format("[trace] cannot open {}: {}", path, std::strerror(errno)));
      }
      fds_.push_back(fd);
    }
  }
  ~TraceStream() override {
    for (int fd : fds_) ::close(fd);
  }
  TraceStream(const TraceStream&) = delete;
  TraceStream& operator=(const TraceStream&) = delete;

  std::size_t numel() const override { return numel_; }
  std::int64_t steps() const override { return steps_; }
  int world() const override { return world_; }
  std::span<const LayerSpan> layers() const override { return layers_; }

  void fill(int rank, std::int64_t step, std::span<float> out) const override {
    if (rank < 0 || rank >= world_ || step < 0 || step >= steps_) {
      throw InvalidArgument(fmt::format(
          "[trace] {}: asked for rank {} step {}, the trace has ranks 0..{} and steps 0..{}",
          directory_, rank, step, world_ - 1, steps_ - 1));
    }
    if (out.size() != numel_) {
      throw InvalidArgument(
          fmt::format("[trace] fill: buffer of {} elements, trace has {}", out.size(), numel_));
    }
    auto* dst = reinterpret_cast<char*>(out.data());
    std::size_t remaining = numel_ * sizeof(float);
    auto offset = static_cast<off_t>(static_cast<std::uintmax_t>(step) * numel_ * sizeof(float));
    while (remaining > 0) {
      const ssize_t got = ::pread(fds_[static_cast<std::size_t>(rank)], dst, remaining, offset);
      if (got <= 0) {
        throw Error(fmt::format("[trace] reading {} at byte {}: {}", rank_file(directory_, rank),
                                offset,
                                got == 0 ? "unexpected end of file" : std::strerror(errno)));
      }
      dst += got;
      remaining -= static_cast<std::size_t>(got);
      offset += got;
    }
  }

  std::string describe() const override {
    return fmt::format("trace({}, numel={}, world={}, steps={}, source={})", directory_, numel_,
                       world_, steps_, source_);
  }

 private:
  std::string directory_;
  std::size_t numel_ = 0;
  int world_ = 0;
  std::int64_t steps_ = 0;
  std::string source_;
  std::vector<LayerSpan> layers_;
  std::vector<int> fds_;
};

}  // namespace

std::unique_ptr<GradientStream> open_trace(const std::string& directory) {
  return std::make_unique<TraceStream>(directory);
}

TraceWriter::TraceWriter(std::string directory, std::size_t numel, int world, std::int64_t steps,
                         std::vector<LayerSpan> layers, std::string source, bool create_files)
    : directory_(std::move(directory)),
      numel_(numel),
      world_(world),
      steps_(steps),
      written_(static_cast<std::size_t>(std::max(world, 0)), 0) {
  if (world < 1 || steps < 1) {
    throw InvalidArgument(fmt::format(
        "[trace] recording needs world >= 1 and steps >= 1, got {} and {}", world, steps));
  }
  if (!create_files) return;
  std::error_code error;
  fs::create_directories(directory_, error);
  if (error) {
    throw InvalidArgument(fmt::format("[trace] cannot create {}: {}", directory_, error.message()));
  }
  nlohmann::json meta = {{"numel", numel}, {"world", world}, {"steps", steps}, {"source", source}};
  meta["layers"] = nlohmann::json::array();
  for (const LayerSpan& layer : layers) {
    meta["layers"].push_back(
        {{"name", layer.name}, {"offset", layer.offset}, {"size", layer.size}});
  }
  atomic_write(fs::path(directory_) / "meta.json", meta.dump(2) + "\n");
  for (int rank = 0; rank < world; ++rank) {
    std::ofstream truncate(rank_file(directory_, rank), std::ios::binary | std::ios::trunc);
    if (!truncate)
      throw Error(fmt::format("[trace] cannot create {}", rank_file(directory_, rank)));
  }
}

void TraceWriter::append(int rank, std::span<const float> gradient) {
  if (rank < 0 || rank >= world_) {
    throw InvalidArgument(
        fmt::format("[trace] append for rank {} in a trace of {} ranks", rank, world_));
  }
  if (gradient.size() != numel_) {
    throw InvalidArgument(fmt::format("[trace] append of {} elements to a trace of numel {}",
                                      gradient.size(), numel_));
  }
  std::int64_t& written = written_[static_cast<std::size_t>(rank)];
  if (written >= steps_) {
    throw InvalidArgument(
        fmt::format("[trace] rank {} already recorded all {} steps", rank, steps_));
  }
  std::ofstream out(rank_file(directory_, rank), std::ios::binary | std::ios::app);
  out.write(reinterpret_cast<const char*>(gradient.data()),
            static_cast<std::streamsize>(gradient.size() * sizeof(float)));
  if (!out) throw Error(fmt::format("[trace] writing {} failed", rank_file(directory_, rank)));
  ++written;
}

}  // namespace sparsecomm
