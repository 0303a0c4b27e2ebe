// The stages around the BPE model, as plain data: normalisers, pre-tokenisers, the decode
// plan, and Tokenizer::Impl which holds everything a loaded tokenizer needs. Private header;
// parsing lives in hf_json.cpp / gpt2_files.cpp / config.cpp, application in pipeline.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/detail/bpe.h"
#include "tokenizer/detail/regex.h"
#include "tokenizer/detail/unicode.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o::tok {

// A pattern from tokenizer.json: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  std::string literal;           // used when re is null
  std::shared_ptr<Regex> re;     // shared: Impl is movable, Regex is immutable
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;
  std::string replace_all(std::string_view text, std::string_view with) const;
};

struct Normalizer {
  enum class Kind { kPrepend, kReplace, kStrip, kUnicode, kLowercase, kStripAccents, kBert };
  Kind kind;
  std::string content;  // Prepend: text to prepend; Replace: replacement
  Pattern pattern;      // Replace
  bool left = false, right = false;  // Strip: whitespace (White_Space) on each side
  NormForm form = NormForm::kNFC;    // Unicode (NFC, NFD, NFKC, NFKD)
  BertOptions bert;                  // Bert
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

// Digits, Punctuation, Whitespace, CharDelimiterSplit and BertPreTokenizer are loaded as Split
// (and WhitespaceSplit) with the pattern and behaviour tokenizers uses for them.
struct PreTokenizer {
  enum class Kind { kByteLevel, kSplit, kMetaspace, kWhitespaceSplit };
  Kind kind;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = true;          // ByteLevel: split with the GPT-2 pattern first
  Pattern pattern;                // Split (ByteLevel: the GPT-2 regex when use_regex)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  std::string replacement;  // Metaspace, usually U+2581
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = true;  // Metaspace
};

// One unit of text flowing through the pre-tokenisers.
struct Piece {
  std::string text;
  bool at_start;  // begins at offset 0 of the original input (Metaspace prepend_scheme "first")
};

// Per-token decoding steps (run once per vocabulary entry at load) plus the steps that act on
// the whole decoded text (a Strip after Fuse, the Metaspace leading-space rule).
struct DecodeStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kStrip };
  Kind kind;
  Pattern pattern;       // Replace
  std::string content;   // Replace: replacement; Strip: the character stripped
  int start = 0, stop = 0;  // Strip counts
};
struct DecodePlan {
  std::vector<DecodeStep> per_token;
  bool join_with_space = false;    // no decoder at all: tokenizers joins the tokens with " "
  std::string strip_char;          // whole-text strip (after Fuse, or Metaspace)
  int strip_leading = 0, strip_trailing = 0;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special = false, lstrip = false, rstrip = false;
};

// Applies normalisers in order to one segment of text.
std::string normalize(const std::vector<Normalizer>& norms, std::string text);
// Runs the pre-tokenisers; returns the words handed to the model.
std::vector<Piece> pre_tokenize(const std::vector<PreTokenizer>& pts, Piece piece);
// Decodes one token string through the per-token steps.
std::string decode_token(const DecodePlan& plan, std::string_view token);
// The GPT-2 pre-tokeniser pattern (ByteLevel use_regex and vocab.json+merges.txt).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace flexh2o::tok

namespace flexh2o {

struct Tokenizer::Impl {
  std::unique_ptr<tok::BpeModel> model;
  std::vector<tok::Normalizer> normalizers;
  std::vector<tok::PreTokenizer> pre_tokenizers;
  tok::DecodePlan decode;
  std::vector<tok::AddedToken> added;  // matched in text before the model; longest first
  std::array<std::vector<uint32_t>, 256> added_by_first_byte;  // indices into `added`
  // Added by encode(text, true): from the post-processor, or from add_bos/add_eos_token.
  std::vector<int32_t> prefix, suffix;
  bool has_post_processor = false;  // tokenizer.json carried one
  // Loaded from a tokenizer.json: then, as in transformers 5, tokenizer_config.json's
  // add_bos_token / add_eos_token are not read, and the post-processor alone says what is added.
  bool from_tokenizer_json = false;
  std::optional<int32_t> bos, eos, pad;
  // Filled by finalize(): indexed by id.
  std::vector<std::string> token_strings, token_bytes;
  std::vector<char> special;
  std::string source;  // file the model came from, for messages

  void finalize();
};

namespace tok {
// Loaders (hf_json.cpp, gpt2_files.cpp, sentencepiece.cpp, config.cpp).
std::unique_ptr<Tokenizer::Impl> load_tokenizer_json(const std::filesystem::path& file);
// A parsed tokenizer.json document; `source` names it in messages.
std::unique_ptr<Tokenizer::Impl> load_tokenizer_doc(const nlohmann::json& doc, const std::string& source);
// tokenizer.model (a sentencepiece BPE model) read as transformers' LlamaTokenizer reads it;
// `config` is tokenizer_config.json (null when absent), for legacy / add_prefix_space.
std::unique_ptr<Tokenizer::Impl> load_sentencepiece(const std::filesystem::path& file, const nlohmann::json& config);
std::unique_ptr<Tokenizer::Impl> load_vocab_merges(const std::filesystem::path& vocab,
                                                   const std::filesystem::path& merges);
void apply_configs(Tokenizer::Impl& impl, const std::filesystem::path& dir);
// A JSON file's contents, or null when `file` does not exist; anything there that is not a
// regular file, or not JSON, is an error.
nlohmann::json read_optional_json(const std::filesystem::path& file);
}  // namespace tok

}  // namespace flexh2o
