#include "sparsecomm/sync/load_balance.h"

#include <algorithm>
#include <random>

namespace sparsecomm {

double imbalance_of(std::span<const std::size_t> counts) {
  std::size_t max = 0;
  std::size_t sum = 0;
  for (const std::size_t c : counts) {
    max = std::max(max, c);
    sum += c;
  }
  if (sum == 0) return 0.0;
  return static_cast<double>(counts.size()) * static_cast<double>(max) / static_cast<double>(sum) -
         1.0;
}

double imbalance_floor(int ranks, std::int64_t total, int trials) {
  if (ranks <= 1 || total <= 0 || trials <= 0) return 0.0;
  std::mt19937_64 rng(0x5eed1ba1u);
  double sum = 0.0;
  for (int t = 0; t < trials; ++t) {
    // A multinomial draw as a chain of binomials: rank r gets
    // Binomial(left, 1 / (ranks - r)) of what the ranks before it left.
    std::int64_t left = total;
    std::int64_t max = 0;
    for (int r = 0; r < ranks && left > 0; ++r) {
      std::int64_t here = left;
      if (r + 1 < ranks) {
        std::binomial_distribution<std::int64_t> draw(left, 1.0 / static_cast<double>(ranks - r));
        here = draw(rng);
      }
      max = std::max(max, here);
      left -= here;
    }
    sum += static_cast<double>(ranks) * static_cast<double>(max) / static_cast<double>(total) - 1.0;
  }
  return sum / trials;
}

}  // namespace sparsecomm
