#include "sparsecomm/perf/step_model.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/perf/scheme_scaling.h"
#include "sparsecomm/sparsify/registry.h"
#include "sparsecomm/sync/demo.h"
#include "sparsecomm/sync/powersgd.h"

namespace sparsecomm::perf {
namespace {

// How a method synchronizes, which decides the terms of its step.
enum class Kind {
  kDense,            // ring all-reduce of d floats
  kSkipReduce,       // Skip-Reduce, skip floor(n/2), d below 100,000 protected
  kIndependent,      // each rank selects from the whole vector; sparse allgather
  kPartitioned,      // each rank selects in its partition; union all-reduce
  kShared,           // the same k indices everywhere; all-reduce of k values
  kLeader,           // CLT-k: the leader selects, broadcasts k indices, shared all-reduce
  kLowRank,          // PowerSGD: two ring all-reduces of factors (and the tensors sent whole)
  kCosine,           // DeMo: an all-gather of every chunk's largest DCT coefficient
  kParameterServer,  // dense pushes and pulls under BSP
};

struct MethodShape {
  std::string_view name;
  Kind kind;
  bool bucketable;    // runs per bucket when pipelined
  double accumulate;  // passes over d of the memory (error feedback: 1)
  std::string_view exchange;
  bool capped = false;  // same-step threshold with a per-rank cap (ExDyna's default)
  bool ranged = false;  // partitions are contiguous ranges (MiCRO's; ExDyna's are scattered blocks)
  bool known_ranges = false;  // sends known ranges (DEFT's whole pieces): no ok-topk
  // The dense quantizers: k = d whatever the density, values in their own
  // codec (else the scenario's).
  bool every_coordinate = false;
  std::optional<ValueEncoding> values = std::nullopt;
};

// The methods that are not schemes of the registry; the schemes' shapes
// come from their traits (shape_of_scheme).
constexpr MethodShape kDense = {"dense", Kind::kDense, true, 0, "ring all-reduce"};
constexpr MethodShape kSkipReduce = {"skipreduce", Kind::kSkipReduce, true, 0,
                                     "Skip-Reduce (skip n/2)"};
constexpr MethodShape kPowerSgd = {"powersgd", Kind::kLowRank, false, 1.0,
                                   "PowerSGD, 2 ring all-reduces"};
constexpr MethodShape kDeMo = {"demo", Kind::kCosine, false, 1.0, "all-gather of DCT coefficients"};
constexpr MethodShape kParameterServer = {"ps", Kind::kParameterServer, false, 0,
                                          "parameter server, BSP"};

MethodShape shape_of_scheme(const SchemeInfo& info) {
  using Selection = SchemeTraits::Selection;
  const SchemeTraits& traits = info.traits;
  MethodShape shape{info.name, Kind::kIndependent, !traits.spans_the_model, 1.0,
                    "sparse allgather"};
  switch (traits.selection) {
    case Selection::kIndependent:
      break;
    case Selection::kShared:
      shape.kind = Kind::kShared;
      shape.exchange = "shared all-reduce";
      break;
    case Selection::kLeader:
      shape.kind = Kind::kLeader;
      shape.exchange = "broadcast + shared all-reduce";
      break;
    case Selection::kPartitioned:
      shape.kind = Kind::kPartitioned;
      shape.exchange = "union all-reduce";
      break;
  }
  // Momentum correction keeps u and v: two passes over d.
  if (scheme_applies_momentum(info.name, {})) shape.accumulate = 2.0;
  shape.capped = traits.capped_threshold;
  shape.ranged = traits.ranged_partitions;
  shape.known_ranges = traits.sends_known_ranges();
  if (traits.every_coordinate) {
    shape.every_coordinate = true;
    for (const OptionSpec& spec : info.options) {  // no memory: no pass over it
      if (spec.name == "memory" && spec.default_value == "none") shape.accumulate = 0.0;
    }
    shape.values = traits.default_values;
    shape.exchange = "shared, quantized values";
  }
  return shape;
}

// Every method the model prices: dense, Skip-Reduce, the registry's
// schemes but those whose traits say why not, and the parameter server.
const std::vector<MethodShape>& method_shapes() {
  static const std::vector<MethodShape> shapes = [] {
    std::vector<MethodShape> out = {kDense, kSkipReduce, kPowerSgd, kDeMo};
    for (const SchemeInfo& info : scheme_registry()) {
      if (info.traits.unpriced_because.empty()) out.push_back(shape_of_scheme(info));
    }
    out.push_back(kParameterServer);
    return out;
  }();
  return shapes;
}

// Skip-Reduce's defaults (gradient_sync.cc): skip floor(n/2), and buffers
// under 100,000 elements reduced in full.
constexpr double kSkipReduceMinElements = 100000;
// The same-step threshold's histogram message (step_threshold.cc: 512 bins
// and an "above" count, 64-bit each); with a cap, the first round also
// carries the uncapped counts.
constexpr double kHistogramBytes = 8 * 513;

// The method's shape; nullptr for an unknown method.
const MethodShape* find_shape(std::string_view method) {
  for (const MethodShape& shape : method_shapes()) {
    if (shape.name == method) return &shape;
  }
  return nullptr;
}

const MethodShape& shape_of(std::string_view method) {
  if (const MethodShape* shape = find_shape(method)) return *shape;
  if (const SchemeInfo* scheme = find_scheme(method)) {
    throw InvalidArgument(fmt::format("the performance model cannot price '{}': {}", method,
                                      scheme->traits.unpriced_because));
  }
  std::string known;
  for (const MethodShape& shape : method_shapes())
    known += fmt::format("{}{}", known.empty() ? "" : ", ", shape.name);
  throw InvalidArgument(
      fmt::format("the performance model knows no method '{}' (known: {})", method, known));
}

// PowerSGD on the scenario's tensors (numel the method's part of d): the
// floats of its two all-reduces (P's with the tensors sent whole, then
// Q's), the elements it factorizes (its memory's accumulate, its passes)
// and the sum of R C r over them (its products), by the method's own rule.
struct LowRankSizes {
  double first = 0.0;
  double second = 0.0;
  double factorized = 0.0;
  double products = 0.0;
};

LowRankSizes low_rank_sizes(const Scenario& s, double numel) {
  if (s.tensors.empty()) {
    throw InvalidArgument(
        "powersgd's cost depends on the tensors' shapes, which a parameter count does not give: "
        "plan it with --model NAME");
  }
  LowRankSizes z;
  double covered = 0.0;
  for (const LayerSpan& tensor : s.tensors) {
    const auto size = static_cast<double>(tensor.size);
    covered += size;
    const std::size_t rank = powersgd_factor_rank(tensor, static_cast<std::size_t>(s.low_rank));
    if (rank == 0) {
      z.first += size;
      continue;
    }
    const auto rows = static_cast<double>(tensor.rows);
    z.first += rows * static_cast<double>(rank);
    z.second += size / rows * static_cast<double>(rank);
    z.factorized += size;
    z.products += size * static_cast<double>(rank);
  }
  if (covered > numel) {
    throw InvalidArgument(fmt::format(
        "the tensors given for powersgd hold {:.0f} elements, more than the {:.0f} parameters it "
        "runs on",
        covered, numel));
  }
  z.first += numel - covered;
  return z;
}

// Selection and exchange of one call on `numel` elements with target k.
struct CallCost {
  double accumulated = 0.0;  // elements the memory's pass reads
  double selection_s = 0.0;
  CommCost comm;
  double agreement_s = 0.0;  // in comm
  double density_ratio = 1.0;
  double imbalance = 0.0;
  std::string statistics;
  std::string_view exchange;  // set when not the method's own
};

// The exchange of a scheme that selects per rank (target k, `send` filled
// in): the scenario's pattern where set and the scheme takes it, else the
// scheme's own; call.exchange names a pattern that is not the scheme's own.
CommCost per_rank_exchange(const MethodShape& shape, const Scenario& s, const CostProfile& p,
                           const SchemeScaling& scaling, double k, const SparseSend& send,
                           CallCost& call) {
  const int n = s.ranks;
  const ExchangePattern own = shape.kind == Kind::kIndependent ? ExchangePattern::kSparseAllgather
                                                               : ExchangePattern::kUnionAllreduce;
  ExchangePattern pattern = s.exchange.value_or(own);
  if (pattern == ExchangePattern::kSharedIndices ||
      (pattern == ExchangePattern::kOkTopk && shape.known_ranges)) {
    pattern = own;
  }
  if (pattern != own) call.exchange = exchange_pattern_name(pattern);
  switch (pattern) {
    case ExchangePattern::kSparseAllgather:
      return sparse_allgather(p, n, send);
    case ExchangePattern::kUnionAllreduce:
      return union_allreduce(p, n, send);
    case ExchangePattern::kOkTopk:
      return ok_topk_allreduce(p, n, send);
    case ExchangePattern::kSparseAllreduce: {
      // The pattern's own choice (sparse_allreduce.cc, kAuto): recursive
      // doubling while n m times the switch factor is under d, whose
      // partial sums are the union of 1, 2, 4, ... ranks' selections.
      if (n * send.mean_count * ExchangeOptions{}.sparse_switch_factor >= send.numel) {
        return sparcml_split(p, n, send);
      }
      std::vector<double> union_of_ranks;
      for (int ranks = 1; ranks <= n; ranks *= 2) {
        union_of_ranks.push_back(shape.kind == Kind::kIndependent
                                     ? std::min(send.numel, scaling.at(ranks, k).density_ratio * k)
                                     : std::min(send.numel, ranks * send.mean_count));
      }
      return sparcml_recursive_doubling(p, n, send, union_of_ranks);
    }
    case ExchangePattern::kSharedIndices:
      break;
  }
  return union_allreduce(p, n, send);
}

double dense_wire_bytes_per_value(ValueEncoding values) {
  const bool sixteen_bits = values == ValueEncoding::kFloat16 || values == ValueEncoding::kBFloat16;
  return sixteen_bits ? wire_bits_per_value(values) / 8.0 : kFloatBytes;
}

CallCost one_call(const MethodShape& shape, const Scenario& s, const CostProfile& p, double numel) {
  const int n = s.ranks;
  const double k = shape.every_coordinate ? numel : std::max(1.0, std::round(s.density * numel));
  CallCost call;
  call.accumulated = shape.accumulate * numel;
  const ValueEncoding values = shape.values.value_or(s.values);
  const std::string_view codec = value_encoding_name(values);
  SparseSend send{.value_bytes = wire_bits_per_value(values) / 8.0,
                  .encode_s = p.encode_cost(codec),
                  .decode_s = p.decode_cost(codec),
                  .numel = numel};
  send.index_bytes = s.encode_indices ? varint_index_bytes(std::min(1.0, k / numel)) : 4.0;
  // Every sparse step starts with the non-finite agreement.
  const CommCost agreement = nonfinite_agreement(p, n);
  switch (shape.kind) {
    case Kind::kDense:
      // values=fp16|bf16 puts 16-bit partial sums on the ring's wire; the
      // other codecs are not dense's, which then stays fp32.
      call.comm = ring_allreduce(p, n, dense_wire_bytes_per_value(s.values) * numel);
      return call;
    case Kind::kSkipReduce:
      call.comm =
          skip_reduce(p, n, numel < kSkipReduceMinElements ? 0 : n / 2, kFloatBytes * numel);
      return call;
    case Kind::kParameterServer:
      call.comm = ps_bsp_step(p, n, s.servers, numel, kFloatBytes * numel);
      return call;
    case Kind::kLowRank: {
      const LowRankSizes z = low_rank_sizes(s, numel);
      call.comm = agreement + ring_allreduce(p, n, kFloatBytes * z.first) +
                  ring_allreduce(p, n, kFloatBytes * z.second);
      call.agreement_s = agreement.seconds;
      call.accumulated = z.factorized;
      call.selection_s =
          z.factorized * p.low_rank_s_per_element + z.products * p.low_rank_s_per_element_rank;
      return call;
    }
    case Kind::kCosine: {
      // At its defaults (one coefficient per chunk of 64), in the
      // scenario's value codec; the chunks follow the tensors where known.
      // (Scenario::tensors carry sizes, not offsets: laid end to end here.)
      const auto elements = static_cast<std::size_t>(numel);
      std::vector<LayerSpan> layers;
      std::size_t at = 0;
      for (const LayerSpan& tensor : s.tensors) {
        if (at + tensor.size > elements) break;
        layers.push_back({tensor.name, at, tensor.size, tensor.rows});
        at += tensor.size;
      }
      const auto message = static_cast<double>(
          demo_message_bytes(elements, layers, kDemoDefaultChunk, kDemoDefaultTopk, s.values));
      call.comm = agreement + ring_allgatherv(p, n, message, message);
      call.agreement_s = agreement.seconds;
      // The DCT of the gradient and the inverse DCT of the mean: chunk
      // multiply-adds per element each, priced as PowerSGD's products.
      call.selection_s =
          2.0 * numel * static_cast<double>(kDemoDefaultChunk) * p.low_rank_s_per_element_rank;
      return call;
    }
    case Kind::kShared:
    case Kind::kLeader: {
      send.mean_count = send.max_count = send.union_count = k;
      call.comm = agreement + shared_allreduce(p, n, send);
      call.agreement_s = agreement.seconds;
      if (shape.kind == Kind::kLeader) call.comm += broadcast(p, n, kFloatBytes * k);
      // The dense quantizers select nothing: their codec's pass is the exchange's.
      call.selection_s = shape.every_coordinate ? 0.0 : numel * p.select_cost(shape.name);
      return call;
    }
    case Kind::kIndependent:
    case Kind::kPartitioned: {
      const SchemeScaling* measured =
          s.statistics != nullptr ? s.statistics->find(shape.name, s.density) : nullptr;
      const SchemeScaling& scaling =
          measured != nullptr ? *measured : builtin_scaling(std::string(shape.name), s.density);
      call.statistics = measured != nullptr ? "measured" : "built-in";
      const ScalingPoint stats = scaling.at(n, k);
      const double share = shape.kind == Kind::kIndependent ? k : k / n;
      send.mean_count = stats.selected_ratio * share;
      send.max_count = send.mean_count * (1.0 + stats.imbalance);
      send.union_count = std::min(numel, stats.density_ratio * k);
      send.disjoint_ranges = shape.ranged;
      call.density_ratio = send.union_count / k;
      call.imbalance = stats.imbalance;
      call.selection_s = std::min(numel, stats.read_share * numel / n) * p.select_cost(shape.name);
      call.comm = agreement + per_rank_exchange(shape, s, p, scaling, k, send, call);
      call.agreement_s = agreement.seconds;
      if (shape.kind == Kind::kPartitioned) {
        // stats.rounds is a mean over steps (1.58: some steps need a second
        // round), so the last round counts by the share of steps that run it.
        for (int round = 0; round < stats.rounds; ++round) {
          const double copies = round == 0 && shape.capped ? 2 : 1;
          const double share_of_steps = std::min(1.0, stats.rounds - round);
          call.comm +=
              recursive_doubling_allreduce(p, n, copies * kHistogramBytes) * share_of_steps;
        }
      }
      return call;
    }
  }
  return call;
}

// Local steps: one synchronization per H inner steps, so its terms count
// 1/H per step. The slowest rank's lead over a round is that of a sum of H
// steps' compute (spread sqrt(H) times one step's), 1/sqrt(H) per step. Each
// round adds a pass like the optimizer's (pseudo-gradient, outer step, reset).
void amortize_over_rounds(const MethodShape& shape, const Scenario& s, const CostProfile& p,
                          StepPrediction& out) {
  if (shape.kind == Kind::kParameterServer) {
    throw InvalidArgument(
        "local steps synchronize a pseudo-gradient through an all-reduce method; parameter-server "
        "workers push every step");
  }
  if (shape.kind == Kind::kCosine) {
    throw InvalidArgument(
        "demo applies momentum to what it sends, and train refuses it with --local-steps: plan "
        "a sparsifier (topk, exdyna) for the rounds");
  }
  const double h = s.local_steps;
  out.exchange_s -= out.arrival_wait_s;
  out.arrival_wait_s /= std::sqrt(h);
  for (double* term : {&out.accumulate_s, &out.selection_s, &out.exchange_s, &out.agreement_s,
                       &out.host_s, &out.bytes_sent, &out.bytes_received, &out.wire_bytes_sent}) {
    *term /= h;
  }
  out.exchange_s += out.arrival_wait_s;
  out.update_s += s.numel * p.update_s_per_element / h;
  if (s.overlap_rounds) {
    out.overlap_s = std::min(out.compute_s, out.exchange_s - out.arrival_wait_s);
  }
}

}  // namespace

void check_scenario(const Scenario& s) {
  auto bad = [](std::string_view what) { throw InvalidArgument(std::string(what)); };
  if (s.ranks < 1) bad(fmt::format("ranks must be >= 1, got {}", s.ranks));
  if (s.ranks_per_host < 1 || s.ranks % s.ranks_per_host != 0) {
    bad(fmt::format("{} ranks per host do not divide {} ranks into hosts", s.ranks_per_host,
                    s.ranks));
  }
  if (!(s.numel >= 1) || !std::isfinite(s.numel)) {
    bad(fmt::format("the model needs at least 1 parameter, got {}", s.numel));
  }
  if (!(s.dense_numel >= 0 && s.dense_numel < s.numel)) {
    bad(fmt::format(
        "the parameters sent densely beside the method must be in [0, {:.6g}) (all but at least "
        "one of the model's), got {:.6g}",
        s.numel, s.dense_numel));
  }
  if (!(s.density > 0 && s.density <= 1))
    bad(fmt::format("density must be in (0, 1], got {}", s.density));
  if (!(s.compute_s >= 0) || !std::isfinite(s.compute_s)) {
    bad(fmt::format("compute time must be a finite number >= 0, got {}", s.compute_s));
  }
  if (!(s.compute_spread_s >= 0) || !std::isfinite(s.compute_spread_s)) {
    bad(fmt::format("the compute time's spread must be a finite number >= 0, got {}",
                    s.compute_spread_s));
  }
  if (!(s.backward_share >= 0 && s.backward_share <= 1)) {
    bad(fmt::format("the backward share of compute must be in [0, 1], got {}", s.backward_share));
  }
  if (!(s.bucket_bytes >= 0) || !std::isfinite(s.bucket_bytes)) {
    bad(fmt::format("bucket size must be >= 0 bytes, got {}", s.bucket_bytes));
  }
  if (s.servers < 1) bad(fmt::format("servers must be >= 1, got {}", s.servers));
  if (s.local_steps < 0) bad(fmt::format("local steps must be >= 0, got {}", s.local_steps));
  if (s.overlap_rounds && s.local_steps == 0) {
    bad("overlapped rounds need local steps (the exchange of a round hides behind the next)");
  }
  if (s.low_rank < 1) bad(fmt::format("PowerSGD's rank must be >= 1, got {}", s.low_rank));
  if (s.exchange == ExchangePattern::kSharedIndices) {
    bad("the shared pattern is the shared schemes' own (randomk, cltk); give union, allgather, "
        "sparse-allreduce or ok-topk for the others");
  }
  if (s.exchange == ExchangePattern::kOkTopk && s.values != ValueEncoding::kFloat32) {
    bad(fmt::format("ok-topk sums fp32 values at the regions' owners, not {}: give values fp32",
                    value_encoding_name(s.values)));
  }
}

double expected_max_of_normals(int n) {
  if (n < 1) throw InvalidArgument(fmt::format("a world has at least 1 rank, got {}", n));
  if (n == 1) return 0.0;
  // E[max] = integral of x n phi(x) Phi(x)^(n-1) over x, by Simpson's rule
  // on [-9, 12]: the density of the maximum of up to 2^20 normals is
  // negligible outside it (its mean is below 5.5, its spread below 1).
  constexpr double kLow = -9.0;
  constexpr double kHigh = 12.0;
  constexpr int kIntervals = 8400;  // even
  constexpr double kStep = (kHigh - kLow) / kIntervals;
  const double log_n = std::log(static_cast<double>(n));
  auto integrand = [&](double x) {
    const double log_phi = -0.5 * x * x - 0.5 * std::log(2.0 * std::numbers::pi);
    const double log_cdf = std::log(0.5 * std::erfc(-x / std::numbers::sqrt2));
    return x * std::exp(log_n + log_phi + (n - 1) * log_cdf);
  };
  double sum = integrand(kLow) + integrand(kHigh);
  for (int i = 1; i < kIntervals; ++i)
    sum += (i % 2 == 1 ? 4.0 : 2.0) * integrand(kLow + i * kStep);
  return sum * kStep / 3.0;
}

bool has_scheme_statistics(std::string_view method) {
  const MethodShape* shape = find_shape(method);
  return shape != nullptr &&
         (shape->kind == Kind::kIndependent || shape->kind == Kind::kPartitioned);
}

bool takes_local_steps(std::string_view method) {
  const MethodShape* shape = find_shape(method);
  return shape != nullptr && shape->kind != Kind::kParameterServer && shape->kind != Kind::kCosine;
}

bool needs_tensor_shapes(std::string_view method) {
  const MethodShape* shape = find_shape(method);
  return shape != nullptr && shape->kind == Kind::kLowRank;
}

bool selects_independently(std::string_view method) {
  const MethodShape* shape = find_shape(method);
  return shape != nullptr && shape->kind == Kind::kIndependent;
}

const std::vector<std::string>& modeled_methods() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const MethodShape& shape : method_shapes()) out.emplace_back(shape.name);
    return out;
  }();
  return names;
}

StepPrediction predict_step(std::string_view method, const Scenario& s, const CostProfile& p) {
  check_scenario(s);
  const MethodShape& shape = shape_of(method);
  StepPrediction out;
  out.method = std::string(shape.name);
  out.exchange = std::string(shape.exchange);
  out.compute_s = s.compute_s;
  // The tensors sent densely beside the method (the dense-layers
  // decorator): a ring all-reduce, and the method on the rest.
  const bool all_dense = shape.kind == Kind::kDense || shape.kind == Kind::kParameterServer;
  const double dense_numel = all_dense ? 0.0 : s.dense_numel;
  const double method_numel = s.numel - dense_numel;
  out.update_s = shape.kind == Kind::kParameterServer ? 0.0 : s.numel * p.update_s_per_element;

  // Pipelined methods run once per bucket on its share of d (each bucket
  // pays its own latency terms); the others once on the whole vector.
  const bool pipelined = s.bucket_bytes > 0 && shape.bucketable && s.local_steps == 0;
  const double buckets =
      pipelined ? std::max(1.0, std::ceil(kFloatBytes * s.numel / s.bucket_bytes)) : 1.0;
  // Two levels: the method among one leader per host, after the host's
  // all-reduce and before its broadcast (each bucket its own).
  if (s.ranks_per_host > 1 && shape.kind == Kind::kParameterServer) {
    throw InvalidArgument("two-level exchanges are for all-reduce methods; ps runs on one level");
  }
  Scenario between = s;
  between.ranks = s.ranks / s.ranks_per_host;
  CallCost call = one_call(shape, between, p, method_numel / buckets);
  if (!call.exchange.empty()) out.exchange = std::string(call.exchange);
  if (dense_numel > 0) {
    call.comm += ring_allreduce(p, between.ranks, kFloatBytes * dense_numel / buckets);
  }
  if (s.ranks_per_host > 1) {
    const CostProfile& host = s.host_link != nullptr ? *s.host_link : p;
    const double bucket_bytes = kFloatBytes * s.numel / buckets;
    const double inside = ring_allreduce(host, s.ranks_per_host, bucket_bytes).seconds +
                          broadcast(host, s.ranks_per_host, bucket_bytes).seconds;
    call.comm.seconds += inside;
    out.host_s = buckets * inside;
  }
  out.accumulate_s = buckets * call.accumulated * p.accumulate_s_per_element;
  out.selection_s = buckets * call.selection_s;
  out.exchange_s = buckets * call.comm.seconds;
  out.agreement_s = buckets * call.agreement_s;
  out.bytes_sent = buckets * call.comm.bytes_sent;
  out.bytes_received = buckets * call.comm.bytes_received;
  out.wire_bytes_sent = buckets * call.comm.wire_bytes_sent;
  out.density_ratio = call.density_ratio;
  out.imbalance = call.imbalance;
  out.statistics = call.statistics;
  if (pipelined) {
    // Buckets but the last can run while backward still computes.
    out.overlap_s = std::min(s.backward_share * s.compute_s,
                             (buckets - 1) / buckets * (out.selection_s + out.exchange_s));
  }
  // Every method here synchronizes all n ranks (the parameter server: all
  // W workers, under BSP) once per step: its first collective waits for the
  // slowest rank's compute, which nothing overlaps.
  if (s.compute_spread_s > 0) {
    out.arrival_wait_s = s.compute_spread_s * expected_max_of_normals(s.ranks);
  }
  out.exchange_s += out.arrival_wait_s;
  if (s.local_steps > 0) amortize_over_rounds(shape, s, p, out);
  out.step_s = out.compute_s + out.accumulate_s + out.selection_s + out.exchange_s - out.overlap_s +
               out.update_s;
  return out;
}

}  // namespace sparsecomm::perf
