// Tokenizers of real checkpoints: GPT-2/OPT byte-level BPE (vocab.json + merges.txt),
// Hugging Face tokenizer.json BPE models with the normalizers (NFC/NFKC/..., Lowercase, Strip,
// Replace, Bert, ...) and pre-tokenizers (ByteLevel, Split, Digits, Metaspace, Whitespace, ...)
// current open models use (GPT-2, LLaMA-2/3, Mistral, SmolLM2/StarCoder; see detail/pipeline.h),
// and sentencepiece BPE tokenizer.model files read as transformers' LlamaTokenizer reads them.
// Added/special tokens are matched before BPE. Immutable after load: thread-safe to share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flexh2o {

class Tokenizer {
 public:
  // Loads from a directory holding tokenizer.json, or vocab.json + merges.txt (GPT-2 style), or
  // tokenizer.model (sentencepiece BPE, LLaMA family; its tokenizer_config.json "legacy" and
  // "add_prefix_space" are honoured), in that order, plus optional tokenizer_config.json /
  // special_tokens_map.json for BOS/EOS/PAD and add_bos_token. Throws flexh2o::Error naming the
  // missing or malformed file. A merge naming a token absent from the vocabulary is an error;
  // tokenizer.json component types other than the supported ones (model BPE; see
  // detail/pipeline.h) and sentencepiece unigram models are rejected naming the type.
  static Tokenizer load(const std::filesystem::path& dir);
  // Whether `dir` holds any of the files load() looks for (it may still find them malformed).
  static bool present_in(const std::filesystem::path& dir);
  // A model directory's own tokenizer: load(dir) when present_in(dir), else none.
  static std::optional<Tokenizer> load_if_present(const std::filesystem::path& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special: prepend BOS (and append EOS) as the checkpoint's convention says
  // (OPT: </s>=2 first; LLaMA: <s> first). Special-token text in `text` is always matched.
  std::vector<int32_t> encode(std::string_view text, bool add_special) const;
  // Concatenated text; special tokens are rendered as their strings unless skip_special.
  // Invalid UTF-8 byte sequences become U+FFFD. Ids past the vocabulary (a model's table padded
  // past its tokenizer's, as OPT's 50272 rows over 50265 tokens) add no text, as in Hugging Face
  // tokenizers; a negative id throws.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t vocab_size() const;  // largest id + 1, added tokens included
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  bool is_special(int32_t id) const;  // false past the vocabulary
  // Raw vocabulary string of a token (e.g. "Ġworld"); throws for out-of-range ids.
  const std::string& token_string(int32_t id) const;
  // The bytes a token decodes to (e.g. " world"); may be a partial UTF-8 sequence; none past the
  // vocabulary.
  std::string token_bytes(int32_t id) const;

  struct Impl;

 private:
  friend class StreamingDecoder;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  bool known(int32_t id) const;  // id < vocab_size(); throws for a negative id
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text pieces that are always complete UTF-8: bytes of a
// character split across tokens are held back until the character is complete.
// Holds a reference to the tokenizer, which must outlive it. Not thread-safe.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(int32_t id);  // newly completed text (may be empty)
  std::string flush();           // whatever is left; incomplete bytes become U+FFFD

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
  int stripped_ = 0;       // leading strip characters removed so far (LLaMA-2 style decoders)
  bool at_start_ = true;   // nothing emitted yet: the leading strip may still apply
  bool first_token_ = true;  // no token pushed yet (tokenizers without a decoder join with " ")
};

}  // namespace flexh2o
