#include "device_sync.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sync/gradient_sync.h"

namespace sparsecomm::python {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point begin) {
  return std::chrono::duration<double>(Clock::now() - begin).count();
}

// The histogram top-k's bins: 64 over 40 octaves below the largest |a|;
// smaller magnitudes fall below every bin (never the k-th largest unless
// fewer than k elements are within 2^-40 of the largest, when the full
// topk runs).
constexpr std::int64_t kBins = 64;
constexpr double kOctaves = 40.0;

}  // namespace

std::string device_method_names() {
  std::string names;
  for (const SyncMethodInfo& info : sync_methods()) {
    if (info.device_path) names += (names.empty() ? "" : ", ") + info.name;
  }
  return names;
}

DeviceSynchronizer::DeviceSynchronizer(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                       const std::string& method,
                                       const std::map<std::string, std::string>& options,
                                       const std::string& nonfinite)
    : group_(std::move(group)), method_(method), policy_(parse_nonfinite_policy(nonfinite)) {
  const SyncMethodInfo& info = sync_method(method_);  // InvalidArgument for an unknown name
  if (!info.device_path) {
    throw InvalidArgument("[device] '" + method_ + "' has no device path: on the gradient's " +
                          "device sparsecomm runs " + device_method_names() +
                          "; use selection='host' (CPU tensors) for the others");
  }
  for (const auto& [key, value] : options) {
    if (!info.device_takes(key, value)) {
      std::string takes;
      for (const std::string& option : info.device_options) {
        takes += (takes.empty() ? "" : ", ") + option;
      }
      throw InvalidArgument("[device] " + method_ + " on the gradient's device takes " +
                            (takes.empty() ? std::string("no options") : takes) + ", not " + key +
                            "=" + value + "; use selection='host' for the others");
    }
  }
  if (method_ != "dense") {
    // The host scheme checks the values (the registry's messages).
    const SchemeOptions parsed(options);
    density_ = parsed.number(method_, "density", density_, 0.0, 1.0, /*min_exclusive=*/true);
    lambda_ = parsed.number(method_, "lambda", -1.0, 0.0, std::numeric_limits<double>::max());
  }
}

void DeviceSynchronizer::check(const at::Tensor& gradient) const {
  if (gradient.scalar_type() != at::kFloat || !gradient.is_contiguous() || gradient.dim() != 1) {
    throw InvalidArgument("[device] the gradient must be a contiguous 1-d float32 tensor");
  }
  if (residual_.defined() && residual_.numel() != gradient.numel()) {
    throw InvalidArgument("[device] the gradient has " + std::to_string(gradient.numel()) +
                          " elements, the residual " + std::to_string(residual_.numel()) +
                          "; a group's gradient keeps its length");
  }
}

std::int64_t DeviceSynchronizer::target(std::int64_t numel) const {
  const auto k = static_cast<std::int64_t>(std::llround(density_ * static_cast<double>(numel)));
  return std::clamp<std::int64_t>(k, 1, numel);
}

at::Tensor DeviceSynchronizer::select(const at::Tensor& accumulated, std::int64_t k) const {
  const at::Tensor magnitude = accumulated.abs();
  const std::int64_t numel = accumulated.numel();
  if (method_ == "threshold") {
    const double lambda =
        lambda_ >= 0.0 ? lambda_ : 1.0 / (2.0 * std::sqrt(static_cast<double>(k)));
    return at::nonzero(magnitude >= lambda).squeeze(1);  // ascending
  }
  if (k >= numel) return at::arange(numel, accumulated.options().dtype(at::kLong));
  // The bin of the k-th largest |a| in a histogram of log2|a|, then an
  // exact topk among the elements from that bin up.
  const at::Tensor logs = at::log2(magnitude.clamp_min(std::numeric_limits<float>::min()));
  const double top = logs.max().item<double>();
  const double bottom = top - kOctaves;
  const at::Tensor counts = at::histc(logs, kBins, bottom, top).to(at::kCPU, at::kDouble);
  const double* per_bin = counts.data_ptr<double>();
  double above = 0.0;
  std::int64_t bin = kBins - 1;
  for (; bin >= 0; --bin) {
    above += per_bin[bin];
    if (above >= static_cast<double>(k)) break;
  }
  at::Tensor chosen;
  if (bin >= 0) {
    // The bin's lower edge, less a little: histc's rounding must not
    // leave out an element it counted.
    const double edge = bottom + (top - bottom) * static_cast<double>(bin) / kBins - 1e-6;
    const at::Tensor candidates = at::nonzero(logs >= edge).squeeze(1);
    if (candidates.numel() >= k) {
      chosen = candidates.numel() == k
                   ? candidates
                   : candidates.index_select(
                         0, std::get<1>(at::topk(magnitude.index_select(0, candidates), k, 0,
                                                 /*largest=*/true, /*sorted=*/false)));
    }
  }
  if (!chosen.defined()) {
    chosen = std::get<1>(at::topk(magnitude, k, 0, /*largest=*/true, /*sorted=*/false));
  }
  return std::get<0>(at::sort(chosen));
}

bool DeviceSynchronizer::all_finite(const at::Tensor& gradient, StepMetrics& metrics) {
  const Clock::time_point begin = Clock::now();
  std::vector<at::Tensor> flag{
      at::logical_not(at::isfinite(gradient)).any().to(at::kFloat).reshape({1})};
  if (group_) {
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MAX;
    group_->allreduce(flag, options)->wait();
  }
  const bool finite = flag[0].item<float>() == 0.0f;
  metrics.agreement_s = seconds_since(begin);
  return finite;
}

void DeviceSynchronizer::sum_selections(const at::Tensor& indices, const at::Tensor& values,
                                        at::Tensor& out, StepMetrics& metrics) {
  const int world = world_size();
  const auto index_type =
      out.numel() <= std::numeric_limits<std::int32_t>::max() ? at::kInt : at::kLong;
  const std::int64_t index_bytes = index_type == at::kInt ? 4 : 8;
  // Every rank's count, then every rank's (indices, values) padded to the
  // largest count: all_gather takes equal sizes.
  std::vector<at::Tensor> count{at::full({1}, indices.numel(), indices.options())};
  std::vector<std::vector<at::Tensor>> counts(1);
  for (int r = 0; r < world; ++r) counts[0].push_back(group_ ? at::empty_like(count[0]) : count[0]);
  if (group_) group_->allgather(counts, count)->wait();
  std::vector<std::int64_t> per_rank;
  for (const at::Tensor& c : counts[0]) per_rank.push_back(c.item<std::int64_t>());
  const std::int64_t widest = *std::max_element(per_rank.begin(), per_rank.end());

  std::vector<at::Tensor> mine_indices{at::zeros({widest}, out.options().dtype(index_type))};
  std::vector<at::Tensor> mine_values{at::zeros({widest}, out.options())};
  mine_indices[0].narrow(0, 0, indices.numel()).copy_(indices);
  mine_values[0].narrow(0, 0, values.numel()).copy_(values);
  std::vector<std::vector<at::Tensor>> all_indices(1), all_values(1);
  if (group_) {
    for (int r = 0; r < world; ++r) {
      all_indices[0].push_back(at::empty_like(mine_indices[0]));
      all_values[0].push_back(at::empty_like(mine_values[0]));
    }
    group_->allgather(all_indices, mine_indices)->wait();
    group_->allgather(all_values, mine_values)->wait();
  } else {
    all_indices[0] = mine_indices;
    all_values[0] = mine_values;
  }

  out.zero_();
  at::Tensor touched = at::zeros({out.numel()}, out.options().dtype(at::kBool));
  for (int r = 0; r < world; ++r) {  // in rank order: the same sum on every rank
    const at::Tensor index = all_indices[0][r].narrow(0, 0, per_rank[r]).to(at::kLong);
    out.index_add_(0, index, all_values[0][r].narrow(0, 0, per_rank[r]));
    touched.index_fill_(0, index, true);
  }
  metrics.union_size = static_cast<std::size_t>(touched.sum().item<std::int64_t>());
  std::int64_t total = 0;
  for (const std::int64_t c : per_rank) total += c;
  metrics.imbalance = total > 0 ? static_cast<double>(world) * static_cast<double>(widest) /
                                          static_cast<double>(total) -
                                      1.0
                                : 0.0;
  // What this rank's all_gathers carry to each peer: the count and the
  // padded lists.
  const auto per_peer = static_cast<std::uint64_t>(8 + widest * (index_bytes + 4));
  metrics.bytes_sent = per_peer * static_cast<std::uint64_t>(world - 1);
  metrics.bytes_received = metrics.bytes_sent;
  metrics.index_bytes_raw = metrics.index_bytes_encoded =
      static_cast<std::uint64_t>(widest * index_bytes) * static_cast<std::uint64_t>(world - 1);
}

StepMetrics DeviceSynchronizer::run(const at::Tensor& gradient, const GroupStep& step) {
  StepMetrics metrics;
  metrics.step = step.step;
  metrics.numel = static_cast<std::size_t>(gradient.numel());
  const Clock::time_point begin = Clock::now();
  if (!all_finite(gradient, metrics)) {
    if (policy_ == NonFinitePolicy::kStop) {
      throw NonFiniteGradient("[device] step " + std::to_string(step.step) +
                              ": some rank's gradient holds NaN or inf; lower the learning rate, "
                              "or pass nonfinite='skip' to skip such steps");
    }
    gradient.zero_();  // skipped on every rank; the residual is untouched
    metrics.skipped_nonfinite = true;
    metrics.exchange_s = seconds_since(begin);
    return metrics;
  }
  const int world = world_size();
  if (method_ == "dense") {
    std::vector<at::Tensor> tensors{gradient};
    if (group_) group_->allreduce(tensors)->wait();
    gradient.div_(world);
    metrics.exchange_s = seconds_since(begin);
    metrics.bytes_sent = metrics.bytes_received =
        static_cast<std::uint64_t>(2 * gradient.numel() * 4) *
        static_cast<std::uint64_t>(world - 1) / static_cast<std::uint64_t>(world);
    return metrics;
  }

  Clock::time_point phase = Clock::now();
  metrics.gradient_norm = gradient.norm().item<double>();
  if (!residual_.defined()) residual_ = at::zeros_like(gradient);
  if (residual_.device() != gradient.device()) residual_ = residual_.to(gradient.device());
  residual_.add_(gradient);  // a = g + e, kept in the residual's buffer
  metrics.accumulate_s = seconds_since(phase);

  phase = Clock::now();
  const std::int64_t k = target(gradient.numel());
  const at::Tensor indices = select(residual_, k);
  const at::Tensor values = residual_.index_select(0, indices);
  residual_.index_fill_(0, indices, 0.0);  // e = a - the selection
  metrics.selection_s = seconds_since(phase);
  metrics.target = static_cast<std::size_t>(k);
  metrics.selected = static_cast<std::size_t>(indices.numel());

  phase = Clock::now();
  at::Tensor out = gradient;
  sum_selections(indices, values, out, metrics);
  out.div_(world);
  metrics.exchange_s = seconds_since(phase) + metrics.agreement_s;
  metrics.density_ratio =
      k > 0 ? static_cast<double>(metrics.union_size) / static_cast<double>(k) : 0.0;
  metrics.residual_norm = residual_.norm().item<double>();
  return metrics;
}

at::Tensor DeviceSynchronizer::kept() const {
  if (!residual_.defined()) return at::empty({0}, at::kFloat);
  return residual_.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

void DeviceSynchronizer::load_state(const at::Tensor& residual) {
  if (method_ == "dense") return;
  if (!residual.defined() || residual.numel() == 0) {
    residual_ = at::Tensor();
    return;
  }
  if (residual.scalar_type() != at::kFloat || residual.dim() != 1) {
    throw InvalidArgument("[device] load_state: a saved residual is a 1-d float32 tensor");
  }
  residual_ = residual.clone();  // moved to the gradient's device at the next step
}

}  // namespace sparsecomm::python
