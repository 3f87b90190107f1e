#include "sparsecomm/sync/powersgd.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/timer.h"

// Layout of the two messages (one ring all-reduce each):
//   first:  [P of every factorized tensor, its r columns one after another
//            (R floats each), in layer order]
//           [the values of every tensor sent whole, in layer order]
//   second: [Q of every factorized tensor, its r columns one after another
//            (C floats each)]
// Sums of floats in the ring's fixed order are bit-identical on every rank,
// so the orthonormalized P and the warm-started Q are too.

namespace sparsecomm {
namespace {

constexpr std::string_view kPowerSgd = "powersgd";

struct Factor {
  std::size_t offset = 0;  // the tensor's place in the flat gradient
  std::size_t rows = 0;    // R
  std::size_t cols = 0;    // C
  std::size_t rank = 0;    // min(r, R, C)
  std::size_t p_at = 0;    // its P in the first message
  std::size_t q_at = 0;    // its Q in the second message and in q_
};

// The factors are stored column by column (a column of P holds R floats,
// of Q C floats), so that every loop below runs over contiguous floats:
// dot products with several partial sums and a * x + y passes, which the
// compiler vectorizes.

// sum of a[j] b[j]: kLanes partial sums, then their total (a fixed order:
// every rank computes the same bits from the same inputs).
float dot(const float* a, const float* b, std::size_t n) {
  constexpr std::size_t kLanes = 16;
  float lanes[kLanes] = {};
  std::size_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) lanes[l] += a[j + l] * b[j + l];
  }
  float sum = 0.0f;
  for (const float lane : lanes) sum += lane;
  for (; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

// y += a x over n floats.
void axpy(float a, const float* x, float* y, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) y[j] += a * x[j];
}

// Modified Gram-Schmidt on the r columns of p (each R floats); a column
// with nothing left is set to 0 (it then carries nothing this step).
void orthonormalize(float* p, std::size_t rows, std::size_t rank) {
  for (std::size_t k = 0; k < rank; ++k) {
    float* column = p + k * rows;
    for (std::size_t j = 0; j < k; ++j) {
      const float* done = p + j * rows;
      axpy(-dot(column, done, rows), done, column, rows);
    }
    const double norm = std::sqrt(double{dot(column, column, rows)});
    const float inverse = norm > 1e-30 ? static_cast<float>(1.0 / norm) : 0.0f;
    for (std::size_t i = 0; i < rows; ++i) column[i] *= inverse;
  }
}

}  // namespace

std::size_t powersgd_factor_rank(const LayerSpan& layer, std::size_t rank) {
  const std::size_t rows = layer.rows;
  const std::size_t cols = rows >= 2 && layer.size % rows == 0 ? layer.size / rows : 0;
  const std::size_t r = std::min({rank, rows, cols});
  return cols >= 2 && r * (rows + cols) < rows * cols ? r : 0;
}

void powersgd_project(std::span<const float> m, std::span<const float> q, std::span<float> p,
                      std::size_t rows, std::size_t cols, std::size_t rank) {
  for (std::size_t i = 0; i < rows; ++i) {
    const float* row = m.data() + i * cols;
    for (std::size_t k = 0; k < rank; ++k) p[k * rows + i] = dot(row, q.data() + k * cols, cols);
  }
}

void powersgd_back_project(std::span<const float> m, std::span<float> p, std::span<float> q_local,
                           std::size_t rows, std::size_t cols, std::size_t rank) {
  orthonormalize(p.data(), rows, rank);
  std::fill(q_local.begin(), q_local.end(), 0.0f);
  for (std::size_t i = 0; i < rows; ++i) {
    const float* row = m.data() + i * cols;
    for (std::size_t k = 0; k < rank; ++k) {
      axpy(p[k * rows + i], row, q_local.data() + k * cols, cols);
    }
  }
}

double powersgd_reconstruct(std::span<float> m, std::span<const float> p,
                            std::span<const float> q_sum, std::span<const float> q_local,
                            float ranks, std::span<float> out, std::size_t rows, std::size_t cols,
                            std::size_t rank) {
  double residual = 0.0;
  for (std::size_t i = 0; i < rows; ++i) {
    float* target = out.data() + i * cols;
    float* error = m.data() + i * cols;
    std::fill(target, target + cols, 0.0f);
    for (std::size_t k = 0; k < rank; ++k) {
      const float pk = p[k * rows + i];
      axpy(pk / ranks, q_sum.data() + k * cols, target, cols);
      axpy(-pk, q_local.data() + k * cols, error, cols);
    }
    residual += double{dot(error, error, cols)};
  }
  return residual;
}

namespace {

class PowerSgd final : public GradientSync {
 public:
  PowerSgd(const SchemeOptions& options, NonFinitePolicy policy) : policy_(policy) {
    options.check_known(kPowerSgd, powersgd_option_specs());
    rank_ = static_cast<std::size_t>(options.integer(kPowerSgd, "rank", 1, 1, 1024));
    warm_start_ = options.flag(kPowerSgd, "warm_start", true);
    seed_ = static_cast<std::uint64_t>(
        options.integer(kPowerSgd, "seed", 0, 0, std::numeric_limits<std::int64_t>::max()));
  }

  std::string_view method() const override { return kPowerSgd; }
  std::span<const float> kept() const override { return error_; }

  StepMetrics synchronize(std::span<float> gradient, const StepContext& ctx,
                          Communicator& comm) override {
    StepMetrics m;
    if (!begin_finite_step(gradient, ctx, comm, policy_, finite_flags_, m)) return m;
    Stopwatch watch;
    plan(gradient.size(), ctx.layers);
    const auto n = static_cast<float>(comm.size());
    // The step's three phases are timed apart, as the performance model
    // prices them: M = g + e (accumulate_s), the products and the error
    // (selection_s: the compression's arithmetic), the all-reduces and the
    // copies around them (exchange_s, with the agreement).
    auto factor_of = [](std::vector<float>& v, std::size_t at, std::size_t count) {
      return std::span<float>(v).subspan(at, count);
    };

    // M = g + e on the factorized tensors (in error_).
    watch.restart();
    for (const Factor& f : factors_) {
      float* mf = error_.data() + f.offset;
      const float* g = gradient.data() + f.offset;
      for (std::size_t j = 0; j < f.rows * f.cols; ++j) mf[j] += g[j];
    }
    m.accumulate_s = watch.seconds();

    // P = M Q into the first message, the whole tensors' values after them.
    watch.restart();
    for (const Factor& f : factors_) {
      if (!warm_start_) initialize_q(f, ctx.step);
      powersgd_project(factor_of(error_, f.offset, f.rows * f.cols),
                       factor_of(q_, f.q_at, f.cols * f.rank),
                       factor_of(first_, f.p_at, f.rows * f.rank), f.rows, f.cols, f.rank);
    }
    m.selection_s += watch.seconds();
    watch.restart();
    std::size_t at = p_size_;
    for (const Range& whole : whole_) {
      std::copy(gradient.begin() + static_cast<std::ptrdiff_t>(whole.begin),
                gradient.begin() + static_cast<std::ptrdiff_t>(whole.end), first_.begin() + at);
      at += whole.size();
    }
    AllreduceReport report;
    allreduce(comm, std::span<float>(first_), {}, &report);
    m.bytes_sent += report.bytes_sent;
    m.bytes_received += report.bytes_received;
    at = p_size_;
    for (const Range& whole : whole_) {
      for (std::size_t i = whole.begin; i < whole.end; ++i) gradient[i] = first_[at++] / n;
    }
    m.exchange_s += watch.seconds();

    // Orthonormal P, this rank's Q = M^T P (kept for its error), the sum
    // of the Q's in the second message.
    watch.restart();
    for (const Factor& f : factors_) {
      powersgd_back_project(factor_of(error_, f.offset, f.rows * f.cols),
                            factor_of(first_, f.p_at, f.rows * f.rank),
                            factor_of(local_q_, f.q_at, f.cols * f.rank), f.rows, f.cols, f.rank);
    }
    m.selection_s += watch.seconds();
    watch.restart();
    std::copy(local_q_.begin(), local_q_.end(), q_.begin());
    allreduce(comm, std::span<float>(q_), {}, &report);
    m.bytes_sent += report.bytes_sent;
    m.bytes_received += report.bytes_received;
    m.exchange_s += watch.seconds();

    // The mean P Q_sum^T / n into the gradient; e = M - P Q_local^T (what
    // this rank's share of the sum was); q_ (the sum) warm-starts the next step.
    watch.restart();
    double residual = 0.0;
    for (const Factor& f : factors_) {
      residual += powersgd_reconstruct(
          factor_of(error_, f.offset, f.rows * f.cols), factor_of(first_, f.p_at, f.rows * f.rank),
          factor_of(q_, f.q_at, f.cols * f.rank), factor_of(local_q_, f.q_at, f.cols * f.rank), n,
          gradient.subspan(f.offset, f.rows * f.cols), f.rows, f.cols, f.rank);
    }
    m.selection_s += watch.seconds();
    m.exchange_s += m.agreement_s;
    m.selected = m.target = m.union_size = sent_;
    m.density_ratio = sent_ == 0 ? 0.0 : 1.0;
    m.residual_norm = std::sqrt(residual);
    return m;
  }

  void save(StateWriter& writer) const override {
    writer.tag(kPowerSgd);
    writer.value<std::uint64_t>(rank_);
    writer.array<float>(error_);
    writer.array<float>(q_);
  }

  void load(StateReader& reader) override {
    reader.expect_tag(kPowerSgd);
    const auto rank = reader.value<std::uint64_t>();
    if (rank != rank_) {
      throw Error(fmt::format("[powersgd] the state was saved with rank={}, this run has rank={}",
                              rank, rank_));
    }
    error_ = reader.array<float>();
    q_ = reader.array<float>();
    loaded_ = true;
    numel_ = 0;  // plan() checks the sizes against the layers on the next step
  }

 private:
  // The factorized tensors and the whole ones, from the layers (once, or
  // again when the gradient's length changes).
  void plan(std::size_t numel, std::span<const LayerSpan> layers) {
    if (numel == numel_ && planned_) return;
    factors_.clear();
    whole_.clear();
    std::size_t p_size = 0;
    std::size_t q_size = 0;
    for_each_layer_and_gap("[powersgd]", numel, layers,
                           [&](std::size_t begin, std::size_t end, const LayerSpan* layer) {
                             const std::size_t rank =
                                 layer != nullptr ? powersgd_factor_rank(*layer, rank_) : 0;
                             if (rank == 0) {
                               if (end > begin) whole_.push_back(Range{begin, end});
                               return;
                             }
                             const std::size_t rows = layer->rows;
                             const std::size_t cols = layer->size / rows;
                             factors_.push_back({layer->offset, rows, cols, rank, p_size, q_size});
                             p_size += rows * rank;
                             q_size += cols * rank;
                           });
    p_size_ = p_size;
    std::size_t whole_size = 0;
    for (const Range& r : whole_) whole_size += r.size();
    first_.assign(p_size + whole_size, 0.0f);
    local_q_.assign(q_size, 0.0f);
    sent_ = p_size + q_size + whole_size;
    if (loaded_) {
      if (error_.size() != numel || q_.size() != q_size) {
        throw Error(fmt::format(
            "[powersgd] the saved state ({} error values, {} of Q) does not fit this model ({} "
            "elements, {} of Q at rank {})",
            error_.size(), q_.size(), numel, q_size, rank_));
      }
      loaded_ = false;
    } else {
      error_.assign(numel, 0.0f);
      q_.assign(q_size, 0.0f);
      for (const Factor& f : factors_) initialize_q(f, 0);
    }
    numel_ = numel;
    planned_ = true;
  }

  // Q of factor f: uniform draws in [-1, 1) for the step, the same on
  // every rank.
  void initialize_q(const Factor& f, std::int64_t step) {
    const Philox rng(seed_);
    for (std::size_t j = 0; j < f.cols * f.rank; ++j) {
      const std::uint32_t bits =
          rng.block(f.offset, static_cast<std::uint64_t>(step) << 32 | j)[0] >> 8;
      q_[f.q_at + j] = static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f;
    }
  }

  NonFinitePolicy policy_;
  std::size_t rank_ = 1;
  bool warm_start_ = true;
  std::uint64_t seed_ = 0;

  bool planned_ = false;
  bool loaded_ = false;
  std::size_t numel_ = 0;
  std::vector<Factor> factors_;
  std::vector<Range> whole_;  // positions averaged whole, ascending
  std::size_t p_size_ = 0;
  std::size_t sent_ = 0;        // floats all-reduced per step
  std::vector<float> error_;    // e (M during a step) on the factorized tensors, 0 elsewhere
  std::vector<float> q_;        // the warm-started Q's (the last step's sums)
  std::vector<float> local_q_;  // this rank's Q's of the step
  std::vector<float> first_;    // the first message
  std::vector<std::uint8_t> finite_flags_;
};

}  // namespace

std::vector<OptionSpec> powersgd_option_specs() {
  return {
      {"rank", "1", "r: the rank of each tensor's approximation P Q^T (1-1024)"},
      {"warm_start", "true", "start each step's power iteration from the last step's Q"},
      {"seed", "0", "seed of Q's first draws (identical on all ranks)"},
  };
}

std::unique_ptr<GradientSync> make_powersgd(const SchemeOptions& options,
                                            NonFinitePolicy nonfinite) {
  return std::make_unique<PowerSgd>(options, nonfinite);
}

}  // namespace sparsecomm
