#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "error_message.h"
#include "scratch_dir.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/data/fashion_mnist.h"
#include "sparsecomm/data/idx.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

class IdxTest : public ::testing::Test {
 protected:
  std::string path(const char* name) const { return (directory_ / name).string(); }

  // A small Fashion-MNIST-shaped split: count images of 28x28 and labels.
  void write_split(const char* images, const char* labels, std::uint32_t count) {
    IdxArray x{{count, 28, 28}, std::vector<std::uint8_t>(count * 28 * 28)};
    for (std::size_t i = 0; i < x.data.size(); ++i) x.data[i] = static_cast<std::uint8_t>(i * 7);
    IdxArray y{{count}, std::vector<std::uint8_t>(count)};
    for (std::uint32_t i = 0; i < count; ++i) y.data[i] = static_cast<std::uint8_t>(i % 10);
    write_idx_gz(path(images), x);
    write_idx_gz(path(labels), y);
  }

  std::string message_of_read(const std::string& file) {
    return testing::error_message<InvalidArgument>([&] { read_idx(file); });
  }

  const testing::ScratchDir scratch_{"idx-" + testing::current_test_name()};
  const fs::path directory_ = scratch_.path();
};

TEST_F(IdxTest, RoundTripsGzipAndPlainFiles) {
  const IdxArray written{{3, 2, 4}, {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12,
                                     13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24}};
  write_idx_gz(path("a.gz"), written);
  const IdxArray read = read_idx(path("a.gz"));
  EXPECT_EQ(read.shape, written.shape);
  EXPECT_EQ(read.data, written.data);
  // The same bytes uncompressed (zlib reads plain files transparently).
  std::ofstream plain(path("a.idx"), std::ios::binary);
  const unsigned char header[] = {0, 0, 8, 1, 0, 0, 0, 3, 9, 8, 7};
  plain.write(reinterpret_cast<const char*>(header), sizeof header);
  plain.close();
  EXPECT_EQ(read_idx(path("a.idx")).data, (std::vector<std::uint8_t>{9, 8, 7}));
}

TEST_F(IdxTest, CorruptFilesAreRefusedWithTheirPathAndReason) {
  EXPECT_NE(message_of_read(path("missing.gz")).find("does not exist"), std::string::npos);
  std::ofstream(path("text.idx")) << "hello, not an idx file";
  EXPECT_NE(message_of_read(path("text.idx")).find("bad magic"), std::string::npos);
  std::ofstream floats(path("floats.idx"), std::ios::binary);
  const unsigned char float_header[] = {0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0};
  floats.write(reinterpret_cast<const char*>(float_header), sizeof float_header);
  floats.close();
  EXPECT_NE(message_of_read(path("floats.idx")).find("only unsigned bytes"), std::string::npos);
  write_idx_gz(path("full.gz"), IdxArray{{100}, std::vector<std::uint8_t>(100, 1)});
  // Truncate the data: rewrite with a header promising more than is there.
  std::ofstream short_file(path("short.idx"), std::ios::binary);
  const unsigned char short_header[] = {0, 0, 8, 1, 0, 0, 0, 9, 1, 2};
  short_file.write(reinterpret_cast<const char*>(short_header), sizeof short_header);
  short_file.close();
  const std::string truncated = message_of_read(path("short.idx"));
  EXPECT_NE(truncated.find("truncated"), std::string::npos) << truncated;
  EXPECT_NE(truncated.find("short.idx"), std::string::npos) << truncated;
  std::ofstream long_file(path("long.idx"), std::ios::binary);
  const unsigned char long_bytes[] = {0, 0, 8, 1, 0, 0, 0, 1, 5, 6};
  long_file.write(reinterpret_cast<const char*>(long_bytes), sizeof long_bytes);
  long_file.close();
  EXPECT_NE(message_of_read(path("long.idx")).find("data past"), std::string::npos);
  // A gzip stream cut in the middle.
  const auto size = fs::file_size(path("full.gz"));
  fs::resize_file(path("full.gz"), size / 2);
  EXPECT_THROW(read_idx(path("full.gz")), InvalidArgument);
  // A header promising 60000 x 100000 x 100000 images (6e14 bytes): refused
  // before anything that size is allocated (it once ended in bad_alloc).
  write_idx_gz(path("huge.gz"), IdxArray{{60000, 100000, 100000}, {}});
  const std::string huge = message_of_read(path("huge.gz"));
  EXPECT_NE(huge.find("more than the"), std::string::npos) << huge;
  // Promising 1 GiB with 4 bytes of data: truncated, read only as far as
  // the stream goes.
  write_idx_gz(path("big.gz"), IdxArray{{1024, 1024, 1024}, {1, 2, 3, 4}});
  EXPECT_NE(message_of_read(path("big.gz")).find("truncated"), std::string::npos);
}

// The byte-span parser on its own: every malformed input is an
// InvalidArgument that says what is wrong, and no input reads or allocates
// past what it holds.
std::vector<std::byte> idx_bytes(std::initializer_list<unsigned> values) {
  std::vector<std::byte> out;
  for (unsigned v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

std::string parse_error(std::span<const std::byte> bytes) {
  return testing::error_message<InvalidArgument>([&] { parse_idx(bytes, "input"); });
}

TEST(IdxParse, ParsesValidBytesAndRejectsEachDefect) {
  const auto valid = idx_bytes({0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6});
  const IdxArray array = parse_idx(valid, "input");
  EXPECT_EQ(array.shape, (std::vector<std::uint32_t>{2, 3}));
  EXPECT_EQ(array.data, (std::vector<std::uint8_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(parse_idx(idx_bytes({0, 0, 8, 1, 0, 0, 0, 0}), "input").data.size(), 0u);

  struct Case {
    std::vector<std::byte> bytes;
    const char* expected;
  };
  const Case cases[] = {
      {{}, "bad magic"},
      {idx_bytes({0, 0, 8}), "bad magic"},
      {idx_bytes({1, 0, 8, 1, 0, 0, 0, 0}), "bad magic"},
      {idx_bytes({0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0}), "only unsigned bytes"},
      {idx_bytes({0, 0, 8, 0}), "declares 0 dimensions"},
      {idx_bytes({0, 0, 8, 5}), "declares 5 dimensions"},
      {idx_bytes({0, 0, 8, 2, 0, 0, 0, 1}), "truncated inside its header"},
      {idx_bytes({0, 0, 8, 4, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
                  255, 255, 255}),
       "impossibly large"},
      {idx_bytes({0, 0, 8, 1, 0, 0, 0, 3, 1, 2}), "truncated: the header promises 3"},
      {idx_bytes({0, 0, 8, 1, 0, 0, 0, 1, 1, 2}), "data past the 1 bytes"},
      // A huge declared size with a few bytes: refused without allocating it.
      {idx_bytes({0, 0, 8, 2, 255, 255, 255, 255, 0, 0, 255, 255, 7}), "truncated"},
  };
  for (const Case& c : cases) {
    const std::string message = parse_error(c.bytes);
    EXPECT_NE(message.find(c.expected), std::string::npos) << "got: " << message;
    EXPECT_NE(message.find("input"), std::string::npos) << message;
  }
}

TEST(IdxParse, EveryPrefixAndEveryByteFlipIsHandled) {
  const auto valid = idx_bytes({0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6});
  for (std::size_t n = 0; n < valid.size(); ++n) {
    EXPECT_THROW(parse_idx(std::span(valid).first(n), "input"), InvalidArgument) << n;
  }
  for (std::size_t i = 0; i < valid.size(); ++i) {
    for (unsigned flip : {0x01u, 0x80u, 0xffu}) {
      std::vector<std::byte> bytes = valid;
      bytes[i] ^= static_cast<std::byte>(flip);
      try {
        const IdxArray array = parse_idx(bytes, "input");
        std::size_t count = 1;
        for (std::uint32_t size : array.shape) count *= size;
        EXPECT_EQ(array.data.size(), count);
      } catch (const InvalidArgument&) {
      }
    }
  }
}

TEST_F(IdxTest, FashionMnistLoaderChecksTheSplit) {
  write_split("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 50);
  const ImageDataset test = load_fashion_mnist(DatasetSplit::kTest, directory_.string());
  EXPECT_EQ(test.count, 50u);
  EXPECT_EQ(test.rows, 28u);
  EXPECT_EQ(test.images.size(), 50u * 28 * 28);
  EXPECT_EQ(test.labels[13], 3);
  // Labels and images that disagree in count.
  write_idx_gz(path("t10k-labels-idx1-ubyte.gz"), IdxArray{{49}, std::vector<std::uint8_t>(49)});
  EXPECT_THROW(load_fashion_mnist(DatasetSplit::kTest, directory_.string()), InvalidArgument);
  // A label that is not a class.
  write_idx_gz(path("t10k-labels-idx1-ubyte.gz"),
               IdxArray{{50}, std::vector<std::uint8_t>(50, 10)});
  EXPECT_THROW(load_fashion_mnist(DatasetSplit::kTest, directory_.string()), InvalidArgument);
}

TEST_F(IdxTest, AMissingDatasetNamesThePackageToInstall) {
  try {
    load_fashion_mnist(DatasetSplit::kTrain, directory_.string());
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install dataset-fashion-mnist"),
              std::string::npos)
        << e.what();
  }
}

// The real data from the Debian package (scripts/setup.sh installs it).
TEST(FashionMnist, TheDebianPackageLoads) {
  const ImageDataset train = load_fashion_mnist(DatasetSplit::kTrain);
  const ImageDataset test = load_fashion_mnist(DatasetSplit::kTest);
  EXPECT_EQ(train.count, 60000u);
  EXPECT_EQ(test.count, 10000u);
  EXPECT_EQ(train.rows, 28u);
  EXPECT_EQ(train.cols, 28u);
  std::vector<int> per_class(10, 0);
  for (std::uint8_t label : train.labels) ++per_class[label];
  for (int count : per_class) EXPECT_EQ(count, 6000) << "Fashion-MNIST is balanced";
}

TEST(EpochShard, ShardsAreDisjointEqualAndReshuffledPerEpoch) {
  const std::size_t count = 1003;
  const int world = 4;
  const std::size_t batch = 16;
  std::set<std::uint32_t> seen;
  for (int rank = 0; rank < world; ++rank) {
    const auto shard = epoch_shard(count, rank, world, batch, 7, 0);
    EXPECT_EQ(shard.size(), 240u) << "floor(1003 / 4 / 16) * 16";
    for (auto i : shard) {
      EXPECT_LT(i, count);
      EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " in two shards";
    }
  }
  EXPECT_EQ(epoch_shard(count, 1, world, batch, 7, 0), epoch_shard(count, 1, world, batch, 7, 0));
  EXPECT_NE(epoch_shard(count, 1, world, batch, 7, 0), epoch_shard(count, 1, world, batch, 7, 1));
  EXPECT_NE(epoch_shard(count, 1, world, batch, 7, 0), epoch_shard(count, 1, world, batch, 8, 0));
  EXPECT_THROW(epoch_shard(count, 4, world, batch, 7, 0), InvalidArgument);
  EXPECT_THROW(epoch_shard(count, 0, world, 0, 7, 0), InvalidArgument);
}

}  // namespace
}  // namespace sparsecomm
