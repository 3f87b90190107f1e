#pragma once
// Decoding the blocks the exchange patterns receive, from bytes alone (no
// Communicator, no LibTorch). Every length, count and index is checked
// against the bytes and the allowed index range first, so a truncated,
// corrupt or hostile block is a CommError, never a read or write out of
// bounds.
//
// A block is what one rank sends about one sorted index list:
//   [index part: the indices, delta varints (index_codec.h) or raw uint32]
//   [value part: value_count values, encoded_value_bytes(encoding, value_count)]
// Union all-reduce blocks have no value part; sparse allgather blocks
// carry one value per index plus the values at the known positions; the
// sparse all-reduce's sparse partial sums and split blocks one per index.
// The caller knows how many indices and values to expect (from a header
// message); the index part is what precedes the value part.

#include <cstddef>
#include <span>

#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

struct BlockFormat {
  ValueEncoding values = ValueEncoding::kFloat32;  // encoding of the value part
  bool encoded_indices = true;                     // delta varints, else raw uint32
  // Every index must lie in [begin, end).
  std::size_t begin = 0;
  std::size_t end = 0;
};

// Decodes exactly indices.size() indices from the index part of `block`
// (everything before its last encoded_value_bytes(encoding, value_count) bytes) into
// `indices`; returns the value part, not decoded. Throws CommError when the
// block is too small for the value part, the index part does not hold
// exactly indices.size() indices (truncated, trailing bytes, overlong or
// out-of-range varints), or the indices are not strictly ascending inside
// [begin, end).
std::span<const std::byte> decode_block_indices(std::span<const std::byte> block,
                                                std::size_t value_count, const BlockFormat& format,
                                                std::span<Index> indices);

// decode_block_indices(block, values.size(), ...), then the value part into
// `values`. Same errors.
void decode_block(std::span<const std::byte> block, const BlockFormat& format,
                  std::span<Index> indices, std::span<float> values);

}  // namespace sparsecomm
