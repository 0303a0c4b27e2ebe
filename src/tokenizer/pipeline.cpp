// Applying the stages around the BPE model: normalisers, pre-tokenisers (ByteLevel, Split,
// Metaspace, WhitespaceSplit; the other tokenizers.json types are loaded as these) and
// per-token decode steps. Parsing them from JSON is elsewhere.
#include <cstdio>

#include "core/error.h"
#include "tokenizer/detail/pipeline.h"
#include "tokenizer/detail/unicode.h"
#include "tokenizer/detail/utf8.h"

namespace flexh2o::tok {

// ---------------------------------------------------------------------------------------------
// Patterns
// ---------------------------------------------------------------------------------------------

std::vector<std::pair<std::size_t, std::size_t>> Pattern::find_all(std::string_view text) const {
  if (re) return re->find_all(text);
  std::vector<std::pair<std::size_t, std::size_t>> out;
  if (literal.empty()) return out;
  for (std::size_t pos = text.find(literal); pos != std::string_view::npos;
       pos = text.find(literal, pos + literal.size()))
    out.emplace_back(pos, pos + literal.size());
  return out;
}

std::string Pattern::replace_all(std::string_view text, std::string_view with) const {
  return replace_spans(text, find_all(text), with);
}

// ---------------------------------------------------------------------------------------------
// Normalisers
// ---------------------------------------------------------------------------------------------

namespace {

// The White_Space code point at s[i], if any (*len: its length in bytes either way).
bool is_unicode_space(std::string_view s, std::size_t i, std::size_t* len) {
  uint32_t cp = 0;
  return decode_codepoint(s, i, &cp, len) && is_white_space(cp);
}

// Length of the White_Space code point ending at s[e - 1], or 0.
std::size_t space_before(std::string_view s, std::size_t e) {
  std::size_t b = e;
  for (int k = 0; k < 4 && b > 0; ++k) {
    --b;
    if ((static_cast<unsigned char>(s[b]) & 0xC0) != 0x80) break;
  }
  std::size_t len = 0;
  return (is_unicode_space(s, b, &len) && b + len == e) ? len : 0;
}

}  // namespace

std::string normalize(const std::vector<Normalizer>& norms, std::string text) {
  for (const auto& n : norms) {
    switch (n.kind) {
      case Normalizer::Kind::kPrepend:
        if (!text.empty()) text = n.content + text;
        break;
      case Normalizer::Kind::kReplace:
        text = n.pattern.replace_all(text, n.content);
        break;
      case Normalizer::Kind::kStrip: {
        std::size_t b = 0, e = text.size(), len = 0;
        if (n.left)
          while (b < e && is_unicode_space(text, b, &len)) b += len;
        if (n.right)
          while (e > b && (len = space_before(text, e)) > 0) e -= len;
        text = text.substr(b, e - b);
        break;
      }
      case Normalizer::Kind::kUnicode:
        text = unicode_normalize(text, n.form);
        break;
      case Normalizer::Kind::kLowercase:
        text = unicode_lowercase(text);
        break;
      case Normalizer::Kind::kStripAccents:
        text = strip_marks(text);
        break;
      case Normalizer::Kind::kBert:
        text = bert_normalize(text, n.bert);
        break;
    }
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenisers
// ---------------------------------------------------------------------------------------------

namespace {

// Splits `p` around the matches of a pattern according to `behavior` (Hugging Face semantics).
void split_piece(Piece p, const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out) {
  struct Region {
    std::size_t b, e;
    bool delim;  // a match (or a non-match when inverted)
  };
  std::vector<Region> regions;
  std::size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) regions.push_back({prev, b, invert});
    regions.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < p.text.size()) regions.push_back({prev, p.text.size(), invert});

  std::vector<Region> spans;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& r : regions)
        if (!r.delim) spans.push_back(r);
      break;
    case SplitBehavior::kIsolated:
      spans = regions;
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_delim = false;
      for (const auto& r : regions) {
        if (r.delim && !prev_delim && !spans.empty()) spans.back().e = r.e;
        else spans.push_back(r);
        prev_delim = r.delim;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // A delimiter joins the following region when that region is not a delimiter itself.
      std::size_t carry = std::string::npos;
      for (std::size_t i = 0; i < regions.size(); ++i) {
        const auto& r = regions[i];
        if (r.delim && i + 1 < regions.size() && !regions[i + 1].delim) {
          carry = r.b;
          continue;
        }
        spans.push_back({carry != std::string::npos ? carry : r.b, r.e, false});
        carry = std::string::npos;
      }
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_delim = false;
      for (const auto& r : regions) {
        if (r.delim == prev_delim && !spans.empty()) spans.back().e = r.e;
        else spans.push_back(r);
        prev_delim = r.delim;
      }
      break;
    }
  }
  for (const auto& s : spans)  // empty pieces (from empty matches) are dropped, as tokenizers does
    if (s.e > s.b) out.push_back({p.text.substr(s.b, s.e - s.b), p.at_start && s.b == 0});
}

void apply_one(const PreTokenizer& pt, Piece p, std::vector<Piece>& out) {
  switch (pt.kind) {
    case PreTokenizer::Kind::kByteLevel: {
      if (pt.add_prefix_space && !p.text.empty() && p.text[0] != ' ') p.text.insert(0, 1, ' ');
      if (!pt.use_regex) {
        out.push_back({byte_level_encode(p.text), p.at_start});
        return;
      }
      std::vector<Piece> parts;
      auto matches = pt.pattern.find_all(p.text);
      split_piece(std::move(p), matches, SplitBehavior::kIsolated, false, parts);
      for (auto& q : parts) out.push_back({byte_level_encode(q.text), q.at_start});
      return;
    }
    case PreTokenizer::Kind::kSplit: {
      auto matches = pt.pattern.find_all(p.text);
      split_piece(std::move(p), matches, pt.behavior, pt.invert, out);
      return;
    }
    case PreTokenizer::Kind::kMetaspace: {
      Pattern space{" ", nullptr};
      p.text = space.replace_all(p.text, pt.replacement);
      bool want = pt.prepend == PrependScheme::kAlways || (pt.prepend == PrependScheme::kFirst && p.at_start);
      if (want && !p.text.starts_with(pt.replacement)) p.text.insert(0, pt.replacement);
      if (!pt.split) {
        out.push_back(std::move(p));
        return;
      }
      Pattern delim{pt.replacement, nullptr};
      auto matches = delim.find_all(p.text);
      split_piece(std::move(p), matches, SplitBehavior::kMergedWithNext, false, out);
      return;
    }
    case PreTokenizer::Kind::kWhitespaceSplit: {
      std::size_t start = 0, i = 0, len = 0;
      bool in_word = false;
      for (; i < p.text.size(); i += len) {
        bool sp = is_unicode_space(p.text, i, &len);
        if (sp && in_word) out.push_back({p.text.substr(start, i - start), p.at_start && start == 0});
        if (!sp && !in_word) start = i;
        in_word = !sp;
      }
      if (in_word) out.push_back({p.text.substr(start), p.at_start && start == 0});
      return;
    }
  }
}

}  // namespace

std::vector<Piece> pre_tokenize(const std::vector<PreTokenizer>& pts, Piece piece) {
  std::vector<Piece> cur;
  cur.push_back(std::move(piece));
  for (const auto& pt : pts) {
    std::vector<Piece> next;
    next.reserve(cur.size());
    for (auto& p : cur) apply_one(pt, std::move(p), next);
    cur = std::move(next);
  }
  return cur;
}

// ---------------------------------------------------------------------------------------------
// Per-token decode steps
// ---------------------------------------------------------------------------------------------

std::string decode_token(const DecodePlan& plan, std::string_view token) {
  std::string s(token);
  for (const auto& step : plan.per_token) {
    switch (step.kind) {
      case DecodeStep::Kind::kByteLevel:
        s = byte_level_decode(s);
        break;
      case DecodeStep::Kind::kReplace:
        s = step.pattern.replace_all(s, step.content);
        break;
      case DecodeStep::Kind::kByteFallback: {
        unsigned v = 0;
        char tail = 0;
        if (s.size() == 6 && s.starts_with("<0x") && std::sscanf(s.c_str() + 3, "%2X%c", &v, &tail) == 2 &&
            tail == '>')
          s = std::string(1, static_cast<char>(v));
        break;
      }
      case DecodeStep::Kind::kStrip: {
        std::size_t b = 0, e = s.size();
        const std::string& c = step.content;
        for (int k = 0; k < step.start && s.compare(b, c.size(), c) == 0 && b + c.size() <= e; ++k) b += c.size();
        for (int k = 0; k < step.stop && e >= b + c.size() && s.compare(e - c.size(), c.size(), c) == 0; ++k)
          e -= c.size();
        s = s.substr(b, e - b);
        break;
      }
    }
  }
  return s;
}

}  // namespace flexh2o::tok
