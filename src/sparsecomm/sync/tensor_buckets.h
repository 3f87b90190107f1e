#pragma once
// How a model's tensors are grouped for pipelining: the one rule that the
// trainer's DataParallel and the Python DDP hook share.

#include <cstddef>
#include <span>
#include <vector>

#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

// Buckets of whole tensors, formed as DDP forms its own: walking the
// tensors in reverse (the order backward produces their gradients), a
// bucket closes once it holds at least `bucket_bytes` (the last one: what
// is left). `tensor_bytes` lists the tensors' sizes in their own order.
// Returns the buckets in backward order, each the index range [begin, end)
// of its tensors; one bucket of all of them for bucket_bytes == 0; none
// for no tensors.
std::vector<Range> tensor_buckets(std::span<const std::size_t> tensor_bytes,
                                  std::size_t bucket_bytes);

}  // namespace sparsecomm
