#pragma once
// Gradient memories: what turns the local gradient g into the vector the
// sparsifier looks at, and what is kept of the part that was not sent.
//
// Every memory owns one buffer, the "accumulated" vector. The exchange
// (sparse_exchange.h) subtracts what was transmitted from it in place, so
// after the exchange it already is the new residual; after_exchange() then
// applies any extra rule of the memory (DGC's momentum masking, or dropping
// the residual when error feedback is off).

#include <cmath>
#include <memory>
#include <span>
#include <string_view>

#include "sparsecomm/core/sparse.h"
#include "sparsecomm/core/state_io.h"

namespace sparsecomm {

// sum x_i^2 in double (eight partial sums): the memories' residual norms and
// the step's gradient norm.
double sum_of_squares(std::span<const float> x);

class GradientMemory {
 public:
  virtual ~GradientMemory() = default;
  virtual std::string_view name() const = 0;
  // Folds g into the accumulated buffer (length g.size(); the size is fixed
  // by the first call). g is finite: the sync checks that on all ranks first,
  // so a skipped step leaves the memory untouched.
  virtual void accumulate(std::span<const float> gradient) = 0;
  virtual std::span<float> accumulated() = 0;
  // `transmitted`: positions this rank transmitted (ascending).
  virtual void after_exchange(std::span<const Index> transmitted) = 0;
  // For the callers that move a selection themselves (SelectionStep, the
  // parameter-server push; the exchanges do it as they send): exactly what
  // was sent leaves the accumulated buffer, then after_exchange(indices).
  void take_sent(const SparseSelection& sent) {
    const std::span<float> a = accumulated();
    for (std::size_t j = 0; j < sent.size(); ++j) a[sent.indices[j]] -= sent.values[j];
    after_exchange(sent.indices);
  }
  // True when the exchanged average is not yet the vector to apply and
  // finish() must turn it into that (EF21). Callers that have no average
  // (a selection without the exchange, parameter-server pushes) refuse
  // such a memory.
  virtual bool finishes_average() const { return false; }
  // True when the memory applies momentum itself (DGC's momentum
  // correction): the optimizer must then apply none.
  virtual bool applies_momentum() const { return false; }
  // After after_exchange(): `average` holds the mean over ranks of what
  // they sent (the same on every rank); the memory makes it the vector the
  // optimizer applies. Called only when finishes_average().
  virtual void finish(std::span<float> average) { (void)average; }
  // ||residual||_2 after the exchange.
  virtual double residual_norm() const = 0;
  // Steps whose gradient a spike clip scaled down (with_spike_clip), so far.
  virtual std::int64_t clipped_steps() const { return 0; }
  virtual void save(StateWriter& writer) const = 0;
  virtual void load(StateReader& reader) = 0;
};

// Error feedback (the default): e = decay * e + g; the exchange leaves
// e = a - sent. decay in (0, 1]: 1 is plain error feedback; below 1 what was
// held back fades (SparseLoCo's accumulator on pseudo-gradients, where it
// stands in for the outer momentum). InvalidArgument outside (0, 1].
std::unique_ptr<GradientMemory> make_error_feedback(double decay = 1.0);
// No memory: a = g each step; whatever was not sent is dropped.
std::unique_ptr<GradientMemory> make_no_memory();
// DGC momentum correction: u = m*u + g; v = v + u; select on v; after the
// exchange u (and v, by the exchange) are zeroed at transmitted positions.
// clip_norm > 0: DGC's local gradient clipping, g is scaled down to
// ||g||_2 <= clip_norm before it enters u (0 = off).
std::unique_ptr<GradientMemory> make_momentum_correction(double momentum, double clip_norm = 0.0);
// EF21 (Richtarik, Sokolov and Fatkhullin, 2021): each rank keeps h, its
// estimate of its own gradient, and the sparsifier selects from g - h; h
// advances by what was sent. Every rank also keeps H, the mean of the
// ranks' h, advanced by the exchanged average, and the optimizer applies H:
// a dense estimate of the mean gradient that moves by the selected
// differences, never a burst of gradients accumulated over many steps (as
// error feedback sends). Four buffers of the gradient's length (h, H, the
// difference and the step's gradient) against error feedback's one.
std::unique_ptr<GradientMemory> make_ef21();

// Spike clip in front of `inner`: a gradient whose norm exceeds `ratio` times
// the running mean of the norms that entered before (weight 0.1 for the
// newest) is scaled down to that bound; the mean then counts the clipped
// norm, so a spike does not raise the bound. The first gradient sets the
// mean. A memory replays what it keeps: error feedback sends a spike's
// unsent part over the following steps, when the step that caused it has
// already been corrected, and at the edge of stability that replay sets
// off the next spike (docs/algorithms.md, "Spike clip"). Local, no
// communication; state: the mean and the count of clipped steps.
// InvalidArgument unless ratio > 1 and finite.
inline constexpr double kDefaultSpikeClipRatio = 2.0;
std::unique_ptr<GradientMemory> with_spike_clip(std::unique_ptr<GradientMemory> inner,
                                                double ratio);

}  // namespace sparsecomm
