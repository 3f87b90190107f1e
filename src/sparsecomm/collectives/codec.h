#pragma once
// Wire encodings of sparse data: delta-encoded sorted indices and reduced-
// precision values.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

// --- indices: strictly ascending -> LEB128 varints of the gaps ---
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

// --- values ---
enum class ValueEncoding { kFloat32, kFloat16, kBFloat16 };
// "fp32", "fp16", "bf16"; InvalidArgument listing them otherwise.
ValueEncoding parse_value_encoding(std::string_view name);
std::string_view value_encoding_name(ValueEncoding encoding);
std::size_t value_bytes(ValueEncoding encoding);  // 4, 2, 2

// Round to nearest even; finite values saturate to the largest finite value
// (fp16 +-65504, bf16 +-3.39e38) instead of overflowing to inf (so the
// residual stays finite), NaN stays NaN (every 16-bit NaN pattern survives
// a round trip through float), inf stays inf.
std::uint16_t float_to_fp16(float value);
float fp16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);

// Encodes values[i] into out (values.size() * value_bytes bytes) and
// replaces values[i] by the decoded value, so the caller knows exactly what
// the receivers will see. For kFloat32 a plain copy. For every finite a the
// decoded d satisfies: a - d is exact in float (so a residual a - d keeps
// exactly what was not sent). fp16 needs care only beyond 65504: there d is
// the largest fp16 magnitude with that property (65504 up to 2^29, coarser
// above, 0 from 2^39 on).
void encode_values(std::span<float> values, ValueEncoding encoding, std::span<std::byte> out);
// Decodes `out.size()` values from `in`.
void decode_values(std::span<const std::byte> in, ValueEncoding encoding, std::span<float> out);

}  // namespace sparsecomm
