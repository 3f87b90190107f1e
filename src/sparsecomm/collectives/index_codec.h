#pragma once
// Wire encoding of sparse indices: a strictly ascending list as LEB128
// varints of its gaps (collectives/index_codec.cc says why and how).

#include <cstddef>
#include <span>

#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

// The first varint is the first index, each next one the gap minus one.
// Bytes needed for `indices` (ascending), without writing.
std::size_t encoded_index_bytes(std::span<const Index> indices);
// Appends the encoding to `out`; returns the bytes appended. Throws
// InvalidArgument when the indices are not strictly ascending.
std::size_t encode_indices(std::span<const Index> indices, UninitVector<std::byte>& out);
// Decodes exactly `count` indices from `in` into `out` (resized); returns the
// bytes consumed. Throws CommError on truncated or malformed input.
std::size_t decode_indices(std::span<const std::byte> in, std::size_t count,
                           UninitVector<Index>& out);
// The same into a caller-sized span: decodes exactly out.size() indices.
std::size_t decode_indices(std::span<const std::byte> in, std::span<Index> out);

}  // namespace sparsecomm
