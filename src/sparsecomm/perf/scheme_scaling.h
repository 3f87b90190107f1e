#pragma once
// The sparsification statistics that drive the performance model, as
// functions of the number of ranks n (docs/algorithms.md, "Performance
// model"): K/k (the union's build-up), the load imbalance, the share of
// d/n the slowest rank reads, and the selection's own collective rounds.
// Measured with `bench sparsifiers` at n = 2..64 and extended past the
// last measured n with stated laws:
//
// - Union build-up, for schemes whose ranks select independently: a core
//   of `shared` k coordinates that every rank selects, the other (1 -
//   shared) k drawn from a pool of `pool` k coordinates, independently per
//   rank. Then E[K]/m = shared + pool (1 - (1 - (1 - shared)/pool)^n)
//   for per-rank selections of m entries, fitted to the measured K/m by
//   least squares in log.
// - Imbalance: counting noise, K elements over n ranks, whose largest share
//   exceeds the mean by about sqrt(2 ln(n) n / K); the measured imbalance
//   at the last point is scaled by that law's ratio.
// - Read share and rounds: held at the last measured value.

#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sparsecomm::perf {

struct UnionLaw {
  double shared = 1.0;  // in [0, 1]
  double pool = 0.0;    // in units of k, >= 1 - shared
  // Expected K/k on n ranks (1 at n = 1).
  double ratio(double n) const;
};

// Least-squares fit of (n, K/k) points, n >= 1; InvalidArgument when there
// are none or a ratio is below 1 or above n (impossible for a union).
UnionLaw fit_union_law(std::span<const double> ranks, std::span<const double> ratios);

// sqrt(2 ln(n) n / K): the relative excess of the largest of n counts of K
// elements spread at random (0 for n = 1 or K = 0).
double counting_imbalance(double n, double total);

// One measured world size.
struct ScalingPoint {
  int ranks = 1;
  double density_ratio = 1.0;   // mean K/k
  double selected_ratio = 1.0;  // mean |I_r| over its share of k (k if independent, else k/n)
  double imbalance = 0.0;       // n max|I_r| / sum|I_r| - 1
  double read_share = 1.0;      // elements the slowest rank reads / (d/n)
  double rounds = 0.0;          // selection collectives per step
};

class SchemeScaling {
 public:
  // `selected_total` is the K at which the points were measured (for the
  // imbalance law); points must have ascending, distinct ranks >= 1.
  // `independent` says the ranks select independently (union build-up).
  SchemeScaling(std::string scheme, bool independent, double selected_total,
                std::vector<ScalingPoint> points);

  const std::string& scheme() const { return scheme_; }
  bool independent() const { return independent_; }

  // The statistics on n ranks at union target k (entries): interpolated in
  // log n between measured points, extended by the laws above.
  ScalingPoint at(int n, double k) const;

  const UnionLaw& union_law() const { return union_law_; }

 private:
  std::string scheme_;
  bool independent_;
  double selected_total_;
  std::vector<ScalingPoint> points_;
  UnionLaw union_law_;
};

// Statistics of several schemes, each measured at one or more densities.
class ScalingTable {
 public:
  // Adds `scaling`, measured at target density `density` (in (0, 1]).
  void add(double density, SchemeScaling scaling);
  // The scheme's statistics at the density nearest to `density` (in log);
  // nullptr when the table has none for the scheme.
  const SchemeScaling* find(std::string_view scheme, double density) const;
  // The schemes it holds, sorted, each once.
  std::vector<std::string> schemes() const;

 private:
  std::deque<std::pair<double, SchemeScaling>> entries_;  // stable addresses
};

// The built-in statistics (builtin_scaling.cc gives the commands): the
// synthetic stream.
const ScalingTable& builtin_scaling_table();

// builtin_scaling_table().find, or InvalidArgument for a scheme without
// statistics.
const SchemeScaling& builtin_scaling(const std::string& scheme, double density);

}  // namespace sparsecomm::perf
