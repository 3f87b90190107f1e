#include "sparsecomm/collectives/allreduce.h"

#include <algorithm>
#include <array>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/collectives/ring.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"

// The segmented ring all-reduce
// =============================
//
// The buffer of numel elements is cut into n contiguous chunks (chunk_begin),
// one per rank. Ranks form a ring: rank r only ever sends to r+1 and receives
// from r-1, so every link carries the same load and the bandwidth term is
// independent of n.
//
// Reduce-scatter (n-1 steps): at step j rank r sends chunk r-j to r+1 and
// receives chunk r-j-1 from r-1, adding it to its own copy. A chunk thus
// travels n-1 hops, picking up one contribution per hop; after the last step
// rank r holds the complete sum of chunk r+1 (its "owned" chunk).
//
// Allgather (n-1 steps): at step j rank r sends chunk r+1-j and receives
// chunk r-j, overwriting its copy. After n-1 steps every rank has every
// reduced chunk. Each rank sends and receives 2(n-1)/n of the buffer.
//
// Segments: a chunk does not travel as one message but in segments of at most
// segment_bytes. Two receives are in flight: the next segment arrives into
// one scratch buffer while the previous one is added into the data from the
// other, so the reduction hides behind the transfer and the scratch memory
// is two segments, not a chunk. As soon as a segment is reduced it is
// forwarded (it is part of the chunk the next step sends), so consecutive
// steps overlap instead of waiting for whole chunks. Sends never block the
// loop: they are polled and only waited for at the end of a phase (the
// allgather overwrites chunks that reduce-scatter sends read).
//
// Skip-Reduce reuses this ring (see ring.h): it starts the reduce-scatter at
// step s instead of 0 and rotates the chunk-to-rank mapping by q, so chunk c
// sums only the n-s ranks that precede its owner.
//
// Empty chunks (numel < n) still travel as one zero-byte message, so both
// ends of every link always exchange the same number of messages.

namespace sparsecomm {

AllreduceAlgorithm parse_allreduce_algorithm(std::string_view name) {
  if (name == "ring") return AllreduceAlgorithm::kRing;
  if (name == "recursive-doubling") return AllreduceAlgorithm::kRecursiveDoubling;
  if (name == "native") return AllreduceAlgorithm::kNative;
  throw InvalidArgument(fmt::format(
      "[allreduce] unknown algorithm '{}' (valid: ring, recursive-doubling, native)", name));
}

std::string_view allreduce_algorithm_name(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRing:
      return "ring";
    case AllreduceAlgorithm::kRecursiveDoubling:
      return "recursive-doubling";
    case AllreduceAlgorithm::kNative:
      return "native";
  }
  return "unknown";
}

namespace detail {
namespace {

// Segments in flight per phase (receives; see the comment at the top).
constexpr std::size_t kInFlight = 2;

// dst[i] += src[i]; a plain indexed loop the compiler vectorizes.
template <class T>
void add_into(T* __restrict dst, const T* __restrict src, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dst[i] += src[i];
}

template <class T>
void scale_in_place(std::span<T> values, float factor) {
  if constexpr (std::is_floating_point_v<T>) {
    T* __restrict p = values.data();
    const T f = static_cast<T>(factor);
    for (std::size_t i = 0; i < values.size(); ++i) p[i] *= f;
  }
}

// Per-thread buffers reused across calls: the scratch segments and the queue
// of pending sends only grow, so steady-state calls allocate nothing here.
template <class T>
std::vector<T>& scratch_storage() {
  thread_local std::vector<T> storage;
  return storage;
}
std::vector<Request>& send_queue_storage() {
  thread_local std::vector<Request> storage;
  return storage;
}
// A 16-bit wire: the 16-bit form of the whole buffer, and the scratch
// segments the reduce-scatter receives into.
std::vector<std::uint16_t>& wire_storage() {
  thread_local std::vector<std::uint16_t> storage;
  return storage;
}
std::vector<std::uint16_t>& half_slot_storage() {
  thread_local std::vector<std::uint16_t> storage;
  return storage;
}

// Sends in flight, retired in order: polled while the loop runs, waited for
// only at the end of a phase.
class SendQueue {
 public:
  explicit SendQueue(std::vector<Request>& storage) : queue_(storage) { queue_.clear(); }
  // On an error, drops what is still pending (the backend withdraws it).
  ~SendQueue() { queue_.clear(); }
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;
  void push(Request request) { queue_.push_back(std::move(request)); }
  void poll() {
    while (head_ < queue_.size() && queue_[head_].test()) queue_[head_++] = Request();
  }
  void wait_all() {
    for (; head_ < queue_.size(); ++head_) queue_[head_].wait();
    queue_.clear();
    head_ = 0;
  }

 private:
  std::vector<Request>& queue_;
  std::size_t head_ = 0;
};

// Rethrows the current CommError with `context` prepended, keeping its type.
[[noreturn]] void rethrow_with_context(const std::string& context) {
  try {
    throw;
  } catch (const PeerFailure& e) {
    throw PeerFailure(context + e.what());
  } catch (const TimeoutError& e) {
    throw TimeoutError(context + e.what());
  } catch (const CommError& e) {
    throw CommError(context + e.what());
  }
}

template <class T>
class Ring {
 public:
  Ring(Communicator& comm, std::span<T> data, const RingOptions& options)
      : comm_(comm),
        data_(data),
        options_(options),
        n_(comm.size()),
        rank_(comm.rank()),
        next_((rank_ + 1) % n_),
        prev_((rank_ - 1 + n_) % n_),
        segment_(std::max<std::size_t>(1, options.segment_bytes / sizeof(T))),
        half_(options.wire != ValueEncoding::kFloat32),
        sends_(send_queue_storage()) {
    if (half_) {
      std::vector<std::uint16_t>& storage = wire_storage();
      if (storage.size() < data.size()) storage.resize(data.size());
      wire_ = std::span<std::uint16_t>(storage).first(data.size());
    }
  }

  void run(AllreduceReport& report) {
    const int last = n_ - 2;
    report.reduce_scatter_steps = std::max(0, last - options_.first_step + 1);
    report.allgather_steps = std::max(0, n_ - 1);
    try {
      Stopwatch watch;
      phase_ = "reduce-scatter";
      reduce_scatter();
      const std::span<T> owned = chunk(owned_chunk(rank_, options_.rotation, n_));
      if (options_.owner_scale != 1.0f) scale_in_place(owned, options_.owner_scale);
      // A 16-bit wire: the owner rounds its sum once, as every rank will see it.
      if (half_) {
        encode(owned);
        decode(owned);
      }
      report.reduce_scatter_s = watch.seconds();
      watch.restart();
      phase_ = "allgather";
      allgather();
      report.allgather_s = watch.seconds();
    } catch (const CommError&) {
      rethrow_with_context(
          fmt::format("[{}] rank {}: {} step {}: ", options_.component, rank_, phase_, step_));
    }
    report.bytes_sent = bytes_sent_;
    report.bytes_received = bytes_received_;
  }

 private:
  // Position in a phase's stream of received segments: (step, segment).
  struct Cursor {
    int step = 0;
    std::size_t segment = 0;
    std::size_t index = 0;  // position in the stream; picks the slot
  };

  std::span<T> chunk(int c) const {
    const std::size_t begin = chunk_begin(data_.size(), n_, c);
    return data_.subspan(begin, chunk_begin(data_.size(), n_, c + 1) - begin);
  }
  // An empty chunk still has one (empty) segment.
  std::size_t segments(std::span<T> c) const {
    return c.empty() ? 1 : (c.size() + segment_ - 1) / segment_;
  }
  std::span<T> segment(std::span<T> c, std::size_t k) const {
    const std::size_t begin = k * segment_;
    return c.subspan(begin, std::min(segment_, c.size() - begin));
  }

  // 16-bit wire: the positions of `values` in wire_.
  std::span<std::uint16_t> wire_of(std::span<T> values) const {
    return wire_.subspan(static_cast<std::size_t>(values.data() - data_.data()), values.size());
  }
  void encode(std::span<T> values) {
    if constexpr (std::is_same_v<T, float>) {
      const std::span<std::uint16_t> out = wire_of(values);
      const bool fp16 = options_.wire == ValueEncoding::kFloat16;
      for (std::size_t i = 0; i < values.size(); ++i) {
        out[i] = fp16 ? float_to_fp16(values[i]) : float_to_bf16(values[i]);
      }
    }
  }
  void decode(std::span<T> values) const {
    if constexpr (std::is_same_v<T, float>) {
      const std::span<const std::uint16_t> in = wire_of(values);
      const bool fp16 = options_.wire == ValueEncoding::kFloat16;
      for (std::size_t i = 0; i < values.size(); ++i) {
        values[i] = fp16 ? fp16_to_float(in[i]) : bf16_to_float(in[i]);
      }
    }
  }
  float decode_one(std::uint16_t bits) const {
    return options_.wire == ValueEncoding::kFloat16 ? fp16_to_float(bits) : bf16_to_float(bits);
  }

  // Sends `values`: as they are, or on a 16-bit wire their 16-bit form,
  // encoded now unless `encoded` (it is already in wire_).
  void send(std::span<T> values, int tag, bool encoded = false) {
    if (!half_) {
      sends_.push(comm_.isend(bytes_of(std::span<const T>(values)), next_, tag));
      bytes_sent_ += values.size_bytes();
      return;
    }
    if (!encoded) encode(values);
    const std::span<std::uint16_t> wire = wire_of(values);
    sends_.push(comm_.isend(bytes_of(std::span<const std::uint16_t>(wire)), next_, tag));
    bytes_sent_ += wire.size_bytes();
  }
  void send_chunk(std::span<T> c, int tag, bool encoded = false) {
    for (std::size_t k = 0, count = segments(c); k < count; ++k) send(segment(c, k), tag, encoded);
  }

  // Moves `cursor` to the next segment of the stream whose step-j chunk is
  // recv_chunk(j).
  template <class RecvChunk>
  void advance(Cursor& cursor, RecvChunk recv_chunk) const {
    ++cursor.index;
    if (++cursor.segment == segments(chunk(recv_chunk(cursor.step)))) {
      cursor.segment = 0;
      ++cursor.step;
    }
  }

  void reduce_scatter() {
    const int first = options_.first_step;
    const int last = n_ - 2;
    if (first > last) return;
    const int q = options_.rotation;
    const int tag = tags::kRingReduceScatter;
    auto recv_chunk = [&](int j) { return reduce_scatter_recv_chunk(rank_, j, q, n_); };

    // Two scratch slots of one segment each (smaller if every chunk is).
    const std::size_t slot_size =
        std::max<std::size_t>(1, std::min(segment_, (data_.size() + n_ - 1) / n_));
    std::vector<T>& storage = scratch_storage<T>();
    if (storage.size() < kInFlight * slot_size) storage.resize(kInFlight * slot_size);
    std::array<std::span<T>, kInFlight> slot_buffers;
    for (std::size_t i = 0; i < kInFlight; ++i) {
      slot_buffers[i] = std::span<T>(storage).subspan(i * slot_size, slot_size);
    }
    // A 16-bit wire receives into 16-bit slots.
    std::vector<std::uint16_t>& half_storage = half_slot_storage();
    if (half_ && half_storage.size() < kInFlight * slot_size) {
      half_storage.resize(kInFlight * slot_size);
    }
    auto half_slot = [&](std::size_t slot, std::size_t len) {
      return std::span<std::uint16_t>(half_storage).subspan(slot * slot_size, len);
    };
    std::array<Request, kInFlight> slots;

    Cursor posted{first, 0, 0};
    auto post_next = [&] {
      if (posted.step > last) return;
      const std::size_t len = segment(chunk(recv_chunk(posted.step)), posted.segment).size();
      const std::size_t slot = posted.index % kInFlight;
      slots[slot] = half_
                        ? comm_.irecv(writable_bytes_of(half_slot(slot, len)), prev_, tag)
                        : comm_.irecv(writable_bytes_of(slot_buffers[slot].first(len)), prev_, tag);
      advance(posted, recv_chunk);
    };

    step_ = first;
    send_chunk(chunk(reduce_scatter_send_chunk(rank_, first, q, n_)), tag);
    for (std::size_t i = 0; i < kInFlight; ++i) post_next();
    for (Cursor taken{first, 0, 0}; taken.step <= last; advance(taken, recv_chunk)) {
      step_ = taken.step;
      const std::size_t slot = taken.index % kInFlight;
      slots[slot].wait();
      const std::span<T> dst = segment(chunk(recv_chunk(taken.step)), taken.segment);
      if (half_) {
        const std::span<const std::uint16_t> got = half_slot(slot, dst.size());
        for (std::size_t i = 0; i < dst.size(); ++i) dst[i] += static_cast<T>(decode_one(got[i]));
        bytes_received_ += got.size_bytes();
      } else {
        add_into(dst.data(), slot_buffers[slot].data(), dst.size());
        bytes_received_ += dst.size_bytes();
      }
      // This segment belongs to the chunk the next step sends: forward it now.
      if (taken.step < last) send(dst, tag);
      post_next();
      sends_.poll();
    }
    sends_.wait_all();
  }

  void allgather() {
    const int last = n_ - 2;
    if (last < 0) return;
    const int q = options_.rotation;
    const int tag = tags::kRingAllgather;
    auto recv_chunk = [&](int j) { return allgather_recv_chunk(rank_, j, q, n_); };
    std::array<Request, kInFlight> slots;

    Cursor posted{0, 0, 0};
    auto post_next = [&] {
      if (posted.step > last) return;
      const std::span<T> dst = segment(chunk(recv_chunk(posted.step)), posted.segment);
      slots[posted.index % kInFlight] =
          half_ ? comm_.irecv(writable_bytes_of(wire_of(dst)), prev_, tag)
                : comm_.irecv(writable_bytes_of(dst), prev_, tag);
      advance(posted, recv_chunk);
    };

    // On a 16-bit wire every chunk of this phase is already in wire_: the
    // owned one since the owner rounded it, the others as they arrive.
    step_ = 0;
    send_chunk(chunk(allgather_send_chunk(rank_, 0, q, n_)), tag, /*encoded=*/true);
    for (std::size_t i = 0; i < kInFlight; ++i) post_next();
    for (Cursor taken{0, 0, 0}; taken.step <= last; advance(taken, recv_chunk)) {
      step_ = taken.step;
      slots[taken.index % kInFlight].wait();
      const std::span<T> got = segment(chunk(recv_chunk(taken.step)), taken.segment);
      if (half_) decode(got);
      bytes_received_ += half_ ? wire_of(got).size_bytes() : got.size_bytes();
      if (taken.step < last) send(got, tag, /*encoded=*/true);
      post_next();
      sends_.poll();
    }
    sends_.wait_all();
  }

  Communicator& comm_;
  std::span<T> data_;
  const RingOptions& options_;
  const int n_;
  const int rank_;
  const int next_;
  const int prev_;
  const std::size_t segment_;  // elements per segment
  const bool half_;            // fp16 or bf16 on the wire
  std::span<std::uint16_t> wire_;
  SendQueue sends_;
  const char* phase_ = "setup";
  int step_ = 0;
  std::uint64_t bytes_sent_ = 0;
  std::uint64_t bytes_received_ = 0;
};

}  // namespace

void ring_allreduce(Communicator& comm, std::span<float> data, const RingOptions& options,
                    AllreduceReport& report) {
  Ring<float>(comm, data, options).run(report);
}
void ring_allreduce(Communicator& comm, std::span<std::int64_t> data, const RingOptions& options,
                    AllreduceReport& report) {
  Ring<std::int64_t>(comm, data, options).run(report);
}

}  // namespace detail

namespace {

// Recursive doubling over p = the largest power of two <= n ranks. The
// first 2(n - p) ranks fold in pairwise first (even ranks send their buffer
// to the odd one above and sit out), and the odd ones send the result back
// at the end. Partners add what they receive into their own buffer, so the
// two sides of every exchange compute a + b and b + a: bitwise equal, and
// every rank ends with the same bits.
template <class T>
void recursive_doubling(Communicator& comm, std::span<T> data, AllreduceReport& report) {
  const int n = comm.size();
  const int r = comm.rank();
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int folded = n - p;  // pairs (2i, 2i+1), i < folded, fold into 2i+1
  const auto bytes = std::as_writable_bytes(data);
  std::vector<T>& incoming = detail::scratch_storage<T>();
  incoming.resize(data.size());
  const auto incoming_bytes = std::as_writable_bytes(std::span<T>(incoming));
  const auto add_incoming = [&] {
    T* __restrict out = data.data();
    const T* __restrict in = incoming.data();
    for (std::size_t i = 0; i < data.size(); ++i) out[i] += in[i];
  };
  const int tag = tags::kRecursiveDoubling;
  if (r < 2 * folded && r % 2 == 0) {
    comm.send(bytes, r + 1, tag);
    comm.recv(bytes, r + 1, tag);
    report.bytes_sent += bytes.size();
    report.bytes_received += bytes.size();
    return;
  }
  if (r < 2 * folded) {
    comm.recv(incoming_bytes, r - 1, tag);
    add_incoming();
    report.bytes_received += bytes.size();
  }
  const int virtual_rank = r < 2 * folded ? r / 2 : r - folded;
  const auto real_rank = [folded](int v) { return v < folded ? 2 * v + 1 : v + folded; };
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = real_rank(virtual_rank ^ mask);
    Request receive = comm.irecv(incoming_bytes, partner, tag);
    comm.send(bytes, partner, tag);
    receive.wait();
    add_incoming();
    report.bytes_sent += bytes.size();
    report.bytes_received += bytes.size();
  }
  if (r < 2 * folded) {
    comm.send(bytes, r - 1, tag);
    report.bytes_sent += bytes.size();
  }
}

template <class T>
void allreduce_impl(Communicator& comm, std::span<T> data, const AllreduceOptions& options,
                    AllreduceReport* report) {
  if (options.segment_bytes == 0) {
    throw InvalidArgument(fmt::format("[ring] rank {}: segment_bytes must be > 0", comm.rank()));
  }
  if (options.wire != ValueEncoding::kFloat32) {
    const bool half =
        options.wire == ValueEncoding::kFloat16 || options.wire == ValueEncoding::kBFloat16;
    if (!half || !std::is_same_v<T, float> || options.algorithm != AllreduceAlgorithm::kRing) {
      throw InvalidArgument(fmt::format(
          "[allreduce] values on the wire as {} need float data and the ring; the all-reduce "
          "sends fp32, fp16 or bf16",
          value_encoding_name(options.wire)));
    }
  }
  Stopwatch total;
  AllreduceReport local;
  if (comm.size() > 1) {
    switch (options.algorithm) {
      case AllreduceAlgorithm::kNative:
        comm.native_allreduce(data);
        break;
      case AllreduceAlgorithm::kRecursiveDoubling:
        recursive_doubling(comm, data, local);
        break;
      case AllreduceAlgorithm::kRing: {
        detail::RingOptions ring;
        ring.segment_bytes = options.segment_bytes;
        ring.wire = options.wire;
        detail::ring_allreduce(comm, data, ring, local);
        break;
      }
    }
  }
  local.total_s = total.seconds();
  if (report != nullptr) *report = local;
}

}  // namespace

void allreduce(Communicator& comm, std::span<float> data, const AllreduceOptions& options,
               AllreduceReport* report) {
  allreduce_impl(comm, data, options, report);
}

void allreduce(Communicator& comm, std::span<std::int64_t> data, const AllreduceOptions& options,
               AllreduceReport* report) {
  allreduce_impl(comm, data, options, report);
}

}  // namespace sparsecomm
