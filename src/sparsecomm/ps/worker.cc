// PsWorker: the worker side of the protocol in parameter_server.h.

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/collectives/sparse_exchange.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/ps/parameter_server.h"
#include "sparsecomm/ps/protocol.h"
#include "sparsecomm/sparsify/kernels/estimate.h"
#include "sparsecomm/sync/sparsify_sequence.h"

namespace sparsecomm {
// In a named namespace: PsWorker::Sparse holds one.
namespace ps {

// The worker group as the sparsifier sees it: rank = worker index, size = W.
// Workers are the world ranks [0, W) (layout.h), so a group rank is its
// world rank and point-to-point forwards to the world communicator
// unchanged, for peers < W only. The collectives are the Communicator
// defaults built on that point-to-point (no native ones), on the reserved
// collective tags of communicator.h, all below the protocol's reserved tags
// 30100..30104 (asserted below), so they cannot collide; a scheme's own
// point-to-point may not use the protocol's tags either (checked). Besides, protocol
// messages only ever travel between a worker and a server, group messages
// only between workers. Only the partition-based schemes (BSP) communicate
// here; per-worker schemes never do.
class WorkerGroupView final : public Communicator {
 public:
  WorkerGroupView(Communicator& world, int workers) : world_(world), workers_(workers) {
    set_timeout(world.timeout());
  }
  int rank() const override { return world_.rank(); }
  int size() const override { return workers_; }
  std::string_view backend() const override { return world_.backend(); }
  Request isend(std::span<const std::byte> data, int dst, int tag) override {
    check(dst, tag, "isend");
    return world_.isend(data, dst, tag);
  }
  Request irecv(std::span<std::byte> data, int src, int tag) override {
    check(src, tag, "irecv");
    return world_.irecv(data, src, tag);
  }

 private:
  void check(int peer, int tag, std::string_view op) const {
    check_peer_and_tag(peer, tag, op);  // 0 <= peer < W
    if (tag >= ps::kTagRequest && tag <= ps::kTagGrant) {
      throw InvalidArgument(
          where() + fmt::format("{}: tag {} among the workers is one of the parameter-server "
                                "protocol's tags ({}..{}); use another tag",
                                op, tag, ps::kTagRequest, ps::kTagGrant));
    }
  }
  Communicator& world_;
  int workers_;
};

}  // namespace ps

namespace {

using ps::RequestHeader;
using ps::RequestKind;

// The protocol's tags are reserved (no user code meets them) and lie above
// every collective tag, so the group's collectives never match a protocol
// message.
static_assert(ps::kTagRequest > kMaxUserTag && ps::kTagGrant <= kMaxTag);
static_assert(tags::kBarrier < ps::kTagRequest && tags::kBroadcast < ps::kTagRequest &&
              tags::kAllgather < ps::kTagRequest && tags::kAlltoall < ps::kTagRequest &&
              tags::kRingReduceScatter < ps::kTagRequest &&
              tags::kRingAllgather < ps::kTagRequest &&
              tags::kRecursiveDoubling < ps::kTagRequest &&
              tags::kSparseAllreduceHeader < ps::kTagRequest &&
              tags::kSparseAllreducePayload < ps::kTagRequest);

void wait_all(std::vector<Request>& requests) {
  for (Request& request : requests) request.wait();
  requests.clear();
}

}  // namespace

struct PsWorker::Sparse {
  Sparse(Communicator& comm, const ServerLayout& layout, const PsOptions& options)
      : sequence(make_scheme(options.push, options.scheme_options),
                 fmt::format("[ps] worker {}", comm.rank())),
        view(comm, layout.workers()),
        gather_counts(ps_push_is_partition_based(options.push)),
        gathered(static_cast<std::size_t>(layout.workers()), 0),
        payloads(static_cast<std::size_t>(layout.servers())) {}

  SparsifySequence sequence;
  ps::WorkerGroupView view;
  // Partition-based (BSP only): all-gather counts and indices each step.
  bool gather_counts = false;
  std::vector<std::size_t> index_byte_counts;  // partition-based: per worker
  std::vector<Index> all_indices;              // partition-based: every worker's indices, merged
  SparseSelection union_selection;             // partition-based: own values at all_indices
  std::vector<std::uint64_t> gathered;         // per worker: selected count
  std::vector<std::size_t> counts;             // per worker (or only this one's)
  std::vector<std::vector<std::uint32_t>> payloads;  // per server: indices, then value bits

  // Partition-based schemes: every worker's counts and indices, all-gathered
  // and merged; returns this worker's accumulated values at their union.
  // `index_bytes_to_workers`: the index bytes this worker sent.
  const SparseSelection& gather_union(const SparseSelection& sel,
                                      std::span<const float> accumulated,
                                      std::size_t& index_bytes_to_workers) {
    const std::uint64_t own = sel.size();
    view.allgather(ps::object_bytes(own),
                   std::as_writable_bytes(std::span<std::uint64_t>(gathered)));
    counts.assign(gathered.begin(), gathered.end());
    // As in the union all-reduce, every worker sends its own accumulated
    // values at the union of all workers' indices (the servers sum them),
    // not only at its own: all-gather the indices, merge them.
    std::vector<std::size_t>& byte_counts = index_byte_counts;
    byte_counts.resize(counts.size());
    std::size_t total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      byte_counts[r] = counts[r] * sizeof(Index);
      total += counts[r];
    }
    all_indices.resize(total);
    view.allgatherv(std::as_bytes(std::span<const Index>(sel.indices.data(), sel.size())),
                    std::as_writable_bytes(std::span<Index>(all_indices)), byte_counts);
    index_bytes_to_workers = sel.size() * sizeof(Index) * (counts.size() - 1);
    std::sort(all_indices.begin(), all_indices.end());
    all_indices.erase(std::unique(all_indices.begin(), all_indices.end()), all_indices.end());
    union_selection.clear();
    union_selection.indices.resize(all_indices.size());
    union_selection.values.resize(all_indices.size());
    for (std::size_t j = 0; j < all_indices.size(); ++j) {
      union_selection.indices[j] = all_indices[j];
      union_selection.values[j] = accumulated[all_indices[j]];
    }
    union_selection.known = sel.known;
    return union_selection;
  }
};

// push()'s payload per server: its bytes, values and their sum (the log's).
struct PsWorker::Payloads {
  explicit Payloads(std::size_t servers) : bytes(servers), counts(servers, 0), sums(servers, 0.0) {}
  std::vector<std::span<const std::byte>> bytes;
  std::vector<std::size_t> counts;
  std::vector<double> sums;
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
    sparse_ = std::make_unique<Sparse>(comm, layout_, options_);
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
        comm_.irecv(ps::writable_object_bytes(reply), layout_.controller_rank(), ps::kTagGrant);
    RequestHeader header;
    header.kind = static_cast<std::uint32_t>(RequestKind::kBegin);
    header.clock = clock_;
    comm_.send(ps::object_bytes(header), layout_.controller_rank(), ps::kTagRequest);
    grant.wait();
    granted_min_clock_ = reply.min_clock;
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
    receives.push_back(
        comm_.irecv(ps::writable_object_bytes(versions_[static_cast<std::size_t>(s)]),
                    layout_.server_rank(s), ps::kTagPullVersion));
    receives.push_back(
        comm_.irecv(std::as_writable_bytes(parameters.subspan(shard.begin, shard.size())),
                    layout_.server_rank(s), ps::kTagPullPayload));
  }
  RequestHeader header;
  header.kind = static_cast<std::uint32_t>(RequestKind::kPull);
  header.clock = clock_;
  header.count = static_cast<std::uint64_t>(granted_min_clock_);
  std::vector<Request> sends;
  for (int s = 0; s < servers; ++s) {
    sends.push_back(comm_.isend(ps::object_bytes(header), layout_.server_rank(s), ps::kTagRequest));
  }
  wait_all(sends);
  wait_all(receives);
  ++log_.pulls;
  log_.bytes_pulled += parameters.size_bytes() +
                       static_cast<std::size_t>(servers) * (sizeof(std::int64_t) + sizeof(header));
}

PushReport PsWorker::push(std::span<const float> gradient, double learning_rate, double epoch) {
  check_push(gradient);
  PushReport report;
  report.step = clock_;
  report.target = layout_.numel();
  Payloads payloads(static_cast<std::size_t>(layout_.servers()));
  Stopwatch watch;
  if (!sparse_) {
    dense_payloads(gradient, payloads, report);
  } else {
    sparse_payloads(gradient, epoch, payloads, report);
  }
  report.select_s = watch.seconds();

  watch.restart();
  send_payloads(payloads, learning_rate, report);
  report.send_s = watch.seconds();
  log_.bytes_pushed += report.bytes_sent;
  ++clock_;
  in_step_ = false;
  return report;
}

void PsWorker::check_push(std::span<const float> gradient) const {
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
}

// Dense pushes: each server's shard of the gradient, as it is.
void PsWorker::dense_payloads(std::span<const float> gradient, Payloads& payloads,
                              PushReport& report) const {
  const int servers = layout_.servers();
  report.selected = layout_.numel();
  report.union_size = layout_.numel();
  for (int s = 0; s < servers; ++s) {
    const Range shard = layout_.shard(s);
    const auto slice = gradient.subspan(shard.begin, shard.size());
    payloads.bytes[static_cast<std::size_t>(s)] = std::as_bytes(slice);
    payloads.counts[static_cast<std::size_t>(s)] = slice.size();
    double sum = 0.0;
    for (const float v : slice) sum += v;
    payloads.sums[static_cast<std::size_t>(s)] = sum;
  }
}

// Sparse pushes: the scheme's selection from the memory (for partition-based
// schemes the union over workers), split by shard as [indices][values];
// what was pushed leaves the residual.
void PsWorker::sparse_payloads(std::span<const float> gradient, double epoch, Payloads& payloads,
                               PushReport& report) {
  const int servers = layout_.servers();
  Sparse& sp = *sparse_;
  StepContext ctx;
  ctx.step = clock_;
  ctx.epoch = epoch;
  ctx.rank = worker_;
  ctx.world = layout_.workers();
  ctx.layers = options_.layers;
  report.target = sp.sequence.target(gradient.size(), ctx);
  const SparseSelection& sel = sp.sequence.select(gradient, ctx, sp.view);
  const std::span<float> accumulated = sp.sequence.accumulated();
  std::size_t known = 0;
  for (const Range& range : sel.known) known += range.size();
  // The step's shared outcome. Partition-based schemes (BSP, so every
  // worker is at this step): the union of all workers' indices (see
  // parameter_server.h); the known ranges, which every worker pushes, are
  // in the union once and in no count (as in sparse_exchange.h).
  // Per-worker schemes: no collective under any model (workers need not
  // be in step), this worker's own count only.
  std::size_t union_size = 0;
  std::size_t index_bytes_to_workers = 0;
  const SparseSelection* pushed = &sel;
  if (sp.gather_counts) {
    pushed = &sp.gather_union(sel, accumulated, index_bytes_to_workers);
    union_size = sp.all_indices.size();
  } else {
    sp.counts.assign(1, sel.size());
    union_size = sel.size();
  }
  union_size += known;
  // The pushed entries: the explicit ones and the known ranges written out:
  // in the all-reduce exchanges every rank transmits its own accumulated
  // values there with no index on the wire; a push carries every index.
  const SparseSelection& written_out = sp.sequence.written_out(*pushed);
  // Split the ascending pushed entries by shard.
  std::size_t pos = 0;
  for (int s = 0; s < servers; ++s) {
    const Range shard = layout_.shard(s);
    const auto end = static_cast<std::size_t>(
        std::lower_bound(written_out.indices.begin() + static_cast<std::ptrdiff_t>(pos),
                         written_out.indices.end(), static_cast<Index>(shard.end)) -
        written_out.indices.begin());
    const std::size_t n = end - pos;
    auto& words = sp.payloads[static_cast<std::size_t>(s)];
    words.resize(2 * n);
    double sum = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      words[j] = static_cast<std::uint32_t>(written_out.indices[pos + j] - shard.begin);
      sum += written_out.values[pos + j];
    }
    if (n > 0) std::memcpy(words.data() + n, written_out.values.data() + pos, n * sizeof(float));
    payloads.bytes[static_cast<std::size_t>(s)] =
        std::as_bytes(std::span<const std::uint32_t>(words));
    payloads.counts[static_cast<std::size_t>(s)] = n;
    payloads.sums[static_cast<std::size_t>(s)] = sum;
    pos = end;
  }
  // Error feedback: exactly what was pushed leaves the residual (fp32
  // values; a known position's residual becomes 0).
  sp.sequence.sent(written_out);
  report.selected = sel.size();
  report.union_size = union_size;
  report.bytes_to_workers = index_bytes_to_workers;
  sp.sequence.observe(sp.counts, union_size, report.target, ctx);
  report.residual_norm = sp.sequence.memory().residual_norm();
}

// One push request per server, its payload after it; the log counts them.
void PsWorker::send_payloads(const Payloads& payloads, double learning_rate, PushReport& report) {
  const int servers = layout_.servers();
  const auto n_servers = static_cast<std::size_t>(servers);
  std::vector<RequestHeader> headers(n_servers);
  std::vector<Request> sends;
  sends.reserve(2 * n_servers);
  for (int s = 0; s < servers; ++s) {
    const auto i = static_cast<std::size_t>(s);
    RequestHeader& header = headers[i];
    header.kind = static_cast<std::uint32_t>(RequestKind::kPush);
    header.sparse = sparse_ ? 1 : 0;
    header.clock = clock_;
    header.count = payloads.counts[i];
    header.pulled_version = versions_[i];
    header.learning_rate = learning_rate;
    sends.push_back(comm_.isend(ps::object_bytes(header), layout_.server_rank(s), ps::kTagRequest));
    if (payloads.counts[i] > 0) {
      sends.push_back(comm_.isend(payloads.bytes[i], layout_.server_rank(s), ps::kTagPushPayload));
    }
    SentToServer& sent = log_.sent[i];
    ++sent.pushes;
    sent.values += payloads.counts[i];
    sent.value_sum += payloads.sums[i];
    sent.fingerprint += ps::push_fingerprint(worker_, clock_, payloads.bytes[i]);
    report.values += payloads.counts[i];
    report.bytes_sent += sizeof(RequestHeader) + payloads.bytes[i].size();
  }
  wait_all(sends);
}

std::span<const float> PsWorker::residual() const {
  if (!sparse_) return {};
  return sparse_->sequence.kept();
}

void PsWorker::pause() {
  if (finished_) throw Error(fmt::format("[ps] worker {}: pause() after finish()", worker_));
  if (in_step_) {
    throw Error(
        fmt::format("[ps] worker {}: pause() inside step {}; push() it first", worker_, clock_));
  }
  RequestHeader header;
  header.kind = static_cast<std::uint32_t>(RequestKind::kPause);
  header.clock = clock_;
  std::vector<Request> sends;
  for (int s = 0; s < layout_.servers(); ++s) {
    sends.push_back(comm_.isend(ps::object_bytes(header), layout_.server_rank(s), ps::kTagRequest));
  }
  wait_all(sends);
}

void PsWorker::save(StateWriter& writer) const {
  writer.tag("ps-worker");
  writer.value<std::int32_t>(worker_);
  writer.value<std::int64_t>(clock_);
  writer.array<std::int64_t>(versions_);
  writer.value<std::int64_t>(granted_min_clock_);
  writer.value<std::int64_t>(log_.begins);
  writer.value<std::int64_t>(log_.blocked);
  writer.value<double>(log_.wait_s);
  writer.value<std::int64_t>(log_.extra_steps);
  writer.value<std::int64_t>(log_.pulls);
  writer.value<std::uint64_t>(log_.bytes_pushed);
  writer.value<std::uint64_t>(log_.bytes_pulled);
  writer.value<std::uint64_t>(log_.sent.size());
  for (const SentToServer& sent : log_.sent) {
    writer.value<std::int64_t>(sent.pushes);
    writer.value<std::uint64_t>(sent.values);
    writer.value<double>(sent.value_sum);
    writer.value<std::uint64_t>(sent.fingerprint);
  }
  writer.value<std::uint8_t>(sparse_ ? 1 : 0);
  if (sparse_) sparse_->sequence.save(writer);
}

void PsWorker::load(StateReader& reader) {
  reader.expect_tag("ps-worker");
  const auto worker = reader.value<std::int32_t>();
  if (worker != worker_) {
    throw Error(fmt::format("[ps] worker {}: the saved state is worker {}'s", worker_, worker));
  }
  clock_ = reader.value<std::int64_t>();
  reader.array_into<std::int64_t>(std::span<std::int64_t>(versions_));
  granted_min_clock_ = reader.value<std::int64_t>();
  log_.begins = reader.value<std::int64_t>();
  log_.blocked = reader.value<std::int64_t>();
  log_.wait_s = reader.value<double>();
  log_.extra_steps = reader.value<std::int64_t>();
  log_.pulls = reader.value<std::int64_t>();
  log_.bytes_pushed = reader.value<std::uint64_t>();
  log_.bytes_pulled = reader.value<std::uint64_t>();
  if (reader.value<std::uint64_t>() != log_.sent.size()) {
    throw Error(
        fmt::format("[ps] worker {}: the saved state has another number of servers", worker_));
  }
  for (SentToServer& sent : log_.sent) {
    sent.pushes = reader.value<std::int64_t>();
    sent.values = reader.value<std::uint64_t>();
    sent.value_sum = reader.value<double>();
    sent.fingerprint = reader.value<std::uint64_t>();
  }
  if ((reader.value<std::uint8_t>() != 0) != (sparse_ != nullptr)) {
    throw Error(fmt::format("[ps] worker {}: the saved state pushed {}, this run pushes {}",
                            worker_, sparse_ ? "dense gradients" : "sparse ones", options_.push));
  }
  if (sparse_) sparse_->sequence.load(reader);
}

void PsWorker::finish() {
  if (finished_) return;
  finished_ = true;
  RequestHeader header;
  header.kind = static_cast<std::uint32_t>(RequestKind::kDone);
  header.clock = clock_;
  std::vector<Request> sends;
  for (int s = 0; s < layout_.servers(); ++s) {
    sends.push_back(comm_.isend(ps::object_bytes(header), layout_.server_rank(s), ps::kTagRequest));
  }
  wait_all(sends);
}

}  // namespace sparsecomm
