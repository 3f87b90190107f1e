// The fortunes text corpus: record splitting, the character vocabulary,
// window/label alignment, the deterministic train/test split, the directory
// loader and its errors.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "error_message.h"
#include "scratch_dir.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/data/text_corpus.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

// The text of ids of the vocabulary's printable characters and newlines.
std::string decode(const std::vector<std::uint8_t>& ids) {
  std::string text;
  for (const std::uint8_t id : ids) {
    text.push_back(id == kNewlineCharId ? '\n' : static_cast<char>(id - 2 + 0x20));
  }
  return text;
}

// A split's whole character stream, from samples cut with stride 1: the
// first window, then every label.
std::string stream_of(const TextSamples& samples) {
  std::vector<std::uint8_t> ids(
      samples.inputs.begin(), samples.inputs.begin() + static_cast<std::ptrdiff_t>(samples.window));
  ids.insert(ids.end(), samples.labels.begin(), samples.labels.end());
  return decode(ids);
}

// The records of a stream in the layout of a fortune file, sorted.
std::multiset<std::string> records_of(const std::string& stream) {
  std::multiset<std::string> records;
  std::size_t begin = 0;
  for (std::size_t end; (end = stream.find("%\n", begin)) != std::string::npos; begin = end + 2) {
    records.insert(stream.substr(begin, end - begin));
  }
  EXPECT_EQ(begin, stream.size()) << "the stream ends with a record separator";
  return records;
}

std::string message_of(const std::function<void()>& f) {
  return testing::error_message<InvalidArgument>(f);
}

TEST(TextCorpus, TheVocabularyIsPrintableAsciiNewlineAndOther) {
  EXPECT_EQ(kTextVocabularySize, 97u);
  EXPECT_EQ(char_id('\n'), kNewlineCharId);
  EXPECT_EQ(char_id(' '), 2);
  EXPECT_EQ(char_id('A'), 2 + ('A' - ' '));
  EXPECT_EQ(char_id('~'), 96);
  for (const int other :
       {0x00, 0x09, 0x08, 0x0d, 0x7f, 0xc3, 0xff}) {  // NUL, tab, backspace, CR, ...
    EXPECT_EQ(char_id(static_cast<std::uint8_t>(other)), kOtherCharId) << other;
  }
  std::set<std::uint8_t> ids;
  for (int byte = 0; byte < 256; ++byte) {
    const std::uint8_t id = char_id(static_cast<std::uint8_t>(byte));
    EXPECT_LT(id, kTextVocabularySize);
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), kTextVocabularySize) << "every id is used";
}

TEST(TextCorpus, RecordsAreSeparatedByLinesHoldingOnlyAPercentSign) {
  const std::string text =
      "one\n%\ntwo\nlines\n%\n  \n\n%\n%\n100% sure\n%%\n % \nlast, no newline";
  const std::vector<std::string_view> records = split_fortune_records(text);
  ASSERT_EQ(records.size(), 3u) << "blank and empty records are dropped";
  EXPECT_EQ(records[0], "one\n");
  EXPECT_EQ(records[1], "two\nlines\n");
  EXPECT_EQ(records[2], "100% sure\n%%\n % \nlast, no newline");
  EXPECT_TRUE(split_fortune_records("").empty());
  EXPECT_TRUE(split_fortune_records("%\n%\n\n%").empty());
}

TEST(TextCorpus, SamplesAreWindowsOfTheStreamAndTheCharacterAfterThem) {
  std::string text;
  for (int i = 0; i < 20; ++i) text += "record " + std::to_string(i) + "\nsays hello\n%\n";
  TextCorpusOptions dense{.window = 8, .stride = 1, .test_every = 4};
  const TextCorpus corpus = parse_fortunes(text, dense);
  const std::string stream = stream_of(corpus.train);
  ASSERT_EQ(corpus.train.count, stream.size() - 8);
  for (std::size_t i = 0; i < corpus.train.count; ++i) {
    const std::vector<std::uint8_t> window(corpus.train.inputs.begin() + 8 * i,
                                           corpus.train.inputs.begin() + 8 * (i + 1));
    ASSERT_EQ(decode(window), stream.substr(i, 8)) << "sample " << i;
    ASSERT_EQ(decode({corpus.train.labels[i]}), stream.substr(i + 8, 1)) << "sample " << i;
  }
  // A stride keeps every stride-th of those samples.
  TextCorpusOptions strided = dense;
  strided.stride = 5;
  const TextCorpus sparse = parse_fortunes(text, strided);
  ASSERT_EQ(sparse.train.count, (stream.size() - 8 - 1) / 5 + 1);
  for (std::size_t i = 0; i < sparse.train.count; ++i) {
    EXPECT_TRUE(std::equal(sparse.train.inputs.begin() + 8 * i,
                           sparse.train.inputs.begin() + 8 * (i + 1),
                           corpus.train.inputs.begin() + 8 * 5 * i))
        << "sample " << i;
    EXPECT_EQ(sparse.train.labels[i], corpus.train.labels[5 * i]) << "sample " << i;
  }
}

TEST(TextCorpus, EveryNthRecordIsTestTextAndTheSplitIsDeterministic) {
  std::string text;
  std::multiset<std::string> train, test;
  for (int i = 0; i < 30; ++i) {
    const std::string record = "fortune number " + std::to_string(i) + "\n";
    text += record + "%\n";
    (i % 3 == 2 ? test : train).insert(record);
  }
  const TextCorpusOptions options{.window = 4, .stride = 1, .test_every = 3};
  const TextCorpus corpus = parse_fortunes(text, options);
  EXPECT_EQ(corpus.train_records, 20u);
  EXPECT_EQ(corpus.test_records, 10u);
  EXPECT_EQ(records_of(stream_of(corpus.train)), train);
  EXPECT_EQ(records_of(stream_of(corpus.test)), test);
  // The records are shuffled, the same way every time.
  EXPECT_NE(stream_of(corpus.train).substr(0, 17), "fortune number 0\n");
  const TextCorpus again = parse_fortunes(text, options);
  EXPECT_EQ(again.train.inputs, corpus.train.inputs);
  EXPECT_EQ(again.train.labels, corpus.train.labels);
  EXPECT_EQ(again.test.inputs, corpus.test.inputs);
  EXPECT_EQ(again.test.labels, corpus.test.labels);
}

TEST(TextCorpus, BytesOutsideTheVocabularyBecomeOther) {
  const TextCorpus corpus =
      parse_fortunes("tab\there\n%\ncaf\xc3\xa9\n%\n", {.window = 3, .stride = 1, .test_every = 2});
  // Train: "tab\there\n%\n"; the window "tab" is followed by the tab.
  EXPECT_EQ(corpus.train.labels[0], kOtherCharId);
  EXPECT_EQ(corpus.test.labels[0], kOtherCharId) << "c a f, then the first UTF-8 byte";
}

TEST(TextCorpus, EmptyOrTooShortTextAndBadOptionsAreRefused) {
  EXPECT_NE(message_of([] { parse_fortunes(""); }).find("no record"), std::string::npos);
  EXPECT_NE(message_of([] { parse_fortunes("%\n \n%\n"); }).find("no record"), std::string::npos);
  // One record: the test split is empty.
  EXPECT_NE(message_of([] { parse_fortunes("a single fortune\n"); }).find("too little"),
            std::string::npos);
  EXPECT_NE(message_of([] { parse_fortunes("a\n%\nb\n", {.window = 0}); }).find("window"),
            std::string::npos);
  EXPECT_THROW(parse_fortunes("a\n%\nb\n", {.stride = 0}), InvalidArgument);
  EXPECT_THROW(parse_fortunes("a\n%\nb\n", {.test_every = 1}), InvalidArgument);
}

class FortuneDirectoryTest : public ::testing::Test {
 protected:
  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(directory_ / name, std::ios::binary) << bytes;
  }

  const testing::ScratchDir scratch_{
      std::string("fortunes-") + ::testing::UnitTest::GetInstance()->current_test_info()->name()};
  const fs::path& directory_ = scratch_.path();
};

TEST_F(FortuneDirectoryTest, ReadsTheTextFilesOnlyInNameOrder) {
  write("b", "bravo one\n%\nbravo two\n");
  write("a", "alpha one\n%\nalpha two\n%\n");
  write("a.dat", std::string("\0\0\0\2binary index", 16));
  write("notes", std::string("text with a NUL \0 byte\n", 23));
  fs::create_symlink(directory_ / "a", directory_ / "a.u8");
  fs::create_directories(directory_ / "off");
  write("off/c", "charlie\n");
  const TextCorpusOptions options{.window = 4, .stride = 1, .test_every = 2};
  const TextCorpus corpus = load_fortunes(directory_.string(), options);
  EXPECT_EQ(corpus.train_records + corpus.test_records, 4u);
  // Name order: alpha one, alpha two, bravo one, bravo two; odd ones are test.
  EXPECT_EQ(records_of(stream_of(corpus.test)),
            (std::multiset<std::string>{"alpha two\n", "bravo two\n"}));
  const TextCorpus from_text =
      parse_fortunes("alpha one\n%\nalpha two\n%\nbravo one\n%\nbravo two\n", options);
  EXPECT_EQ(corpus.train.inputs, from_text.train.inputs);
  EXPECT_EQ(corpus.test.labels, from_text.test.labels);
}

TEST_F(FortuneDirectoryTest, AMissingOrEmptyDirectoryNamesThePackageToInstall) {
  const std::string missing = message_of([&] { load_fortunes((directory_ / "nowhere").string()); });
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;
  EXPECT_NE(missing.find("apt-get install fortunes"), std::string::npos) << missing;
  write("only.dat", std::string("\0\0", 2));
  const std::string empty = message_of([&] { load_fortunes(directory_.string()); });
  EXPECT_NE(empty.find("holds no fortune file"), std::string::npos) << empty;
  EXPECT_NE(empty.find("apt-get install fortunes"), std::string::npos) << empty;
}

// The real corpus from the Debian package (scripts/setup.sh installs it).
TEST(Fortunes, TheDebianPackageLoads) {
  const TextCorpus corpus = load_fortunes();
  EXPECT_GT(corpus.train_records, 10000u);
  EXPECT_EQ(corpus.test_records, (corpus.train_records + corpus.test_records) / 10);
  EXPECT_GT(corpus.train.count, 20000u);
  EXPECT_LT(corpus.train.count, 100000u) << "an epoch stays tens of thousands of samples";
  EXPECT_GT(corpus.test.count, 2000u);
  EXPECT_EQ(corpus.train.inputs.size(), corpus.train.count * 32);
  for (const std::uint8_t label : corpus.test.labels) ASSERT_LT(label, kTextVocabularySize);
}

}  // namespace
}  // namespace sparsecomm
