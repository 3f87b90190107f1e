#pragma once
// Character-level text for next-character prediction, without LibTorch: the
// fortune cookie files of Debian's `fortunes` package, cut into samples of
// (the previous `window` characters, the character after them).
//
// Vocabulary: kTextVocabularySize = 97 ids. 0 is "other" (any byte outside
// the set: tabs, backspaces, UTF-8 bytes), 1 is '\n', 2..96 are the printable
// ASCII characters ' ' (0x20) .. '~' (0x7e) in byte order.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sparsecomm {

// Where Debian's fortunes package puts its fortune files.
inline constexpr const char* kFortunesDirectory = "/usr/share/games/fortunes";

inline constexpr std::size_t kTextVocabularySize = 97;
inline constexpr std::uint8_t kOtherCharId = 0;
inline constexpr std::uint8_t kNewlineCharId = 1;

// The id of one byte in the vocabulary above.
std::uint8_t char_id(std::uint8_t byte);

struct TextCorpusOptions {
  std::size_t window = 32;      // T: characters of context per sample (>= 1)
  std::size_t stride = 48;      // a sample starts every `stride` characters (>= 1)
  std::size_t test_every = 10;  // record i is test text when i % test_every == test_every - 1
};

struct TextSamples {
  std::size_t count = 0;
  std::size_t window = 0;
  std::vector<std::uint8_t> inputs;  // count x window ids, sample-major
  std::vector<std::uint8_t> labels;  // count ids: the character after each window
};

struct TextCorpus {
  TextSamples train;
  TextSamples test;
  std::size_t train_records = 0;
  std::size_t test_records = 0;
};

// The records of fortune-file text, in order: lines holding only "%"
// separate them; a record is its lines, newlines included (the last line may
// lack one). Records without a visible character are dropped.
std::vector<std::string_view> split_fortune_records(std::string_view text);

// Samples of `records` (in corpus order): record i goes to the test split
// when i % test_every == test_every - 1, else to the train split. Each
// split's records, in a fixed pseudo-random order (so that the first N
// samples draw from the whole corpus), are joined into one character stream
// as in a fortune file (each ends with a newline and a "%" line); sample j is
// the window at j * stride and the character after it. Deterministic.
// InvalidArgument when an option is out of range or either split has no
// sample (too little text: each split needs more than `window` characters).
TextCorpus make_text_corpus(const std::vector<std::string_view>& records,
                            const TextCorpusOptions& options = {});

// make_text_corpus of the records of one fortune-file text (or several
// concatenated).
TextCorpus parse_fortunes(std::string_view text, const TextCorpusOptions& options = {});

// Every fortune file in `directory`, in name order, as one corpus: regular
// files only (no symlinks, such as the package's *.u8, nor subdirectories),
// without the binary *.dat indexes or any other file holding a NUL byte.
// InvalidArgument, naming the package to install, when the directory is
// missing or holds no fortune file.
TextCorpus load_fortunes(const std::string& directory = kFortunesDirectory,
                         const TextCorpusOptions& options = {});

}  // namespace sparsecomm
