#include "sparsecomm/sparsify/kernels/threshold_select.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/sparsify/kernels/simd_impl.h"

namespace sparsecomm {
namespace detail::scalar {

// Branch-free: always write, advance by the compare.
std::size_t select(const float* x, std::size_t n, std::size_t /*readable*/, bool /*dense*/,
                   float threshold, Index base, Index* indices, float* values) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    indices[count] = base + static_cast<Index>(i);
    values[count] = v;
    count += std::fabs(v) >= threshold ? 1u : 0u;
  }
  return count;
}

std::size_t compact(Index* indices, float* values, std::size_t n, float threshold) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = values[i];
    const Index index = indices[i];
    indices[kept] = index;
    values[kept] = v;
    kept += std::fabs(v) >= threshold ? 1u : 0u;
  }
  return kept;
}

std::size_t count_at_least(const float* x, std::size_t n, float threshold) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) count += std::fabs(x[i]) >= threshold ? 1u : 0u;
  return count;
}

}  // namespace detail::scalar

namespace {

using SelectFn = std::size_t (*)(const float*, std::size_t, std::size_t, bool, float, Index, Index*,
                                 float*);
using CountFn = std::size_t (*)(const float*, std::size_t, float);

// Elements per call of the select kernel: the output is grown once per block
// (to the block's worst case plus slack), never per element.
constexpr std::size_t kBlock = 4096;
// A block denser than 1/128 makes the next one use the branch-free loop:
// by then two in five 64-element rounds hold a hit, and the sparse loop's
// "any hit" branch costs more in mispredictions than compressing every
// vector (measured crossover between 0.5% and 1% density).
constexpr std::size_t kDenseInverse = 128;

void check_threshold(float threshold, const char* component) {
  if (!(threshold >= 0.0f)) {
    throw InvalidArgument(std::string("[") + component +
                          "] threshold must be >= 0 and not NaN, got " + std::to_string(threshold));
  }
}

SelectFn select_kernel(SimdLevel level) {
  detail::require_simd_level(level, "threshold_select");
  switch (level) {
    case SimdLevel::kAvx512:
      return &detail::avx512::select;
    case SimdLevel::kAvx2:
      return &detail::avx2::select;
    default:
      return &detail::scalar::select;
  }
}

CountFn count_kernel(SimdLevel level) {
  detail::require_simd_level(level, "count_at_least");
  switch (level) {
    case SimdLevel::kAvx512:
      return &detail::avx512::count_at_least;
    case SimdLevel::kAvx2:
      return &detail::avx2::count_at_least;
    default:
      return &detail::scalar::count_at_least;
  }
}

}  // namespace

std::size_t threshold_select(std::span<const float> x, float threshold, Index base,
                             SparseSelection& out, SimdLevel level) {
  check_threshold(threshold, "threshold_select");
  const SelectFn kernel = select_kernel(level);
  const std::size_t n = x.size();
  if (static_cast<std::uint64_t>(base) + n > std::numeric_limits<Index>::max()) {
    throw InvalidArgument("[threshold_select] base " + std::to_string(base) + " + size " +
                          std::to_string(n) + " does not fit in a 32-bit index");
  }
  if (out.indices.size() != out.values.size()) {
    throw InvalidArgument("[threshold_select] output indices and values differ in size");
  }
  const std::size_t start = out.indices.size();
  std::size_t count = start;
  // The kernels write up to a whole block plus kSelectSlack past `count`;
  // size (not just capacity) covers that, and shrinks to the count at the end.
  std::size_t room = start;
  bool dense = false;
  for (std::size_t off = 0; off < n; off += kBlock) {
    const std::size_t len = std::min(kBlock, n - off);
    if (count + len + detail::kSelectSlack > room) {
      room = count + len + detail::kSelectSlack;
      out.indices.resize(room);
      out.values.resize(room);
    }
    const std::size_t hits =
        kernel(x.data() + off, len, n - off, dense, threshold, base + static_cast<Index>(off),
               out.indices.data() + count, out.values.data() + count);
    count += hits;
    dense = hits * kDenseInverse > len;
  }
  out.indices.resize(count);
  out.values.resize(count);
  return count - start;
}

std::size_t compact_at_least(SparseSelection& selection, float threshold, SimdLevel level) {
  check_threshold(threshold, "compact_at_least");
  detail::require_simd_level(level, "compact_at_least");
  if (selection.indices.size() != selection.values.size()) {
    throw InvalidArgument("[compact_at_least] indices and values differ in size");
  }
  using CompactFn = std::size_t (*)(Index*, float*, std::size_t, float);
  const CompactFn kernel = level == SimdLevel::kAvx512 ? &detail::avx512::compact
                           : level == SimdLevel::kAvx2 ? &detail::avx2::compact
                                                       : &detail::scalar::compact;
  const std::size_t kept =
      kernel(selection.indices.data(), selection.values.data(), selection.size(), threshold);
  selection.indices.resize(kept);
  selection.values.resize(kept);
  return kept;
}

std::size_t count_at_least(std::span<const float> x, float threshold, SimdLevel level) {
  check_threshold(threshold, "count_at_least");
  return count_kernel(level)(x.data(), x.size(), threshold);
}

}  // namespace sparsecomm
