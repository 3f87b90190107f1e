// PsWorker: the worker side of the protocol in parameter_server.h.

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/ps/protocol.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sync/sparse_sync.h"

namespace sparsecomm {
namespace {

using ps::RequestHeader;
using ps::RequestKind;

// The worker group as the sparsifier sees it: rank = worker index, size = W,
// and no communication (PS mode has no collectives among workers; the
// allowed schemes need none, and a scheme that tries gets a clear error).
class WorkerGroupView final : public Communicator {
 public:
  WorkerGroupView(const Communicator& real, int worker, int workers, std::string scheme)
      : backend_(real.backend()), worker_(worker), workers_(workers), scheme_(std::move(scheme)) {
    set_timeout(real.timeout());
  }
  int rank() const override { return worker_; }
  int size() const override { return workers_; }
  std::string_view backend() const override { return backend_; }
  Request isend(std::span<const std::byte>, int, int) override { refuse(); }
  Request irecv(std::span<std::byte>, int, int) override { refuse(); }

 private:
  [[noreturn]] void refuse() const {
    throw NotSupported(fmt::format(
        "[ps] worker {}: scheme '{}' tried to communicate during selection; PS mode selects per "
        "worker without collectives (push methods: {})",
        worker_, scheme_, ps_push_methods()));
  }
  std::string backend_;
  int worker_;
  int workers_;
  std::string scheme_;
};

void wait_all(std::vector<Request>& requests) {
  for (Request& request : requests) request.wait();
  requests.clear();
}

}  // namespace

struct PsWorker::Sparse {
  SchemeParts parts;
  WorkerGroupView view;
  SparseSelection selection;
  std::vector<std::vector<std::uint32_t>> payloads;  // per server: indices, then value bits
};

PsWorker::PsWorker(Communicator& comm, const ServerLayout& layout, PsOptions options)
    : comm_(comm), layout_(layout), options_(std::move(options)), worker_(comm.rank()) {
  if (layout_.world_size() != comm.size()) {
    throw InvalidArgument(fmt::format("[ps] rank {}: the layout ({}) has {} ranks, the world {}",
                                      comm.rank(), layout_.describe(), layout_.world_size(),
                                      comm.size()));
  }
  if (!layout_.is_worker_rank(comm.rank())) {
    throw InvalidArgument(
        fmt::format("[ps] rank {} is a server, not a worker ({}); call "
                    "run_server() on it",
                    comm.rank(), layout_.describe()));
  }
  validate_ps_options(options_);
  const auto servers = static_cast<std::size_t>(layout_.servers());
  versions_.assign(servers, 0);
  log_.sent.assign(servers, SentToServer{});
  if (options_.push != "dense") {
    sparse_ = std::make_unique<Sparse>(
        Sparse{make_scheme(options_.push, options_.scheme_options),
               WorkerGroupView(comm, worker_, layout_.workers(), options_.push), SparseSelection{},
               std::vector<std::vector<std::uint32_t>>(servers)});
  }
}

PsWorker::~PsWorker() = default;

void PsWorker::begin_step() {
  if (finished_) throw Error(fmt::format("[ps] worker {}: begin_step() after finish()", worker_));
  if (in_step_) {
    throw Error(
        fmt::format("[ps] worker {}: begin_step() twice at clock {}; push() the step "
                    "first",
                    worker_, clock_));
  }
  Stopwatch watch;
  ++log_.begins;
  if (options_.model.gated()) {
    ps::GrantReply reply;
    Request grant =
        comm_.irecv(ps::writable_bytes_of(reply), layout_.controller_rank(), ps::kTagGrant);
    RequestHeader header;
    header.kind = static_cast<std::uint32_t>(RequestKind::kBegin);
    header.clock = clock_;
    comm_.send(ps::bytes_of(header), layout_.controller_rank(), ps::kTagRequest);
    grant.wait();
    if (reply.blocked != 0) ++log_.blocked;
    if (reply.dssp_r > 0) log_.extra_steps += reply.dssp_r;
  }
  log_.wait_s += watch.seconds();
  in_step_ = true;
}

void PsWorker::pull(std::span<float> parameters) {
  if (finished_) throw Error(fmt::format("[ps] worker {}: pull() after finish()", worker_));
  if (parameters.size() != layout_.numel()) {
    throw InvalidArgument(fmt::format("[ps] worker {}: pull() into {} floats, the model has {}",
                                      worker_, parameters.size(), layout_.numel()));
  }
  const int servers = layout_.servers();
  std::vector<Request> receives;
  receives.reserve(static_cast<std::size_t>(2 * servers));
  for (int s = 0; s < servers; ++s) {
    const Range shard = layout_.shard(s);
    receives.push_back(comm_.irecv(ps::writable_bytes_of(versions_[static_cast<std::size_t>(s)]),
                                   layout_.server_rank(s), ps::kTagPullVersion));
    receives.push_back(
        comm_.irecv(std::as_writable_bytes(parameters.subspan(shard.begin, shard.size())),
                    layout_.server_rank(s), ps::kTagPullPayload));
  }
  RequestHeader header;
  header.kind = static_cast<std::uint32_t>(RequestKind::kPull);
  header.clock = clock_;
  std::vector<Request> sends;
  for (int s = 0; s < servers; ++s) {
    sends.push_back(comm_.isend(ps::bytes_of(header), layout_.server_rank(s), ps::kTagRequest));
  }
  wait_all(sends);
  wait_all(receives);
  ++log_.pulls;
  log_.bytes_pulled += parameters.size_bytes() +
                       static_cast<std::size_t>(servers) * (sizeof(std::int64_t) + sizeof(header));
}

PushReport PsWorker::push(std::span<const float> gradient, double learning_rate, double epoch) {
  if (finished_) throw Error(fmt::format("[ps] worker {}: push() after finish()", worker_));
  if (!in_step_) {
    throw Error(
        fmt::format("[ps] worker {}: push() at clock {} without begin_step(); call "
                    "begin_step() before each step",
                    worker_, clock_));
  }
  if (gradient.size() != layout_.numel()) {
    throw InvalidArgument(fmt::format("[ps] worker {}: push() of {} floats, the model has {}",
                                      worker_, gradient.size(), layout_.numel()));
  }
  if (!all_finite(gradient)) {
    throw NonFiniteGradient(
        fmt::format("[ps] worker {}: step {}: non-finite gradient (NaN or inf)", worker_, clock_));
  }
  const int servers = layout_.servers();
  const auto n_servers = static_cast<std::size_t>(servers);
  PushReport report;
  report.step = clock_;
  report.target = layout_.numel();

  // One payload per server, as bytes.
  std::vector<std::span<const std::byte>> payloads(n_servers);
  std::vector<std::size_t> counts(n_servers, 0);
  std::vector<double> sums(n_servers, 0.0);
  Stopwatch watch;
  if (!sparse_) {
    for (int s = 0; s < servers; ++s) {
      const Range shard = layout_.shard(s);
      const auto slice = gradient.subspan(shard.begin, shard.size());
      payloads[static_cast<std::size_t>(s)] = std::as_bytes(slice);
      counts[static_cast<std::size_t>(s)] = slice.size();
      double sum = 0.0;
      for (const float v : slice) sum += v;
      sums[static_cast<std::size_t>(s)] = sum;
    }
  } else {
    Sparse& sp = *sparse_;
    StepContext ctx;
    ctx.step = clock_;
    ctx.epoch = epoch;
    ctx.rank = worker_;
    ctx.world = layout_.workers();
    ctx.layers = options_.layers;
    report.target = sp.parts.sparsifier->target(gradient.size(), ctx);
    sp.parts.memory->accumulate(gradient);
    const std::span<float> accumulated = sp.parts.memory->accumulated();
    sp.parts.sparsifier->select(accumulated, ctx, sp.view, sp.selection);
    const SparseSelection& sel = sp.selection;
    if (!sel.known.empty()) {
      throw NotSupported(
          fmt::format("[ps] scheme '{}' selected implicit ranges, which PS mode "
                      "cannot send",
                      options_.push));
    }
    // Split the ascending selection by shard.
    std::size_t pos = 0;
    for (int s = 0; s < servers; ++s) {
      const Range shard = layout_.shard(s);
      const auto end = static_cast<std::size_t>(
          std::lower_bound(sel.indices.begin() + static_cast<std::ptrdiff_t>(pos),
                           sel.indices.end(), static_cast<Index>(shard.end)) -
          sel.indices.begin());
      const std::size_t n = end - pos;
      auto& words = sp.payloads[static_cast<std::size_t>(s)];
      words.resize(2 * n);
      double sum = 0.0;
      for (std::size_t j = 0; j < n; ++j) {
        words[j] = static_cast<std::uint32_t>(sel.indices[pos + j] - shard.begin);
        sum += sel.values[pos + j];
      }
      if (n > 0) std::memcpy(words.data() + n, sel.values.data() + pos, n * sizeof(float));
      payloads[static_cast<std::size_t>(s)] = std::as_bytes(std::span<const std::uint32_t>(words));
      counts[static_cast<std::size_t>(s)] = n;
      sums[static_cast<std::size_t>(s)] = sum;
      pos = end;
    }
    // Error feedback: what was sent leaves the residual (exactly: fp32 values).
    for (std::size_t j = 0; j < sel.size(); ++j) accumulated[sel.indices[j]] -= sel.values[j];
    sp.parts.memory->after_exchange(std::span<const Index>(sel.indices.data(), sel.size()));
    const std::size_t own = sel.size();
    const ExchangeOutcome outcome{std::span<const std::size_t>(&own, 1), own, report.target};
    sp.parts.sparsifier->observe(outcome, ctx);
    report.residual_norm = sp.parts.memory->residual_norm();
  }
  report.select_s = watch.seconds();

  watch.restart();
  std::vector<RequestHeader> headers(n_servers);
  std::vector<Request> sends;
  sends.reserve(2 * n_servers);
  for (int s = 0; s < servers; ++s) {
    const auto i = static_cast<std::size_t>(s);
    RequestHeader& header = headers[i];
    header.kind = static_cast<std::uint32_t>(RequestKind::kPush);
    header.sparse = sparse_ ? 1 : 0;
    header.clock = clock_;
    header.count = counts[i];
    header.pulled_version = versions_[i];
    header.learning_rate = learning_rate;
    sends.push_back(comm_.isend(ps::bytes_of(header), layout_.server_rank(s), ps::kTagRequest));
    if (counts[i] > 0) {
      sends.push_back(comm_.isend(payloads[i], layout_.server_rank(s), ps::kTagPushPayload));
    }
    SentToServer& sent = log_.sent[i];
    ++sent.pushes;
    sent.values += counts[i];
    sent.value_sum += sums[i];
    sent.fingerprint += ps::push_fingerprint(worker_, clock_, payloads[i]);
    report.values += counts[i];
    report.bytes_sent += sizeof(RequestHeader) + payloads[i].size();
  }
  wait_all(sends);
  report.send_s = watch.seconds();
  log_.bytes_pushed += report.bytes_sent;
  ++clock_;
  in_step_ = false;
  return report;
}

void PsWorker::finish() {
  if (finished_) return;
  finished_ = true;
  RequestHeader header;
  header.kind = static_cast<std::uint32_t>(RequestKind::kDone);
  header.clock = clock_;
  std::vector<Request> sends;
  for (int s = 0; s < layout_.servers(); ++s) {
    sends.push_back(comm_.isend(ps::bytes_of(header), layout_.server_rank(s), ps::kTagRequest));
  }
  wait_all(sends);
}

}  // namespace sparsecomm
