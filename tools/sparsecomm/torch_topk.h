#pragma once
// The torch::topk baseline of the selection benchmarks. Only torch_topk.cc
// includes LibTorch for it; keep every torch header out of this file, so
// the benchmark files that include it compile without LibTorch.

#include <cstddef>
#include <span>

namespace sparsecomm::cli {

struct TorchTopkTiming {
  double median_ms = 0.0;    // median over the timed runs
  float kth_largest = 0.0f;  // the smallest of the k values returned (for verification)
};

// Times torch::topk(x, k) (largest, unsorted output) on LibTorch's CPU
// backend with one intra-op thread (torch::set_num_threads(1)): one untimed
// warm-up run, then `runs` timed runs. x is wrapped without a copy and only
// read. Requires 1 <= k <= x.size() and runs >= 1.
TorchTopkTiming time_torch_topk(std::span<const float> x, std::size_t k, int runs);

}  // namespace sparsecomm::cli
