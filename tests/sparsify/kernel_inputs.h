#pragma once
// Inputs shared by the kernel tests and the kernel timing program.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace sparsecomm {

// Student-t with 3 degrees of freedom: heavy tails, like accumulated gradients.
inline std::vector<float> heavy_tailed_vector(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> dist(3.0f);
  std::vector<float> x(n);
  for (float& v : x) v = 1e-3f * dist(rng);
  return x;
}

// The magnitude at descending rank `rank` (1-based) of x, NaN excluded.
inline float magnitude_at_rank(const std::vector<float>& x, std::size_t rank) {
  std::vector<float> a;
  for (float v : x) {
    if (!std::isnan(v)) a.push_back(std::fabs(v));
  }
  std::sort(a.begin(), a.end(), std::greater<float>());
  return a[std::min(rank, a.size()) - 1];
}

}  // namespace sparsecomm
