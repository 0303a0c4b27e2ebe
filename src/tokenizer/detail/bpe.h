// The BPE model proper: vocabulary, merge ranks and word -> ids by rank-ordered merging.
// Knows nothing about files, pre-tokenisation or special tokens. Immutable after build but for
// a bounded cache of encoded words behind a reader-writer lock: sharing across threads is safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace flexh2o::tok {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using VocabMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  struct Options {
    std::optional<std::string> unk_token;  // must be in the vocabulary when set
    bool byte_fallback = false;            // unknown chars -> <0xNN> tokens
    bool fuse_unk = false;                 // consecutive unknowns -> one unk
    bool ignore_merges = false;            // a word found in the vocabulary is one token
  };
  // `source` names the file for error messages. Merges are applied in list order (rank = index).
  // Throws flexh2o::Error when a merge names a token (or produces one) absent from the vocabulary.
  BpeModel(VocabMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           Options opts, std::string_view source);

  // Appends the ids of one pre-tokenised word (already byte-level mapped or normalised).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // Words the cache holds at most, and the longest it holds (as Hugging Face tokenizers' BPE).
  static constexpr size_t kCachedWords = 10000, kCachedWordBytes = 256;

  const VocabMap& vocab() const { return vocab_; }
  std::optional<int32_t> find(std::string_view token) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void merge_word(std::string_view word, std::vector<int32_t>& out) const;  // encode_word without the cache

  // Natural text repeats its words and merging is most of encoding, so a word's ids (a function
  // of the word) are kept; copies of the model share them.
  struct WordCache {
    std::shared_mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> ids;
    std::atomic<bool> full{false};  // then a miss takes no exclusive lock
  };
  std::shared_ptr<WordCache> cache_ = std::make_shared<WordCache>();
  VocabMap vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  Options opts_;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> ids when byte_fallback, else -1
};

}  // namespace flexh2o::tok
