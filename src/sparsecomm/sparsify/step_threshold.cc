#include "sparsecomm/sparsify/step_threshold.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/sparsify/kernels/threshold_select.h"

namespace sparsecomm {
namespace {

// A round's histogram: kBins bins of 2^shift consecutive magnitude bit
// patterns from `lo`, then one count of everything at or above their end.
// A float's magnitude bits order like its magnitude, so bins of 2^shift
// patterns are log-spaced: 2^(23 - shift) bins per binade.
constexpr int kBinBits = 9;
constexpr std::size_t kBins = std::size_t{1} << kBinBits;
constexpr std::uint32_t kInfBits = 0x7f800000u;
constexpr float kLowestFloor = std::numeric_limits<float>::min();  // smallest normal float
constexpr float kInf = std::numeric_limits<float>::infinity();
// The rounds carry a few KiB: latency, not bandwidth, is their cost, so
// they take log2(n) exchanges instead of the ring's 2(n - 1) steps.
constexpr AllreduceOptions kSmallAllreduce{.algorithm = AllreduceAlgorithm::kRecursiveDoubling};

// The most elements one rank may count for: cap * k / n, at least 1
// (0: no cap).
std::int64_t rank_cap(double cap, std::size_t k, int world) {
  if (!(cap > 0)) return 0;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(
                                       cap * static_cast<double>(k) / static_cast<double>(world))));
}

// A floor found above the step's crossing after `passes` candidate passes:
// the next is 2 binades lower, then 4 more, then everything nonzero.
float lower_floor(float floor, int passes) {
  const float lower = passes == 1 ? floor / 16.0f : passes == 2 ? floor / 256.0f : kLowestFloor;
  return std::max(lower, kLowestFloor);
}

float from_bits(std::uint64_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(std::min<std::uint64_t>(bits, kInfBits)));
}
// One past the last pattern a round starting at lo with `shift` bins covers.
std::uint64_t round_end(std::uint32_t lo, int shift) {
  return static_cast<std::uint64_t>(lo) + (static_cast<std::uint64_t>(kBins) << shift);
}

}  // namespace

StepThreshold::StepThreshold(const StepThresholdOptions& options) : options_(options) {
  if (options.mantissa_bits < 0 || options.mantissa_bits > 23 || !(options.tolerance >= 0) ||
      options.max_rounds < 1 || !(options.margin >= 1) || !(options.max_margin >= options.margin) ||
      !(options.cap == 0 || options.cap >= 1)) {
    throw InvalidArgument(fmt::format(
        "[density] same-step threshold: need 0 <= mantissa_bits <= 23 (got {}), tolerance >= 0 "
        "(got {}), max_rounds >= 1 (got {}), 1 <= margin <= max_margin (got {}, {}), cap 0 or "
        ">= 1 (got {})",
        options.mantissa_bits, options.tolerance, options.max_rounds, options.margin,
        options.max_margin, options.cap));
  }
  fine_shift_ = 23 - options.mantissa_bits;
  margin_ = options.margin;
}

void StepThreshold::all_reduce(std::span<std::int64_t> payload, Communicator& comm) {
  const Stopwatch watch;
  allreduce(comm, payload, kSmallAllreduce);
  stats_.collective_s += watch.seconds();
  ++stats_.rounds;
}

void StepThreshold::start(std::span<const float> values, std::span<const Range> own, std::size_t k,
                          Communicator& comm) {
  // Two bins per binade over every float: slot = magnitude bits >> 22.
  constexpr int kCoarseShift = 22;
  payload_.assign(kBins, 0);
  for (const Range& range : own) {
    for (std::size_t i = range.begin; i < range.end; ++i) {
      const float v = values[i];
      if (std::isnan(v)) continue;
      ++payload_[magnitude_bits(v) >> kCoarseShift];
    }
  }
  stats_ = {};
  if (!options_.per_rank) all_reduce(payload_, comm);
  // choose() reports this step's collectives, this one included.
  started_stats_ = stats_;
  const auto want = static_cast<std::int64_t>(2 * k);
  std::int64_t above = 0;
  floor_ = kLowestFloor;
  for (std::size_t slot = kBins; slot-- > 1;) {  // slot 0: zeros and subnormals
    above += payload_[slot];
    if (above >= want) {
      floor_ = std::max(kLowestFloor, from_bits(static_cast<std::uint64_t>(slot) << kCoarseShift));
      break;
    }
  }
  started_ = true;
}

void StepThreshold::count_round(const SparseSelection& candidates, std::uint32_t lo, int shift,
                                bool with_uncapped) {
  payload_.assign(kBins + 1, 0);
  const std::uint64_t end = round_end(lo, shift);
  std::int64_t above = 0;
  for (const float v : candidates.values) {
    const std::uint32_t bits = magnitude_bits(v);
    if (bits < lo) continue;
    if (bits >= end) {
      ++above;
    } else {
      ++payload_[(bits - lo) >> shift];
    }
  }
  payload_[kBins] = above;
  if (rank_cap_ > 0 && with_uncapped) {
    // The counts before the cap follow the capped ones: the next floor is
    // placed on them (capped counts can never reach margin x k).
    payload_.resize(2 * (kBins + 1));
    std::copy_n(payload_.begin(), kBins + 1, payload_.begin() + kBins + 1);
  }
  if (rank_cap_ > 0) {
    // This rank counts for at most rank_cap_ elements: keep the counts from
    // the top until they reach it.
    std::int64_t left = rank_cap_;
    payload_[kBins] = std::min(payload_[kBins], left);
    left -= payload_[kBins];
    for (std::size_t slot = kBins; slot-- > 0;) {
      payload_[slot] = std::min(payload_[slot], left);
      left -= payload_[slot];
    }
  }
}

float StepThreshold::choose(SparseSelection& candidates, std::size_t k,
                            std::span<std::int64_t> shared, Communicator& comm,
                            const Rescan& rescan) {
  stats_ = std::exchange(started_stats_, StepThresholdStats{});
  stats_.candidate_passes = 1;
  if (!started_) throw Error("[density] StepThreshold::choose() before start()");
  if (!shared.empty() && (k == 0 || options_.per_rank)) {
    // The scheme's integers travel alone: no histogram round carries them.
    all_reduce(shared, comm);
    shared = {};
  }
  if (k == 0) {
    candidates.indices.clear();
    candidates.values.clear();
    return kInf;
  }
  const auto want = static_cast<std::int64_t>(k);
  const double tolerance = options_.tolerance * static_cast<double>(k);
  rank_cap_ = options_.per_rank ? 0 : rank_cap(options_.cap, k, comm.size());
  float floor = floor_;
  bool rescanned = false;
  bool shared_pending = !shared.empty();
  bool first_of_pass = true;
  std::uint32_t lo = magnitude_bits(floor);
  int shift = fine_shift_;
  int rounds_in_pass = 0;
  float threshold = kInf;
  for (;;) {
    const bool with_uncapped = first_of_pass && rank_cap_ > 0;
    count_round(candidates, lo, shift, with_uncapped);
    const std::size_t counts = payload_.size();
    if (shared_pending) payload_.insert(payload_.end(), shared.begin(), shared.end());
    if (!options_.per_rank) all_reduce(payload_, comm);  // else: this rank's counts alone
    ++rounds_in_pass;
    if (shared_pending) {
      std::copy(payload_.begin() + static_cast<std::ptrdiff_t>(counts), payload_.end(),
                shared.begin());
      shared_pending = false;
    }
    if (first_of_pass) {
      // [capped counts | uncapped counts] with a cap; the counts otherwise.
      const auto uncapped = payload_.begin() + (with_uncapped ? kBins + 1 : 0);
      first_round_.assign(uncapped, uncapped + kBins + 1);
      first_round_lo_ = lo;
      stats_.candidates = 0;
      for (const std::int64_t c : first_round_) stats_.candidates += c;
    }
    payload_.resize(kBins + 1);
    const std::int64_t above = payload_[kBins];
    std::int64_t total = above;
    for (std::size_t slot = 0; slot < kBins; ++slot) total += payload_[slot];
    if (first_of_pass) {
      first_of_pass = false;
      if (total < want) {
        if (floor <= kLowestFloor) {
          // Every nonzero element is a candidate and there are fewer than k:
          // all of them are the selection.
          threshold = floor;
          stats_.selected = total;
          break;
        }
        floor = lower_floor(floor, stats_.candidate_passes);
        rescan(floor, candidates);
        ++stats_.candidate_passes;
        rescanned = true;
        lo = magnitude_bits(floor);
        shift = fine_shift_;
        rounds_in_pass = 0;
        first_of_pass = true;
        continue;
      }
    }
    if (above >= want) {
      // The crossing lies above this round's bins: cover the rest of the
      // float range with the next round.
      lo = static_cast<std::uint32_t>(round_end(lo, shift));
      shift = 0;
      while (round_end(lo, shift) <= kInfBits) ++shift;
      continue;
    }
    // The crossing bin: `from_above` elements lie above it, `here` in it.
    std::int64_t from_above = above;
    std::size_t slot = kBins;
    while (slot-- > 0 && from_above + payload_[slot] < want) from_above += payload_[slot];
    const std::int64_t here = payload_[slot];
    const std::uint64_t bin_lo = static_cast<std::uint64_t>(lo) + (std::uint64_t{slot} << shift);
    const std::uint64_t bin_hi = bin_lo + (std::uint64_t{1} << shift);
    const std::int64_t miss_high = want - from_above;        // selecting >= bin_hi: too few
    const std::int64_t miss_low = from_above + here - want;  // selecting >= bin_lo: too many
    const bool close = static_cast<double>(std::min(miss_high, miss_low)) <= tolerance;
    if (close || shift == 0 || rounds_in_pass >= options_.max_rounds) {
      if (!close && shift == 0) {
        // One float value holds the crossing: keep exactly k in all.
        threshold = from_bits(bin_lo);
        keep_ties(candidates, static_cast<std::uint32_t>(bin_lo), miss_high, comm);
        if (rank_cap_ > 0) keep_largest(candidates, static_cast<std::size_t>(rank_cap_));
        stats_.selected = want;
        steer_floor(threshold, k, rescanned);
        return threshold;
      }
      const bool take_high = miss_high <= miss_low;
      threshold = from_bits(take_high ? bin_hi : bin_lo);
      stats_.selected = take_high ? from_above : from_above + here;
      break;
    }
    lo = static_cast<std::uint32_t>(bin_lo);
    shift = std::max(0, shift - kBinBits);
  }
  compact_at_least(candidates, threshold);
  if (rank_cap_ > 0) keep_largest(candidates, static_cast<std::size_t>(rank_cap_));
  steer_floor(threshold, k, rescanned);
  return threshold;
}

void StepThreshold::keep_largest(SparseSelection& candidates, std::size_t count) {
  if (candidates.size() <= count) return;
  // The count-th largest magnitude; everything above it stays, and as many
  // elements equal to it as fit, in index order.
  magnitudes_.resize(candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    magnitudes_[i] = std::fabs(candidates.values[i]);
  }
  const auto nth = magnitudes_.begin() + static_cast<std::ptrdiff_t>(count - 1);
  std::nth_element(magnitudes_.begin(), nth, magnitudes_.end(), std::greater<>());
  const std::uint32_t level = magnitude_bits(*nth);
  std::size_t above = 0;
  for (const float v : candidates.values) above += magnitude_bits(v) > level ? 1 : 0;
  keep_above_and_first_at(candidates, level, count - above);
}

void StepThreshold::keep_ties(SparseSelection& candidates, std::uint32_t tie_bits,
                              std::int64_t take, Communicator& comm) {
  std::int64_t mine = 0;
  for (const float v : candidates.values) mine += magnitude_bits(v) == tie_bits ? 1 : 0;
  std::int64_t before = 0;  // tied elements of the ranks before this one
  if (!options_.per_rank) {
    const Stopwatch watch;
    const std::vector<std::int64_t> ties = allgather_value(comm, mine);
    stats_.collective_s += watch.seconds();
    ++stats_.rounds;
    for (int r = 0; r < comm.rank(); ++r) before += ties[static_cast<std::size_t>(r)];
  }
  keep_above_and_first_at(
      candidates, tie_bits,
      static_cast<std::size_t>(std::clamp<std::int64_t>(take - before, 0, mine)));
}

void StepThreshold::keep_above_and_first_at(SparseSelection& candidates, std::uint32_t level,
                                            std::size_t at_level) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const std::uint32_t bits = magnitude_bits(candidates.values[i]);
    bool keep = bits > level;
    if (bits == level && at_level > 0) {
      keep = true;
      --at_level;
    }
    candidates.indices[kept] = candidates.indices[i];
    candidates.values[kept] = candidates.values[i];
    kept += keep ? 1 : 0;
  }
  candidates.indices.resize(kept);
  candidates.values.resize(kept);
}

void StepThreshold::steer_floor(float threshold, std::size_t k, bool rescanned) {
  margin_ = rescanned ? std::min(margin_ * 2.0, options_.max_margin)
                      : std::max(options_.margin, margin_ * 0.95);
  if (!std::isfinite(threshold)) return;
  // The highest first-round bin edge that margin x k elements reached this
  // step; if even the pass's floor did not, half of it.
  const double want = margin_ * static_cast<double>(k);
  auto passed = static_cast<double>(first_round_[kBins]);
  float next = from_bits(first_round_lo_) * 0.5f;
  if (passed >= want) {
    next = from_bits(round_end(first_round_lo_, fine_shift_));
  } else {
    for (std::size_t slot = kBins; slot-- > 0;) {
      passed += static_cast<double>(first_round_[slot]);
      if (passed >= want) {
        next = from_bits(first_round_lo_ + (std::uint64_t{slot} << fine_shift_));
        break;
      }
    }
  }
  floor_ = std::clamp(next, kLowestFloor, std::max(kLowestFloor, threshold));
}

void StepThreshold::save(StateWriter& writer) const {
  writer.tag("step-threshold");
  writer.value(started_);
  writer.value(floor_);
  writer.value(margin_);
}

void StepThreshold::load(StateReader& reader) {
  reader.expect_tag("step-threshold");
  started_ = reader.value<bool>();
  floor_ = reader.value<float>();
  margin_ = reader.value<double>();
}

}  // namespace sparsecomm
