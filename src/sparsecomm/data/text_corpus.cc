#include "sparsecomm/data/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

// Keys the fixed record order of each split (not the run's seed: the
// corpus is one dataset whatever the run).
constexpr std::uint64_t kRecordOrderKey = 0xf0a7c0de5eedull;

bool has_visible_char(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    return c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f';
  });
}

// The split's records in its fixed order, as one id stream in the layout of
// a fortune file: each record, a newline if it lacks one, then "%\n".
std::vector<std::uint8_t> split_stream(std::vector<std::string_view> records, std::uint64_t split) {
  const Philox rng(kRecordOrderKey);
  for (std::size_t i = records.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(rng.below(i, split, i));
    std::swap(records[i - 1], records[j]);
  }
  std::vector<std::uint8_t> stream;
  for (const std::string_view record : records) {
    for (const char c : record) stream.push_back(char_id(static_cast<std::uint8_t>(c)));
    if (record.back() != '\n') stream.push_back(kNewlineCharId);
    stream.push_back(char_id('%'));
    stream.push_back(kNewlineCharId);
  }
  return stream;
}

TextSamples cut_samples(const std::vector<std::uint8_t>& stream, const TextCorpusOptions& o) {
  TextSamples samples;
  samples.window = o.window;
  if (stream.size() <= o.window) return samples;
  samples.count = (stream.size() - o.window - 1) / o.stride + 1;
  samples.inputs.reserve(samples.count * o.window);
  samples.labels.reserve(samples.count);
  for (std::size_t i = 0; i < samples.count; ++i) {
    const auto first = stream.begin() + static_cast<std::ptrdiff_t>(i * o.stride);
    samples.inputs.insert(samples.inputs.end(), first,
                          first + static_cast<std::ptrdiff_t>(o.window));
    samples.labels.push_back(first[static_cast<std::ptrdiff_t>(o.window)]);
  }
  return samples;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in) throw Error(fmt::format("[data] cannot read {}", path.string()));
  return std::move(bytes).str();
}

std::string install_hint() {
  return "install Debian's fortunes package with `apt-get install fortunes` (scripts/setup.sh "
         "does), or point the data directory at a directory of fortune files";
}

}  // namespace

std::uint8_t char_id(std::uint8_t byte) {
  if (byte == '\n') return kNewlineCharId;
  if (byte >= 0x20 && byte <= 0x7e) return static_cast<std::uint8_t>(byte - 0x20 + 2);
  return kOtherCharId;
}

std::vector<std::string_view> split_fortune_records(std::string_view text) {
  std::vector<std::string_view> records;
  const auto add = [&](std::size_t begin, std::size_t end) {
    const std::string_view record = text.substr(begin, end - begin);
    if (has_visible_char(record)) records.push_back(record);
  };
  std::size_t record_begin = 0;
  std::size_t line_begin = 0;
  while (line_begin < text.size()) {
    const std::size_t newline = text.find('\n', line_begin);
    const std::size_t line_end = newline == std::string_view::npos ? text.size() : newline;
    const std::size_t next = newline == std::string_view::npos ? text.size() : newline + 1;
    if (text.substr(line_begin, line_end - line_begin) == "%") {
      add(record_begin, line_begin);
      record_begin = next;
    }
    line_begin = next;
  }
  add(record_begin, text.size());
  return records;
}

TextCorpus make_text_corpus(const std::vector<std::string_view>& records,
                            const TextCorpusOptions& options) {
  if (options.window < 1 || options.stride < 1 || options.test_every < 2) {
    throw InvalidArgument(fmt::format(
        "[data] text corpus: window {}, stride {}, test_every {}: need window >= 1, stride >= 1, "
        "test_every >= 2",
        options.window, options.stride, options.test_every));
  }
  if (records.empty()) {
    throw InvalidArgument(
        "[data] the fortune text holds no record (text separated by lines holding only \"%\")");
  }
  std::vector<std::string_view> train, test;
  for (std::size_t i = 0; i < records.size(); ++i) {
    (i % options.test_every == options.test_every - 1 ? test : train).push_back(records[i]);
  }
  TextCorpus corpus;
  corpus.train_records = train.size();
  corpus.test_records = test.size();
  const std::vector<std::uint8_t> train_stream = split_stream(std::move(train), 0);
  const std::vector<std::uint8_t> test_stream = split_stream(std::move(test), 1);
  corpus.train = cut_samples(train_stream, options);
  corpus.test = cut_samples(test_stream, options);
  if (corpus.train.count == 0 || corpus.test.count == 0) {
    throw InvalidArgument(fmt::format(
        "[data] too little fortune text: {} records give {} training and {} test characters "
        "(one record in {} is test text); each split needs more than {} characters",
        records.size(), train_stream.size(), test_stream.size(), options.test_every,
        options.window));
  }
  return corpus;
}

TextCorpus parse_fortunes(std::string_view text, const TextCorpusOptions& options) {
  return make_text_corpus(split_fortune_records(text), options);
}

TextCorpus load_fortunes(const std::string& directory, const TextCorpusOptions& options) {
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    throw InvalidArgument(
        fmt::format("[data] fortune directory {} does not exist: {}", directory, install_hint()));
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
    if (entry.is_symlink() || !entry.is_regular_file()) continue;
    if (entry.path().extension() == ".dat") continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> texts;
  for (const fs::path& file : files) {
    std::string text = read_file(file);
    if (text.find('\0') == std::string::npos) texts.push_back(std::move(text));
  }
  if (texts.empty()) {
    throw InvalidArgument(fmt::format(
        "[data] {} holds no fortune file (plain text, records separated by lines holding only "
        "\"%\"): {}",
        directory, install_hint()));
  }
  std::vector<std::string_view> records;
  for (const std::string& text : texts) {
    const std::vector<std::string_view> own = split_fortune_records(text);
    records.insert(records.end(), own.begin(), own.end());
  }
  return make_text_corpus(records, options);
}

}  // namespace sparsecomm
