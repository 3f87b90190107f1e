// The state parsers on untrusted bytes: StateReader and the state-file
// framing (core/state_io.h). Every defect is an Error; nothing reads past
// the span or allocates what the bytes cannot hold.

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "error_message.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/state_io.h"

namespace sparsecomm {
namespace {

std::vector<std::byte> sample_state() {
  StateWriter writer;
  writer.tag("sample");
  writer.value<std::int64_t>(-7);
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  writer.array<float>(values);
  writer.string("end");
  return writer.bytes();
}

std::string error_of(auto&& f) { return testing::error_message<Error>(f); }

TEST(StateIo, ReaderRoundTripsWhatTheWriterWrote) {
  const std::vector<std::byte> bytes = sample_state();
  StateReader reader(bytes);
  reader.expect_tag("sample");
  EXPECT_EQ(reader.value<std::int64_t>(), -7);
  EXPECT_EQ(reader.array<float>(), (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(reader.string(), "end");
  EXPECT_TRUE(reader.at_end());
}

TEST(StateIo, ReaderRefusesEveryTruncationAndAWrongTag) {
  const std::vector<std::byte> bytes = sample_state();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    StateReader reader{std::span<const std::byte>(bytes).first(n)};
    const std::string message = error_of([&] {
      reader.expect_tag("sample");
      reader.value<std::int64_t>();
      reader.array<float>();
      reader.string();
    });
    EXPECT_FALSE(message.empty()) << "prefix of " << n << " bytes was accepted";
  }
  StateReader other(bytes);
  EXPECT_NE(error_of([&] { other.expect_tag("memory.ef"); }).find("expected section 'memory.ef'"),
            std::string::npos);
}

TEST(StateIo, AnArrayLargerThanTheBytesIsRefusedBeforeAllocating) {
  StateWriter writer;
  writer.value<std::uint64_t>(std::uint64_t{1} << 62);  // claims 2^62 floats
  writer.value<float>(1.0f);
  StateReader reader(writer.bytes());
  EXPECT_NE(error_of([&] { reader.array<float>(); }).find("the state is corrupt"),
            std::string::npos);
  // The element count times the element size would wrap around to 0.
  StateWriter wrap;
  wrap.value<std::uint64_t>(std::uint64_t{1} << 62);
  StateReader wrapping(wrap.bytes());
  EXPECT_FALSE(error_of([&] { wrapping.array<float>(); }).empty());
  // array_into with a mismatched count.
  StateWriter three;
  three.array<float>(std::vector<float>{1, 2, 3});
  StateReader into(three.bytes());
  std::vector<float> two(2);
  EXPECT_NE(error_of([&] { into.array_into<float>(two); }).find("expected 2"), std::string::npos);
}

TEST(StateIo, StateFileFramingDetectsTruncationResizingAndCorruption) {
  const std::vector<std::byte> payload = sample_state();
  const std::vector<std::byte> file = encode_state_file(payload);
  ASSERT_EQ(file.size(), payload.size() + 12);
  EXPECT_EQ(decode_state_file(file, "f"), payload);
  EXPECT_TRUE(decode_state_file(encode_state_file({}), "f").empty());
  for (std::size_t n = 0; n < file.size(); ++n) {
    const std::string message = error_of([&] { decode_state_file(std::span(file).first(n), "f"); });
    EXPECT_NE(message.find("f is truncated or corrupt"), std::string::npos) << n << ": " << message;
  }
  std::vector<std::byte> longer = file;
  longer.push_back(std::byte{0});
  EXPECT_NE(error_of([&] { decode_state_file(longer, "f"); }).find("size field says"),
            std::string::npos);
  // Every single-bit flip in the payload or checksum fails the checksum;
  // one in the size field fails the size check.
  for (std::size_t i = 0; i < file.size(); ++i) {
    std::vector<std::byte> flipped = file;
    flipped[i] ^= std::byte{0x10};
    EXPECT_FALSE(error_of([&] { decode_state_file(flipped, "f"); }).empty()) << "byte " << i;
  }
}

}  // namespace
}  // namespace sparsecomm
