// Applying the stages around the BPE model: normalisers, pre-tokenisers (ByteLevel, Split,
// Metaspace, WhitespaceSplit) and per-token decode steps. Parsing them from JSON is elsewhere.
#include <cstdio>

#include "core/error.h"
#include "tokenizer/detail/pipeline.h"
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

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

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
        std::size_t b = 0, e = text.size();
        if (n.left)
          while (b < e && is_ascii_space(text[b])) ++b;
        if (n.right)
          while (e > b && is_ascii_space(text[e - 1])) --e;
        text = text.substr(b, e - b);
        break;
      }
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
  for (const auto& s : spans) out.push_back({p.text.substr(s.b, s.e - s.b), p.at_start && s.b == 0});
}

bool is_unicode_space(std::string_view s, std::size_t i, std::size_t* len) {
  *len = utf8_char_len(s, i);
  if (*len == 1) return is_ascii_space(s[i]);
  std::string_view c = s.substr(i, *len);
  // U+0085, U+00A0, U+1680, U+2000-200A, U+2028/9, U+202F, U+205F, U+3000
  static constexpr std::string_view kSpaces[] = {
      "\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82",
      "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87",
      "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9",
      "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
  for (auto sp : kSpaces)
    if (c == sp) return true;
  return false;
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
