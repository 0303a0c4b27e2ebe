// Tokenizer and StreamingDecoder behaviour on a loaded Impl: matching added tokens, running the
// normalise -> pre-tokenise -> BPE pipeline, post-processing, and byte-level decoding with
// U+FFFD repair. Loading lives in config.cpp and the loaders it calls.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/detail/pipeline.h"
#include "tokenizer/detail/utf8.h"

namespace flexh2o {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Strips up to `count` copies of `what` from the front (or back) of s, in place.
void strip_front(std::string& s, const std::string& what, int count) {
  std::size_t b = 0;
  for (int k = 0; k < count && !what.empty() && s.compare(b, what.size(), what) == 0; ++k) b += what.size();
  s.erase(0, b);
}
void strip_back(std::string& s, const std::string& what, int count) {
  for (int k = 0; k < count && !what.empty() && s.size() >= what.size() &&
                  s.compare(s.size() - what.size(), what.size(), what) == 0;
       ++k)
    s.resize(s.size() - what.size());
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  const Impl& im = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special) out.insert(out.end(), im.prefix.begin(), im.prefix.end());

  auto encode_segment = [&](std::size_t b, std::size_t e) {
    if (e <= b) return;
    std::string norm = tok::normalize(im.normalizers, std::string(text.substr(b, e - b)));
    for (const auto& piece : tok::pre_tokenize(im.pre_tokenizers, tok::Piece{std::move(norm), b == 0}))
      im.model->encode_word(piece.text, out);
  };

  // Added tokens are matched on the raw text, longest first, before anything else runs.
  std::size_t seg_start = 0;
  for (std::size_t i = 0; i < text.size();) {
    const tok::AddedToken* hit = nullptr;
    for (uint32_t k : im.added_by_first_byte[static_cast<unsigned char>(text[i])]) {
      const auto& a = im.added[k];
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    std::size_t b = i, e = i + hit->content.size();
    if (hit->lstrip)
      while (b > seg_start && is_space(text[b - 1])) --b;
    if (hit->rstrip)
      while (e < text.size() && is_space(text[e])) ++e;
    encode_segment(seg_start, b);
    out.push_back(hit->id);
    seg_start = i = e;
  }
  encode_segment(seg_start, text.size());

  if (add_special) out.insert(out.end(), im.suffix.begin(), im.suffix.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string raw;
  bool first = true;
  for (int32_t id : ids) {
    if (!known(id) || (skip_special && is_special(id))) continue;
    if (im.decode.join_with_space && !first) raw.push_back(' ');
    raw.append(token_bytes(id));
    first = false;
  }
  strip_front(raw, im.decode.strip_char, im.decode.strip_leading);
  strip_back(raw, im.decode.strip_char, im.decode.strip_trailing);
  std::string out;
  out.reserve(raw.size());
  tok::append_utf8_lossy(raw, out, /*final=*/true);
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->token_strings.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }

bool Tokenizer::known(int32_t id) const {
  FH_CHECK(id >= 0, "token id ", id, " is negative");
  return id < vocab_size();
}

bool Tokenizer::is_special(int32_t id) const { return known(id) && impl_->special[id] != 0; }

const std::string& Tokenizer::token_string(int32_t id) const {
  FH_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " is out of range [0, ", vocab_size(), ")");
  return impl_->token_strings[id];
}

std::string Tokenizer::token_bytes(int32_t id) const { return known(id) ? impl_->token_bytes[id] : std::string(); }

// ---------------------------------------------------------------------------------------------
// StreamingDecoder
// ---------------------------------------------------------------------------------------------

StreamingDecoder::StreamingDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(&tok), skip_special_(skip_special) {}

std::string StreamingDecoder::push(int32_t id) {
  if (!tok_->known(id) || (tok_->is_special(id) && skip_special_)) return {};
  const auto& plan = tok_->impl_->decode;
  if (plan.join_with_space && !first_token_) pending_.push_back(' ');
  first_token_ = false;
  pending_.append(tok_->impl_->token_bytes[id]);
  // The decoder's leading strip applies to the start of the whole output, as in decode().
  while (at_start_ && !pending_.empty()) {
    const std::string& c = plan.strip_char;
    if (stripped_ >= plan.strip_leading || c.empty()) {
      at_start_ = false;
    } else if (pending_.starts_with(c)) {
      pending_.erase(0, c.size());
      ++stripped_;
    } else if (c.starts_with(pending_)) {
      return {};  // could still become a strip character
    } else {
      at_start_ = false;
    }
  }
  std::string out;
  std::size_t used = tok::append_utf8_lossy(pending_, out, /*final=*/false);
  pending_.erase(0, used);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out;
  const auto& plan = tok_->impl_->decode;
  strip_back(pending_, plan.strip_char, plan.strip_trailing);
  tok::append_utf8_lossy(pending_, out, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace flexh2o
