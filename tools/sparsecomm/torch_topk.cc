// The torch::topk baseline of `bench sparsifiers` (see torch_topk.h).

#include "torch_topk.h"

#include <cstdint>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "cli_util.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/timer.h"

namespace sparsecomm::cli {

TorchTopkTiming time_torch_topk(std::span<const float> x, std::size_t k, int runs) {
  if (k < 1 || k > x.size() || runs < 1) {
    throw InvalidArgument(
        fmt::format("[bench] torch::topk: k = {} for {} elements and {} runs", k, x.size(), runs));
  }
  torch::set_num_threads(1);  // the baseline is single-threaded, like our kernels
  torch::NoGradGuard no_grad;
  // from_blob wants a mutable pointer; topk only reads its input.
  const torch::Tensor input =
      torch::from_blob(const_cast<float*>(x.data()), {static_cast<std::int64_t>(x.size())},
                       torch::TensorOptions().dtype(torch::kFloat32));
  const auto k64 = static_cast<std::int64_t>(k);
  torch::Tensor values;
  std::vector<double> times_ms;
  for (int run = 0; run <= runs; ++run) {  // run 0 is the warm-up
    Stopwatch clock;
    std::tie(values, std::ignore) = torch::topk(input, k64, /*dim=*/0, /*largest=*/true,
                                                /*sorted=*/false);
    const double ms = clock.seconds() * 1e3;
    if (run > 0) times_ms.push_back(ms);
  }
  TorchTopkTiming timing;
  timing.median_ms = median(times_ms);
  timing.kth_largest = values.min().item<float>();
  return timing;
}

}  // namespace sparsecomm::cli
