#pragma once
// Sparse (index, value) lists and the uninitialized growable vectors behind
// them (no value-initialization on resize, so a buffer kept across steps is
// never cleared element by element: the hot path does not allocate or touch
// memory it does not write).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sparsecomm {

// Index into the flat gradient vector. Models have at most 2^32 - 1 elements.
using Index = std::uint32_t;

// An allocator whose value-less construct() default-initializes, so
// std::vector<T, DefaultInitAllocator<T>>::resize() leaves trivial T
// uninitialized.
template <class T, class Base = std::allocator<T>>
class DefaultInitAllocator : public Base {
 public:
  using Base::Base;
  template <class U>
  struct rebind {
    using other =
        DefaultInitAllocator<U, typename std::allocator_traits<Base>::template rebind_alloc<U>>;
  };
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    std::allocator_traits<Base>::construct(static_cast<Base&>(*this), p,
                                           std::forward<Args>(args)...);
  }
};

template <class T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

// A contiguous run [begin, end) of the flat vector.
struct Range {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
  bool empty() const { return begin == end; }
};

// Chunk c of a buffer of `numel` elements split into `parts` near-equal
// contiguous chunks: [chunk_begin(c), chunk_begin(c + 1)); the first
// numel % parts chunks hold one element more. The one split of the ring
// collectives, Skip-Reduce's schedule, the scattering broadcast and
// MiCRO's partitions.
std::size_t chunk_begin(std::size_t numel, int parts, int chunk);

// One rank's selection: indices strictly ascending, values[i] the selected
// vector's value at indices[i]. Reused across steps (clear() keeps capacity).
//
// known: ranges of positions that every rank transmits and every rank knows
// without being told (identical on all ranks, ascending, non-overlapping,
// disjoint from every rank's indices), e.g. DEFT's whole pieces. The
// exchange adds them to the union with no index on the wire; their values
// are summed like any other. size() and the per-rank counts do not include
// them. Most schemes leave it empty.
struct SparseSelection {
  UninitVector<Index> indices;
  UninitVector<float> values;
  std::vector<Range> known;

  std::size_t size() const { return indices.size(); }
  bool empty() const { return indices.empty(); }
  void clear() {
    indices.clear();
    values.clear();
    known.clear();
  }

  // Throws InvalidArgument unless this selection fits a vector of `numel`
  // elements: indices strictly ascending and below numel, known ranges
  // ascending, non-overlapping, inside [0, numel) and apart from the
  // indices. Callers prefix the message with where they are; nothing is
  // allocated unless it throws.
  void check(std::size_t numel) const;
  // `out` = the indices and every known position, ascending, with the
  // values: the selected ones as selected, the known positions' read from
  // `accumulated`; out.known is empty. Checks the selection first (check()
  // and as many values as indices).
  void expand_known(std::span<const float> accumulated, SparseSelection& out) const;
};

// One tensor's place in the flat vector.
struct LayerSpan {
  std::string name;
  std::size_t offset = 0;
  std::size_t size = 0;
  // The tensor's first dimension when it has two or more (a matrix of rows
  // x size/rows for PowerSGD); 0 for vectors and where it is not known.
  std::size_t rows = 0;
};

// Walks [0, numel) in order as the layers and the gaps around them:
// visit(begin, end, layer) with `layer` null for a gap (gaps may be empty).
// Layers must come in order, not overlapping, inside [0, numel); otherwise
// throws InvalidArgument naming the layer, prefixed with `who` ("[demo]").
void for_each_layer_and_gap(
    std::string_view who, std::size_t numel, std::span<const LayerSpan> layers,
    const std::function<void(std::size_t begin, std::size_t end, const LayerSpan* layer)>& visit);

// Target global count k = max(1, floor(c * d)) for d >= 1, 0 for d = 0.
std::size_t target_count(double density, std::size_t numel);

}  // namespace sparsecomm
