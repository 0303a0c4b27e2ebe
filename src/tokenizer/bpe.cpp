// BPE word encoding: split a word into characters, then repeatedly merge the adjacent pair of
// lowest rank (leftmost on ties) using a priority queue over a linked list of symbols.
// Handles unk/fuse_unk, byte_fallback and ignore_merges. No file parsing here.
#include "tokenizer/detail/bpe.h"

#include <cstdio>
#include <mutex>
#include <queue>

#include "core/error.h"
#include "tokenizer/detail/utf8.h"

namespace flexh2o::tok {

BpeModel::BpeModel(VocabMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   Options opts, std::string_view source)
    : vocab_(std::move(vocab)), opts_(std::move(opts)) {
  if (opts_.unk_token) {
    auto id = find(*opts_.unk_token);
    if (!id) FH_FAIL(source, ": unk_token '", *opts_.unk_token, "' is not in the vocabulary");
    unk_id_ = id;
  }
  byte_ids_.fill(-1);
  if (opts_.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (auto id = find(name)) byte_ids_[b] = *id;
    }
  }
  merges_.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    auto ia = find(a), ib = find(b), im = find(a + b);
    if (!ia || !ib || !im)
      FH_FAIL(source, ": merge ", i + 1, " '", a, " ", b, "' uses token '",
              (!ia ? a : !ib ? b : a + b), "' which is not in the vocabulary");
    // First occurrence wins, as in Hugging Face tokenizers.
    merges_.try_emplace(key(*ia, *ib), Merge{static_cast<int32_t>(i), *im});
  }
}

std::optional<int32_t> BpeModel::find(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  {
    std::shared_lock lock(cache_->mu);
    if (auto it = cache_->ids.find(word); it != cache_->ids.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, out);
  if (word.size() > kCachedWordBytes || cache_->full.load(std::memory_order_relaxed)) return;
  std::unique_lock lock(cache_->mu);
  if (cache_->ids.size() < kCachedWords)
    cache_->ids.try_emplace(std::string(word), out.begin() + std::ptrdiff_t(start), out.end());
  else cache_->full.store(true, std::memory_order_relaxed);
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  if (opts_.ignore_merges) {
    if (auto id = find(word)) {
      out.push_back(*id);
      return;
    }
  }
  // Initial symbols: one per character, or per byte for unknown characters with byte fallback.
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  bool prev_unk = false;
  for (std::size_t i = 0; i < word.size();) {
    std::size_t n = utf8_char_len(word, i);
    std::string_view ch = word.substr(i, n);
    i += n;
    if (auto id = find(ch)) {
      ids.push_back(*id);
      prev_unk = false;
      continue;
    }
    bool all_bytes = opts_.byte_fallback;
    for (char c : ch) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(c)] >= 0;
    if (all_bytes) {
      for (char c : ch) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      prev_unk = false;
    } else if (unk_id_) {
      if (!(opts_.fuse_unk && prev_unk)) ids.push_back(*unk_id_);
      prev_unk = true;
    }
    // No unk token: the character is dropped, as Hugging Face tokenizers does.
  }
  if (ids.size() > 1) {
    // Doubly linked list over `ids`; merged-away symbols get len 0.
    const int n = static_cast<int>(ids.size());
    std::vector<int> prev(n), next(n);
    std::vector<char> alive(n, 1);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
      int32_t rank;
      int pos;
      int32_t left, right;  // ids at push time, to detect stale entries
      int32_t merged;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> pq;
    auto push = [&](int i) {
      if (i < 0 || next[i] < 0) return;
      auto it = merges_.find(key(ids[i], ids[next[i]]));
      if (it != merges_.end()) pq.push({it->second.rank, i, ids[i], ids[next[i]], it->second.id});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!pq.empty()) {
      Cand c = pq.top();
      pq.pop();
      int i = c.pos;
      if (!alive[i] || next[i] < 0 || ids[i] != c.left || ids[next[i]] != c.right) continue;
      int j = next[i];
      ids[i] = c.merged;
      alive[j] = 0;
      next[i] = next[j];
      if (next[j] >= 0) prev[next[j]] = i;
      push(prev[i]);
      push(i);
    }
    for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
  } else {
    out.insert(out.end(), ids.begin(), ids.end());
  }
}

}  // namespace flexh2o::tok
