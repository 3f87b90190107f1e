#pragma once
// Density control for threshold-selected partition schemes (MiCRO, ExDyna):
// one global threshold, identical on all ranks because it is derived only
// from data every rank shares (all-reduced counts, the global count K).
//
// Per step the scheme:
//   1. on the first step, sums initial_counts() from every rank
//      (contribute_initial over the rank's own partition) and calls start();
//   2. selects |a| >= threshold() in its partition, collecting every element
//      >= candidate_floor() (<= threshold) as a candidate;
//   3. sums step_counts() from every rank (contribute over its candidates) and
//      calls update();
//   4. after the exchange, calls observe(K, k).
// Counts are int64 and summed element-wise (one all-reduce, which the scheme
// may merge with its own shared counts).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"

namespace sparsecomm {

class DensityController {
 public:
  virtual ~DensityController() = default;
  virtual std::string_view name() const = 0;

  virtual bool started() const = 0;
  virtual std::size_t initial_counts() const = 0;
  virtual void contribute_initial(std::span<const float> own,
                                  std::span<std::int64_t> counts) const = 0;
  virtual void start(std::span<const std::int64_t> global_counts, std::size_t k) = 0;

  virtual float threshold() const = 0;
  virtual float candidate_floor() const = 0;

  virtual std::size_t step_counts() const = 0;
  // `candidates`: this rank's elements >= candidate_floor() (any order);
  // `selected`: how many of them are >= threshold() (the selection's size).
  virtual void contribute(std::span<const float> candidates, std::size_t selected,
                          std::span<std::int64_t> counts) const = 0;
  // What a selection pass does with its candidates in one go: adds to
  // `counts` what contribute() would add for them, and compacts `candidates`
  // (every element >= candidate_floor(), ascending indices) in place, order
  // kept, to those >= threshold(): the selection. This default calls
  // contribute() and then compacts; controllers may fuse the two.
  virtual void contribute_and_select(SparseSelection& candidates,
                                     std::span<std::int64_t> counts) const;
  virtual void update(std::span<const std::int64_t> global_counts, std::size_t k) = 0;

  virtual void observe(std::size_t union_size, std::size_t k) = 0;

  virtual void save(StateWriter& writer) const = 0;
  virtual void load(StateReader& reader) = 0;
};

// The default: a histogram of candidate magnitudes by float exponent and
// top mantissa bits (2^mantissa_bits bins per binade), summed over ranks,
// plus the global count K selected with the threshold in use. Next
// threshold = exp(m + trend + c) where
//  - m and trend are Holt's linear smoothing (weights `smoothing`,
//    `trend_smoothing`) of log(ideal), the magnitude where the cumulative
//    count from the top crosses k (log-interpolated inside the bin): the
//    feed-forward part, which predicts a steady drift instead of lagging it;
//  - c integrates log(K/k) / slope (slope = the local log-log slope of the
//    count above a magnitude, read off the same histogram) with gain `gain`:
//    the feedback part, driven by the count actually achieved, so neither
//    the bin interpolation nor drift nor error-feedback growth can leave a
//    bias.
struct HistogramControllerOptions {
  int mantissa_bits = 7;         // 128 bins per binade (0.54% wide)
  int window_binades = 4;        // candidate window above the floor (the top bin takes the rest)
  double floor_factor = 0.7;     // candidate floor = threshold * floor_factor (initial)
  double gain = 0.1;             // integral gain on log(K/k) / slope
  double smoothing = 0.3;        // weight of the newest ideal threshold in m
  double trend_smoothing = 0.1;  // weight of the newest step-to-step change in m's trend
  // First updates that follow the newest ideal threshold directly (no trend,
  // no feedback) while the residual builds up after a cold start.
  std::int64_t settle_steps = 20;
  // The candidate floor adapts so that the candidates (summed over ranks)
  // stay within [low, high] x k: the wide band while settling, the narrow one
  // after (fewer candidates: a cheaper selection pass).
  double candidates_low = 1.5;
  double candidates_high = 4.0;
  double settled_candidates_low = 1.2;
  double settled_candidates_high = 2.0;
};
std::unique_ptr<DensityController> make_histogram_controller(
    const HistogramControllerOptions& options);

// The reference table (faithful mode): initial threshold 1/(2*sqrt(k)) (or
// `initial` when > 0), then with e = K_prev / k:
//   thr *= up_fast if e > high; up_slow if low < e <= high; down otherwise.
// (The middle band always raises the threshold: the known defect that makes
// the density settle below target.)
struct TableControllerOptions {
  double initial = 0.0;
  double up_fast = 1.005;
  double up_slow = 1.00125;
  double down = 0.995;
  double high = 1.1;
  double low = 0.909;
};
std::unique_ptr<DensityController> make_table_controller(const TableControllerOptions& options);

}  // namespace sparsecomm
