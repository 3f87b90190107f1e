// Decoding received exchange blocks from bytes alone (exchange_message.h):
// valid blocks round-trip exactly; every truncation, trailing byte, corrupt
// varint, out-of-range or unsorted index and oversized count is a CommError;
// random corruption either throws CommError or yields indices that are
// strictly ascending inside the allowed range (never out of bounds).

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/collectives/exchange_message.h"
#include "sparsecomm/collectives/index_codec.h"
#include "sparsecomm/collectives/value_codec.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"

namespace sparsecomm {
namespace {

constexpr std::size_t kFourGi = std::size_t{1} << 32;

// A block as a rank sends it: [indices][values.size() values].
std::vector<std::byte> make_block(const std::vector<Index>& indices, std::vector<float>& values,
                                  const BlockFormat& format) {
  UninitVector<std::byte> bytes;
  if (format.encoded_indices) {
    encode_indices(indices, bytes);
  } else {
    bytes.resize(indices.size() * sizeof(Index));
    if (!indices.empty()) std::memcpy(bytes.data(), indices.data(), bytes.size());
  }
  const std::size_t index_part = bytes.size();
  bytes.resize(index_part + encoded_value_bytes(format.values, values.size()));
  encode_values(values, format.values, std::span<std::byte>(bytes).subspan(index_part));
  return {bytes.begin(), bytes.end()};
}

std::string format_name(const BlockFormat& format) {
  return fmt::format("{} {} [{}, {})", value_encoding_name(format.values),
                     format.encoded_indices ? "varint" : "raw", format.begin, format.end);
}

std::vector<BlockFormat> formats(std::size_t begin, std::size_t end) {
  std::vector<BlockFormat> out;
  for (const ValueEncoding values :
       {ValueEncoding::kFloat32, ValueEncoding::kFloat16, ValueEncoding::kBFloat16,
        ValueEncoding::kInt4, ValueEncoding::kInt2Stochastic, ValueEncoding::kSign}) {
    for (const bool encoded : {true, false})
      out.push_back(BlockFormat{values, encoded, begin, end});
  }
  return out;
}

struct Lists {
  std::vector<Index> indices;
  std::size_t extra = 0;  // values beyond one per index (allgather's known positions)
};

std::vector<Lists> valid_lists() {
  return {
      {{}, 0},
      {{}, 3},
      {{0}, 0},
      {{7}, 2},
      {{0, 1, 2, 3}, 0},
      {{5, 130, 131, 20000, 1u << 19, 999999}, 1},
      {{0, 0xFFFFFFFEu, 0xFFFFFFFFu}, 0},
  };
}

std::vector<float> values_for(std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t j = 0; j < count; ++j) values[j] = 0.25f * static_cast<float>(j) - 3.0f;
  return values;
}

TEST(ExchangeMessage, ValidBlocksRoundTrip) {
  for (const BlockFormat& format : formats(0, kFourGi)) {
    for (const Lists& list : valid_lists()) {
      std::vector<float> sent = values_for(list.indices.size() + list.extra);
      const std::vector<std::byte> block = make_block(list.indices, sent, format);
      std::vector<Index> indices(list.indices.size(), 12345);
      std::vector<float> values(sent.size(), -1.0f);
      decode_block(block, format, indices, values);
      EXPECT_EQ(indices, list.indices) << format_name(format);
      EXPECT_EQ(values, sent) << format_name(format);  // sent holds the decoded values

      // The index-only entry point returns the value part, in place.
      const std::span<const std::byte> value_part =
          decode_block_indices(block, sent.size(), format, indices);
      EXPECT_EQ(value_part.data(), block.data() + block.size() - value_part.size());
      EXPECT_EQ(value_part.size(), encoded_value_bytes(format.values, sent.size()));
    }
  }
}

TEST(ExchangeMessage, IndexOnlyBlocks) {
  // Union all-reduce blocks: indices, no value part.
  for (const BlockFormat& format : formats(100, 200)) {
    std::vector<float> none;
    const std::vector<Index> list{100, 101, 150, 199};
    const std::vector<std::byte> block = make_block(list, none, format);
    std::vector<Index> indices(list.size());
    EXPECT_TRUE(decode_block_indices(block, 0, format, indices).empty());
    EXPECT_EQ(indices, list) << format_name(format);
  }
}

TEST(ExchangeMessage, EveryTruncationAndTrailingByteIsACommError) {
  for (const BlockFormat& format : formats(0, 1000000)) {
    for (const Lists& list : valid_lists()) {
      if (list.indices.empty() && list.extra == 0) continue;
      if (!list.indices.empty() && list.indices.back() >= format.end) continue;
      std::vector<float> sent = values_for(list.indices.size() + list.extra);
      const std::vector<std::byte> block = make_block(list.indices, sent, format);
      std::vector<Index> indices(list.indices.size());
      std::vector<float> values(sent.size());
      for (std::size_t length = 0; length < block.size(); ++length) {
        EXPECT_THROW(decode_block(std::span(block).first(length), format, indices, values),
                     CommError)
            << format_name(format) << ": " << length << " of " << block.size() << " bytes";
      }
      std::vector<std::byte> longer = block;
      longer.insert(longer.begin(), std::byte{0});
      EXPECT_THROW(decode_block(longer, format, indices, values), CommError) << format_name(format);
    }
  }
}

TEST(ExchangeMessage, OutOfRangeIndicesAreCommErrors) {
  for (const BlockFormat& format : formats(10, 20)) {
    for (const std::vector<Index>& list :
         {std::vector<Index>{9}, std::vector<Index>{20}, std::vector<Index>{10, 15, 20},
          std::vector<Index>{0, 11}, std::vector<Index>{0xFFFFFFFFu}}) {
      std::vector<float> sent = values_for(list.size());
      const std::vector<std::byte> block = make_block(list, sent, format);
      std::vector<Index> indices(list.size());
      std::vector<float> values(list.size());
      EXPECT_THROW(decode_block(block, format, indices, values), CommError)
          << format_name(format) << ": " << list.front() << ".." << list.back();
    }
  }
}

TEST(ExchangeMessage, UnsortedRawIndicesAreCommErrors) {
  // Varints cannot express them; raw uint32 can.
  for (const ValueEncoding values :
       {ValueEncoding::kFloat32, ValueEncoding::kFloat16, ValueEncoding::kBFloat16}) {
    const BlockFormat format{values, false, 0, 100};
    for (const std::vector<Index>& list :
         {std::vector<Index>{5, 3}, std::vector<Index>{4, 4}, std::vector<Index>{1, 90, 2, 99},
          std::vector<Index>{99, 0}}) {
      std::vector<float> sent = values_for(list.size());
      const std::vector<std::byte> block = make_block(list, sent, format);
      std::vector<Index> indices(list.size());
      std::vector<float> decoded(list.size());
      EXPECT_THROW(decode_block(block, format, indices, decoded), CommError)
          << format_name(format) << ": " << list.front() << ", " << list[1];
    }
  }
}

TEST(ExchangeMessage, MalformedVarintsAreCommErrors) {
  const BlockFormat format{ValueEncoding::kFloat32, true, 0, kFourGi};
  const auto bytes = [](std::initializer_list<int> list) {
    std::vector<std::byte> out;
    for (const int b : list) out.push_back(static_cast<std::byte>(b));
    return out;
  };
  std::vector<Index> one(1), two(2);
  // Ends inside a varint.
  EXPECT_THROW(decode_block_indices(bytes({0x80}), 0, format, one), CommError);
  // More than 32 bits, and an overlong (6-byte) encoding.
  EXPECT_THROW(decode_block_indices(bytes({0xFF, 0xFF, 0xFF, 0xFF, 0x10}), 0, format, one),
               CommError);
  EXPECT_THROW(decode_block_indices(bytes({0x80, 0x80, 0x80, 0x80, 0x80, 0x00}), 0, format, one),
               CommError);
  // A gap that carries the index past 2^32 - 1.
  EXPECT_THROW(decode_block_indices(bytes({0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0x00}), 0, format, two),
               CommError);
  // Bytes left over after the announced indices.
  EXPECT_THROW(decode_block_indices(bytes({1, 2, 3}), 0, format, two), CommError);
}

TEST(ExchangeMessage, CountsTheBlockCannotHoldAreCommErrors) {
  for (const BlockFormat& format : formats(0, 1000)) {
    std::vector<float> sent = values_for(3);
    const std::vector<std::byte> block = make_block({1, 2, 3}, sent, format);
    // Far more indices than bytes (the output is sized by the caller; no
    // byte beyond the block is read).
    std::vector<Index> many(1000);
    EXPECT_THROW(decode_block_indices(block, 3, format, many), CommError) << format_name(format);
    // More values than the block holds, including counts whose byte size
    // would overflow.
    std::vector<Index> three(3);
    EXPECT_THROW(decode_block_indices(block, 4 + block.size(), format, three), CommError);
    EXPECT_THROW(
        decode_block_indices(block, std::numeric_limits<std::size_t>::max() / 2, format, three),
        CommError);
    EXPECT_THROW(
        decode_block_indices(block, std::numeric_limits<std::size_t>::max(), format, three),
        CommError);
  }
}

// Random corruption of valid blocks: a CommError, or a decode whose
// indices are strictly ascending inside [begin, end) (varint gaps may well
// decode to other valid lists).
TEST(ExchangeMessage, CorruptBlocksNeverYieldInvalidIndices) {
  std::mt19937_64 rng(7);
  const std::vector<Index> list{3, 40, 41, 700, 5000, 5001, 65000, 70000};
  std::size_t thrown = 0, decoded = 0;
  for (const BlockFormat& format : formats(3, 70001)) {
    std::vector<float> sent = values_for(list.size() + 1);
    const std::vector<std::byte> block = make_block(list, sent, format);
    for (int trial = 0; trial < 2000; ++trial) {
      std::vector<std::byte> corrupt = block;
      const int flips = 1 + static_cast<int>(rng() % 3);
      for (int f = 0; f < flips; ++f) {
        corrupt[rng() % corrupt.size()] = static_cast<std::byte>(rng() & 0xFF);
      }
      std::vector<Index> indices(list.size());
      std::vector<float> values(sent.size());
      try {
        decode_block(corrupt, format, indices, values);
      } catch (const CommError&) {
        ++thrown;
        continue;
      }
      ++decoded;
      for (std::size_t j = 0; j < indices.size(); ++j) {
        ASSERT_GE(indices[j], format.begin) << format_name(format) << " trial " << trial;
        ASSERT_LT(indices[j], format.end) << format_name(format) << " trial " << trial;
        if (j > 0) {
          ASSERT_LT(indices[j - 1], indices[j]) << format_name(format);
        }
      }
    }
  }
  // Both outcomes occur (value bytes carry no check; index bytes mostly do).
  EXPECT_GT(thrown, 0u);
  EXPECT_GT(decoded, 0u);
}

TEST(ExchangeMessage, ErrorsSayWhatIsWrong) {
  const BlockFormat format{ValueEncoding::kFloat16, false, 0, 10};
  std::vector<float> sent = values_for(2);
  const std::vector<std::byte> block = make_block({2, 12}, sent, format);
  std::vector<Index> indices(2);
  std::vector<float> values(2);
  try {
    decode_block(block, format, indices, values);
    ADD_FAILURE() << "index 12 accepted for [0, 10)";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[exchange]"), std::string::npos) << what;
    EXPECT_NE(what.find("[0, 10)"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace sparsecomm
