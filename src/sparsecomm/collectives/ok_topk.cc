// Ok-Topk's balanced sparse all-reduce (Li and Hoefler, PPoPP'22), the
// kOkTopk pattern (see sparse_exchange.h for the contract and
// docs/algorithms/exchange-patterns.md, "Ok-Topk" for the costs):
//
//   1. regions: [0, d) is cut into n regions, region j owned by rank j, so
//      that each holds about 1/n of this step's selected entries: a
//      histogram of every rank's indices over 8n equal bins, summed over the
//      ranks (an all-reduce of 8n integers), cut at bin edges
//   2. sparse reduce-scatter: each rank sends each owner its (index, value)
//      pairs in the owner's region (alltoallv); the owner sums them in rank
//      order
//   3. global selection: the owners all-gather the size of their sums'
//      support K_j; owner j keeps the ceil(m K_j / K) entries of largest
//      |sum| (m: the ranks' mean count, so about as many entries survive as
//      one rank selected; ties to the lower index)
//   4. allgatherv of every owner's survivors (index, sum): the average, the
//      same on every rank
//   5. each rank's residual gives up exactly its own values at the
//      survivors; what did not survive stays in it
//
// Every rank sends and receives O(m) pairs however many ranks there are (the
// allgather's grow with n m). Values travel as fp32 and indices raw (4
// bytes); known ranges (DEFT's whole pieces) are refused.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/collectives/allreduce.h"
#include "sparsecomm/collectives/exchange_internal.h"

namespace sparsecomm::detail {
namespace {

// One entry on the wire: an index and a float, 8 bytes.
struct Pair {
  Index index;
  float value;
};
static_assert(sizeof(Pair) == 8);

class OkTopk final : public SparseExchange {
 public:
  explicit OkTopk(const ExchangeOptions& options)
      : SparseExchange(ExchangePattern::kOkTopk, options) {
    if (options.values != ValueEncoding::kFloat32) {
      throw InvalidArgument(fmt::format(
          "[exchange] ok-topk sums its values at the regions' owners and sends them as fp32, not "
          "{}; use values=fp32, or exchange=allgather or union for quantized values",
          value_encoding_name(options.values)));
    }
  }

 private:
  void run(Communicator& comm, const Input& input, std::span<float> accumulated,
           std::span<float> out, ExchangeResult& result) override {
    if (!input.known.empty()) {
      throw InvalidArgument(where(comm) +
                            "ok-topk takes no known ranges (DEFT's whole pieces): use "
                            "exchange=union or allgather");
    }
    const std::span<const Index> selected = input.selected;
    const std::size_t numel = accumulated.size();
    gather_headers(comm, selected.size(), 0, numel, wire_, result);

    cut_regions(comm, selected, numel, result);
    reduce_scatter(comm, selected, accumulated, result);
    keep_largest(comm, result);
    gather_survivors(comm, out, result);

    // What survived of this rank's own selection leaves its residual.
    transmitted_.clear();
    std::size_t s = 0;
    for (const Index i : selected) {
      while (s < survivors_.size() && survivors_[s] < i) ++s;
      if (s < survivors_.size() && survivors_[s] == i) {
        accumulated[i] = 0.0f;  // a - a: it sent its whole value there
        transmitted_.push_back(i);
      }
    }
    result.union_size = survivors_.size();
    result.transmitted = transmitted_;
    result.index_bytes_raw = result.index_bytes_encoded = sizeof(Index) * selected.size();
  }

  // Region j = [bounds_[j], bounds_[j + 1]).
  void cut_regions(Communicator& comm, std::span<const Index> selected, std::size_t numel,
                   ExchangeResult& result) {
    const auto n = static_cast<std::size_t>(comm.size());
    const std::size_t bins = std::min<std::size_t>(8 * n, std::max<std::size_t>(numel, 1));
    const auto bin_of = [&](Index i) { return static_cast<std::size_t>(i) * bins / numel; };
    histogram_.assign(bins, 0);
    for (const Index i : selected) ++histogram_[bin_of(i)];
    AllreduceReport report;
    allreduce(comm, std::span<std::int64_t>(histogram_), {}, &report);
    result.bytes_sent += report.bytes_sent;
    result.bytes_received += report.bytes_received;
    const std::int64_t total =
        std::accumulate(histogram_.begin(), histogram_.end(), std::int64_t{0});
    bounds_.assign(n + 1, numel);
    bounds_[0] = 0;
    std::int64_t below = 0;
    std::size_t bin = 0;
    for (std::size_t j = 1; j < n; ++j) {
      // The first bin edge with at least j/n of the entries below it; the
      // even cut of d when nothing was selected.
      if (total == 0) {
        bounds_[j] = j * numel / n;
        continue;
      }
      const auto want = static_cast<std::int64_t>(
          std::ceil(static_cast<double>(total) * static_cast<double>(j) / static_cast<double>(n)));
      while (bin < bins && below < want) below += histogram_[bin++];
      bounds_[j] = std::max(bounds_[j - 1], (bin * numel + bins - 1) / bins);
    }
  }

  // Pairs of each region to its owner; the owner's sums at sums_ (sorted
  // by index).
  void reduce_scatter(Communicator& comm, std::span<const Index> selected,
                      std::span<const float> accumulated, ExchangeResult& result) {
    const auto n = static_cast<std::size_t>(comm.size());
    send_.clear();
    send_counts_.assign(n, 0);
    std::size_t owner = 0;
    for (const Index i : selected) {
      while (i >= bounds_[owner + 1]) ++owner;
      send_.push_back(Pair{i, accumulated[i]});
      send_counts_[owner] += sizeof(Pair);
    }
    // Each owner first learns how many bytes each rank sends it.
    sizes_in_.assign(n, 0);
    one_word_.assign(n, sizeof(std::uint64_t));
    sizes_out_.assign(send_counts_.begin(), send_counts_.end());
    comm.alltoallv(std::as_bytes(std::span<const std::uint64_t>(sizes_out_)), one_word_,
                   std::as_writable_bytes(std::span<std::uint64_t>(sizes_in_)), one_word_);
    recv_counts_.assign(sizes_in_.begin(), sizes_in_.end());
    const std::size_t incoming =
        std::accumulate(recv_counts_.begin(), recv_counts_.end(), std::size_t{0});
    recv_.resize(incoming / sizeof(Pair));
    comm.alltoallv(std::as_bytes(std::span<const Pair>(send_)), send_counts_,
                   std::as_writable_bytes(std::span<Pair>(recv_)), recv_counts_);
    const auto r = static_cast<std::size_t>(comm.rank());
    for (std::size_t q = 0; q < n; ++q) {
      if (q == r) continue;
      result.bytes_sent += send_counts_[q] + sizeof(std::uint64_t);
      result.bytes_received += recv_counts_[q] + sizeof(std::uint64_t);
    }

    // Sum in rank order into the region's dense scratch.
    const std::size_t begin = bounds_[r];
    region_.assign(bounds_[r + 1] - begin, 0.0f);
    touched_.assign(region_.size(), 0);
    support_.clear();
    for (const Pair& pair : recv_) {
      if (pair.index < begin || pair.index >= bounds_[r + 1]) {
        throw CommError(where(comm) + fmt::format("ok-topk: index {} arrived outside this rank's "
                                                  "region [{}, {})",
                                                  pair.index, begin, bounds_[r + 1]));
      }
      const std::size_t at = pair.index - begin;
      if (touched_[at] == 0) {
        touched_[at] = 1;
        support_.push_back(pair.index);
      }
      region_[at] += pair.value;
    }
    std::sort(support_.begin(), support_.end());
  }

  // Owner's survivors: the ceil(m K_j / K) entries of largest |sum|.
  void keep_largest(Communicator& comm, ExchangeResult& result) {
    const auto n = static_cast<std::size_t>(comm.size());
    const std::uint64_t mine = support_.size();
    supports_.assign(n, 0);
    comm.allgather(std::as_bytes(std::span<const std::uint64_t>(&mine, 1)),
                   std::as_writable_bytes(std::span<std::uint64_t>(supports_)));
    count_allgatherv(comm, one_word_, result);
    const double union_total = std::accumulate(supports_.begin(), supports_.end(), 0.0);
    const double mean_count =
        std::accumulate(result.counts.begin(), result.counts.end(), 0.0) / static_cast<double>(n);
    const auto keep = static_cast<std::size_t>(
        union_total == 0 ? 0.0 : std::ceil(mean_count * static_cast<double>(mine) / union_total));
    const std::size_t begin = bounds_[static_cast<std::size_t>(comm.rank())];
    kept_ = support_;
    if (keep < kept_.size()) {
      const auto larger = [&](Index a, Index b) {
        const float x = std::abs(region_[a - begin]);
        const float y = std::abs(region_[b - begin]);
        return x > y || (x == y && a < b);
      };
      std::nth_element(kept_.begin(), kept_.begin() + static_cast<std::ptrdiff_t>(keep),
                       kept_.end(), larger);
      kept_.resize(keep);
      std::sort(kept_.begin(), kept_.end());
    }
    own_pairs_.clear();
    for (const Index i : kept_) own_pairs_.push_back(Pair{i, region_[i - begin]});
  }

  // Every owner's survivors to every rank, in region order: out = sum / n.
  void gather_survivors(Communicator& comm, std::span<float> out, ExchangeResult& result) {
    const auto n = static_cast<std::size_t>(comm.size());
    const std::uint64_t mine = own_pairs_.size() * sizeof(Pair);
    sizes_in_.assign(n, 0);  // reused: every owner's survivor bytes
    comm.allgather(std::as_bytes(std::span<const std::uint64_t>(&mine, 1)),
                   std::as_writable_bytes(std::span<std::uint64_t>(sizes_in_)));
    count_allgatherv(comm, one_word_, result);
    block_bytes_.assign(sizes_in_.begin(), sizes_in_.end());
    all_pairs_.resize(std::accumulate(block_bytes_.begin(), block_bytes_.end(), std::size_t{0}) /
                      sizeof(Pair));
    comm.allgatherv(std::as_bytes(std::span<const Pair>(own_pairs_)),
                    std::as_writable_bytes(std::span<Pair>(all_pairs_)), block_bytes_);
    count_allgatherv(comm, block_bytes_, result);
    std::fill(out.begin(), out.end(), 0.0f);
    survivors_.clear();
    const auto divisor = static_cast<float>(n);
    for (const Pair& pair : all_pairs_) {
      if (pair.index >= out.size() || (!survivors_.empty() && pair.index <= survivors_.back())) {
        throw CommError(where(comm) + fmt::format("ok-topk: the survivors' index {} is out of "
                                                  "order or past d = {}",
                                                  pair.index, out.size()));
      }
      out[pair.index] = pair.value / divisor;
      survivors_.push_back(pair.index);
    }
  }

  WireBuffers wire_;
  std::vector<std::int64_t> histogram_;
  std::vector<std::size_t> bounds_;  // n + 1 region edges
  std::vector<Pair> send_;
  std::vector<std::size_t> send_counts_;
  std::vector<std::size_t> one_word_;     // n x 8 bytes: the small collectives' blocks
  std::vector<std::uint64_t> sizes_out_;  // bytes to each owner, as words
  std::vector<std::uint64_t> sizes_in_;   // bytes from each rank (then: each owner's survivors)
  std::vector<std::size_t> recv_counts_;
  std::vector<Pair> recv_;
  std::vector<float> region_;            // this rank's region, summed
  std::vector<std::uint8_t> touched_;    // per element of the region
  std::vector<Index> support_;           // touched elements, ascending
  std::vector<std::uint64_t> supports_;  // every owner's support size
  std::vector<Index> kept_;              // this owner's survivors
  std::vector<Pair> own_pairs_;
  std::vector<std::size_t> block_bytes_;
  std::vector<Pair> all_pairs_;
  std::vector<Index> survivors_;    // every owner's, ascending
  std::vector<Index> transmitted_;  // this rank's selection among them
};

}  // namespace

std::unique_ptr<SparseExchange> make_ok_topk(const ExchangeOptions& options) {
  return std::make_unique<OkTopk>(options);
}

}  // namespace sparsecomm::detail
