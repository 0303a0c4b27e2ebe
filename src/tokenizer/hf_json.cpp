// Parses a Hugging Face tokenizer.json into Tokenizer::Impl: the BPE model, added_tokens, and
// the normalizer / pre_tokenizer / decoder / post_processor component trees. Unknown component
// types, and unknown or ill-typed fields of normalizers and pre-tokenizers, are rejected with an
// error naming the file, the JSON path and the type. tokenizer_config.json is in config.cpp.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_guard.h"
#include "tokenizer/detail/pipeline.h"
#include "tokenizer/detail/unicode.h"

namespace flexh2o::tok {

using nlohmann::json;

namespace {

// Context for error messages: "<file>: <where>". `where` is the JSON path of the component,
// e.g. "pre_tokenizer.pretokenizers[1]".
struct Ctx {
  std::string file;
  [[noreturn]] void fail(std::string_view where, std::string_view what) const {
    FH_FAIL(file, ": ", where, ": ", what);
  }
  const json& field(const json& obj, const char* key, std::string_view where) const {
    if (!obj.is_object() || !obj.contains(key)) fail(where, std::string("missing field \"") + key + "\"");
    return obj.at(key);
  }
  std::string str(const json& obj, const char* key, std::string_view where) const {
    const json& v = field(obj, key, where);
    if (!v.is_string()) fail(where, std::string("field \"") + key + "\" must be a string, got " + quote_json(v));
    return v.get<std::string>();
  }
  // A token id: an integer in [0, 2^31 - 1] (ids are int32; 4294967298 must not become 2).
  int32_t id(const json& v, const std::string& where) const {
    return int32_t(json_to_int(v, 0, INT32_MAX, file + ": " + where));
  }
  bool flag(const json& obj, const char* key, bool dflt, std::string_view where) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return dflt;
    const json& v = obj.at(key);
    if (!v.is_boolean()) fail(where, std::string("field \"") + key + "\" must be true or false, got " + quote_json(v));
    return v.get<bool>();
  }
  const json& array(const json& obj, const char* key, std::string_view where) const {
    const json& v = field(obj, key, where);
    if (!v.is_array()) fail(where, std::string("field \"") + key + "\" must be an array");
    return v;
  }
  // Refuses fields the component type does not have: a misspelt or newer option would
  // otherwise be ignored silently and tokenize differently from Hugging Face.
  void known_fields(const json& obj, std::string_view where, const std::string& type,
                    std::initializer_list<std::string_view> known) const {
    for (const auto& [key, v] : obj.items()) {
      if (key == "type") continue;
      bool ok = false;
      for (auto k : known) ok = ok || key == k;
      if (!ok) fail(where, "unknown field " + quote_prefix(key) + " in " + type + " (known: " + join(known) + ")");
    }
  }
  static std::string join(std::initializer_list<std::string_view> names) {
    std::string out;
    for (auto n : names) out += (out.empty() ? "" : ", ") + std::string(n);
    return out.empty() ? "none" : out;
  }
  static std::string quote_json(const json& v) {
    std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 60) + "..." : s;
  }
};

std::string type_of(const Ctx& ctx, const json& j, std::string_view where) {
  return ctx.str(j, "type", where);
}

Pattern parse_pattern(const Ctx& ctx, const json& j, std::string_view where) {
  const bool one = j.is_object() && j.size() == 1;
  if (one && j.contains("String") && j.at("String").is_string())
    return Pattern{j.at("String").get<std::string>(), nullptr};
  if (one && j.contains("Regex") && j.at("Regex").is_string()) {
    std::string what = ctx.file + ": " + std::string(where);
    return Pattern{{}, std::make_shared<Regex>(j.at("Regex").get<std::string>(), what)};
  }
  ctx.fail(where, "pattern must be {\"String\": \"...\"} or {\"Regex\": \"...\"}, got " + Ctx::quote_json(j));
}

Pattern regex_pattern(const Ctx& ctx, std::string_view re, std::string_view where) {
  return Pattern{{}, std::make_shared<Regex>(re, ctx.file + ": " + std::string(where))};
}

PrependScheme parse_prepend(const Ctx& ctx, const json& j, std::string_view where) {
  if (j.contains("prepend_scheme")) {
    std::string s = ctx.str(j, "prepend_scheme", where);
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    ctx.fail(where, "unknown prepend_scheme \"" + s + "\" (known: always, first, never)");
  }
  return ctx.flag(j, "add_prefix_space", true, where) ? PrependScheme::kAlways : PrependScheme::kNever;
}

std::string indexed(std::string_view where, const char* key, std::size_t i) {
  return std::string(where) + "." + key + "[" + std::to_string(i) + "]";
}

// ---------------------------------------------------------------------------------------------
// normalizer
// ---------------------------------------------------------------------------------------------

void parse_normalizer(const Ctx& ctx, const json& j, const std::string& where, std::vector<Normalizer>& out) {
  if (j.is_null()) return;
  const std::string type = type_of(ctx, j, where);
  const std::string what = type + " normalizer";
  Normalizer n{};
  if (type == "Sequence") {
    ctx.known_fields(j, where, what, {"normalizers"});
    const json& list = ctx.array(j, "normalizers", where);
    for (std::size_t i = 0; i < list.size(); ++i) parse_normalizer(ctx, list[i], indexed(where, "normalizers", i), out);
    return;
  } else if (type == "Prepend") {
    ctx.known_fields(j, where, what, {"prepend"});
    n.kind = Normalizer::Kind::kPrepend;
    n.content = ctx.str(j, "prepend", where);
  } else if (type == "Replace") {
    ctx.known_fields(j, where, what, {"pattern", "content"});
    n.kind = Normalizer::Kind::kReplace;
    n.content = ctx.str(j, "content", where);
    n.pattern = parse_pattern(ctx, ctx.field(j, "pattern", where), where + " (Replace pattern)");
  } else if (type == "Strip") {
    ctx.known_fields(j, where, what, {"strip_left", "strip_right"});
    n.kind = Normalizer::Kind::kStrip;
    n.left = ctx.flag(j, "strip_left", false, where);
    n.right = ctx.flag(j, "strip_right", false, where);
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    ctx.known_fields(j, where, what, {});
    n.kind = Normalizer::Kind::kUnicode;
    n.form = type == "NFC" ? NormForm::kNFC : type == "NFD" ? NormForm::kNFD : type == "NFKC" ? NormForm::kNFKC : NormForm::kNFKD;
  } else if (type == "Lowercase") {
    ctx.known_fields(j, where, what, {});
    n.kind = Normalizer::Kind::kLowercase;
  } else if (type == "StripAccents") {
    ctx.known_fields(j, where, what, {});
    n.kind = Normalizer::Kind::kStripAccents;
  } else if (type == "BertNormalizer") {
    ctx.known_fields(j, where, what, {"clean_text", "handle_chinese_chars", "strip_accents", "lowercase"});
    n.kind = Normalizer::Kind::kBert;
    n.bert.clean_text = ctx.flag(j, "clean_text", true, where);
    n.bert.handle_chinese_chars = ctx.flag(j, "handle_chinese_chars", true, where);
    n.bert.lowercase = ctx.flag(j, "lowercase", true, where);
    n.bert.strip_accents = ctx.flag(j, "strip_accents", n.bert.lowercase, where);  // null: follows lowercase
  } else if (type == "Precompiled") {
    ctx.fail(where, "normalizer type \"Precompiled\" (a sentencepiece precompiled_charsmap) is not supported");
  } else {
    ctx.fail(where, "unsupported normalizer type \"" + type +
                        "\" (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, "
                        "Replace, Prepend, BertNormalizer)");
  }
  out.push_back(std::move(n));
}

// ---------------------------------------------------------------------------------------------
// pre_tokenizer
// ---------------------------------------------------------------------------------------------

SplitBehavior parse_behavior(const Ctx& ctx, const json& j, std::string_view where) {
  const std::string s = ctx.str(j, "behavior", where);
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  ctx.fail(where, "unknown behavior \"" + s +
                      "\" (known: Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

// Character classes as tokenizers (Oniguruma regexes and Rust char predicates) defines them.
// \w: Alphabetic, marks, decimal digits, connector punctuation, ZWNJ/ZWJ (PCRE2's \w differs).
#define FH_WORD R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})"
// White_Space (PCRE2's \s lacks U+0085).
#define FH_SPACE R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})"
constexpr std::string_view kWhitespacePattern = "[" FH_WORD "]+|[^" FH_WORD FH_SPACE "]+";
// ASCII punctuation (which includes symbols such as $ + < = > ^ ` | ~) or Unicode P*.
constexpr std::string_view kPunctuationPattern = R"([\p{P}\x{21}-\x{2F}\x{3A}-\x{40}\x{5B}-\x{60}\x{7B}-\x{7E}])";
#undef FH_WORD
#undef FH_SPACE

PreTokenizer split_of(Pattern pattern, SplitBehavior behavior, bool invert = false) {
  PreTokenizer pt{};
  pt.kind = PreTokenizer::Kind::kSplit;
  pt.pattern = std::move(pattern);
  pt.behavior = behavior;
  pt.invert = invert;
  return pt;
}

void parse_pre_tokenizer(const Ctx& ctx, const json& j, const std::string& where, std::vector<PreTokenizer>& out) {
  if (j.is_null()) return;
  const std::string type = type_of(ctx, j, where);
  const std::string what = type + " pre_tokenizer";
  PreTokenizer pt{};
  if (type == "Sequence") {
    ctx.known_fields(j, where, what, {"pretokenizers"});
    const json& list = ctx.array(j, "pretokenizers", where);
    for (std::size_t i = 0; i < list.size(); ++i) parse_pre_tokenizer(ctx, list[i], indexed(where, "pretokenizers", i), out);
    return;
  } else if (type == "ByteLevel") {
    ctx.known_fields(j, where, what, {"add_prefix_space", "trim_offsets", "use_regex"});
    pt.kind = PreTokenizer::Kind::kByteLevel;
    pt.add_prefix_space = ctx.flag(j, "add_prefix_space", true, where);
    pt.use_regex = ctx.flag(j, "use_regex", true, where);
    (void)ctx.flag(j, "trim_offsets", true, where);  // offsets only
    if (pt.use_regex) pt.pattern = regex_pattern(ctx, kGpt2Pattern, where + " (ByteLevel regex)");
  } else if (type == "Split") {
    ctx.known_fields(j, where, what, {"pattern", "behavior", "invert"});
    pt = split_of(parse_pattern(ctx, ctx.field(j, "pattern", where), where + " (Split pattern)"),
                  parse_behavior(ctx, j, where), ctx.flag(j, "invert", false, where));
  } else if (type == "Digits") {
    ctx.known_fields(j, where, what, {"individual_digits"});
    const bool individual = ctx.flag(j, "individual_digits", false, where);
    pt = split_of(regex_pattern(ctx, individual ? R"(\p{N})" : R"(\p{N}+)", where), SplitBehavior::kIsolated);
  } else if (type == "Punctuation") {
    ctx.known_fields(j, where, what, {"behavior"});
    const auto behavior = j.contains("behavior") ? parse_behavior(ctx, j, where) : SplitBehavior::kIsolated;
    pt = split_of(regex_pattern(ctx, kPunctuationPattern, where), behavior);
  } else if (type == "Whitespace") {
    ctx.known_fields(j, where, what, {});
    pt = split_of(regex_pattern(ctx, kWhitespacePattern, where), SplitBehavior::kRemoved, /*invert=*/true);
  } else if (type == "CharDelimiterSplit") {
    ctx.known_fields(j, where, what, {"delimiter"});
    const std::string d = ctx.str(j, "delimiter", where);
    std::size_t len = 0;
    uint32_t cp = 0;
    if (d.empty() || !decode_codepoint(d, 0, &cp, &len) || len != d.size())
      ctx.fail(where, "field \"delimiter\" must be one character, got " + quote_prefix(d));
    pt = split_of(Pattern{d, nullptr}, SplitBehavior::kRemoved);
  } else if (type == "BertPreTokenizer") {
    ctx.known_fields(j, where, what, {});
    PreTokenizer ws{};
    ws.kind = PreTokenizer::Kind::kWhitespaceSplit;
    out.push_back(std::move(ws));
    pt = split_of(regex_pattern(ctx, kPunctuationPattern, where), SplitBehavior::kIsolated);
  } else if (type == "Metaspace") {
    ctx.known_fields(j, where, what, {"replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    pt.kind = PreTokenizer::Kind::kMetaspace;
    pt.replacement = ctx.str(j, "replacement", where);
    if (pt.replacement.empty()) ctx.fail(where, "field \"replacement\" must not be empty");
    pt.prepend = parse_prepend(ctx, j, where);
    pt.split = ctx.flag(j, "split", true, where);
  } else if (type == "WhitespaceSplit") {
    ctx.known_fields(j, where, what, {});
    pt.kind = PreTokenizer::Kind::kWhitespaceSplit;
  } else {
    ctx.fail(where, "unsupported pre_tokenizer type \"" + type +
                        "\" (supported: Sequence, ByteLevel, Split, Digits, Punctuation, Whitespace, "
                        "WhitespaceSplit, CharDelimiterSplit, BertPreTokenizer, Metaspace)");
  }
  out.push_back(std::move(pt));
}

// ---------------------------------------------------------------------------------------------
// decoder
// ---------------------------------------------------------------------------------------------

void parse_decoder(const Ctx& ctx, const json& j, DecodePlan& plan, bool& fused) {
  if (j.is_null()) return;
  const std::string where = "decoder";
  std::string type = type_of(ctx, j, where);
  if (type == "Sequence") {
    for (const auto& d : ctx.field(j, "decoders", where)) parse_decoder(ctx, d, plan, fused);
  } else if (type == "ByteLevel") {
    plan.per_token.push_back({DecodeStep::Kind::kByteLevel, {}, {}});
  } else if (type == "Replace") {
    plan.per_token.push_back({DecodeStep::Kind::kReplace,
                              parse_pattern(ctx, ctx.field(j, "pattern", where), "decoder Replace"),
                              ctx.str(j, "content", where)});
  } else if (type == "ByteFallback") {
    plan.per_token.push_back({DecodeStep::Kind::kByteFallback, {}, {}});
  } else if (type == "Fuse") {
    fused = true;
  } else if (type == "Strip") {
    DecodeStep s{DecodeStep::Kind::kStrip, {}, ctx.str(j, "content", where)};
    s.start = int(json_to_int(ctx.field(j, "start", where), 0, INT32_MAX, ctx.file + ": decoder Strip \"start\""));
    s.stop = int(json_to_int(ctx.field(j, "stop", where), 0, INT32_MAX, ctx.file + ": decoder Strip \"stop\""));
    if (fused) {  // after Fuse the whole text is one token
      plan.strip_char = s.content;
      plan.strip_leading = s.start;
      plan.strip_trailing = s.stop;
    } else {
      plan.per_token.push_back(std::move(s));
    }
  } else if (type == "Metaspace") {
    std::string rep = ctx.str(j, "replacement", where);
    plan.per_token.push_back({DecodeStep::Kind::kReplace, Pattern{rep, nullptr}, " "});
    if (parse_prepend(ctx, j, where) != PrependScheme::kNever) {
      plan.strip_char = " ";
      plan.strip_leading = 1;
    }
  } else {
    ctx.fail(where, "unsupported decoder type \"" + type +
                        "\" (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)");
  }
}

// ---------------------------------------------------------------------------------------------
// post_processor: reduced to the ids added before/after the text for a single sequence
// ---------------------------------------------------------------------------------------------

int32_t special_id(const Ctx& ctx, const json& pair, std::string_view where) {
  // Roberta/Bert processors store ["<s>", 0].
  if (!pair.is_array() || pair.size() != 2) ctx.fail(where, "expected [token, id]");
  return ctx.id(pair.at(1), std::string(where));
}

void parse_post_processor(const Ctx& ctx, const json& j, Tokenizer::Impl& impl) {
  if (j.is_null()) return;
  const std::string where = "post_processor";
  std::string type = type_of(ctx, j, where);
  impl.has_post_processor = true;
  if (type == "Sequence") {
    for (const auto& p : ctx.field(j, "processors", where)) parse_post_processor(ctx, p, impl);
  } else if (type == "ByteLevel") {
    // Offsets only: adds no tokens.
  } else if (type == "TemplateProcessing") {
    const json& specials = ctx.field(j, "special_tokens", where);
    std::vector<int32_t> pre, post;
    bool seen_a = false;
    for (const auto& item : ctx.field(j, "single", where)) {
      if (item.contains("Sequence")) {
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        std::string name = ctx.str(item.at("SpecialToken"), "id", where + " single");
        if (!specials.contains(name)) ctx.fail(where, "template names unknown special token \"" + name + "\"");
        for (const auto& id : ctx.field(specials.at(name), "ids", where))
          (seen_a ? post : pre).push_back(ctx.id(id, where + " special token \"" + name + "\""));
      } else {
        ctx.fail(where, "template item must be Sequence or SpecialToken");
      }
    }
    impl.prefix.insert(impl.prefix.begin(), pre.begin(), pre.end());
    impl.suffix.insert(impl.suffix.end(), post.begin(), post.end());
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    impl.prefix.insert(impl.prefix.begin(), special_id(ctx, ctx.field(j, "cls", where), where));
    impl.suffix.push_back(special_id(ctx, ctx.field(j, "sep", where), where));
  } else {
    ctx.fail(where, "unsupported post_processor type \"" + type +
                        "\" (supported: Sequence, ByteLevel, TemplateProcessing, RobertaProcessing, "
                        "BertProcessing)");
  }
}

// ---------------------------------------------------------------------------------------------
// model
// ---------------------------------------------------------------------------------------------

std::unique_ptr<BpeModel> parse_model(const Ctx& ctx, const json& m) {
  const std::string where = "model";
  std::string type = m.contains("type") ? m.at("type").get<std::string>() : "BPE";
  if (type != "BPE")
    ctx.fail(where, "unsupported model type \"" + type + "\" (only BPE is supported)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m.at(key).is_null() && !m.at(key).get<std::string>().empty())
      ctx.fail(where, std::string("\"") + key + "\" is not supported");
  }
  VocabMap vocab;
  const json& v = ctx.field(m, "vocab", where);
  if (!v.is_object()) ctx.fail(where, "\"vocab\" must be an object of token -> id");
  vocab.reserve(v.size());
  for (const auto& [tok, id] : v.items()) vocab.emplace(tok, ctx.id(id, "model vocab id of " + quote_prefix(tok)));
  std::vector<std::pair<std::string, std::string>> merges;
  if (m.contains("merges")) {
    for (const auto& mg : m.at("merges")) {
      if (mg.is_string()) {
        std::string s = mg.get<std::string>();
        auto sp = s.find(' ', 1);  // the first part may itself be a space in non-byte-level vocabs
        if (sp == std::string::npos) ctx.fail(where, "merge \"" + s + "\" is not \"a b\"");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (mg.is_array() && mg.size() == 2) {
        merges.emplace_back(mg.at(0).get<std::string>(), mg.at(1).get<std::string>());
      } else {
        ctx.fail(where, "merges must be \"a b\" strings or [a, b] pairs");
      }
    }
  }
  BpeModel::Options opts;
  if (m.contains("unk_token") && m.at("unk_token").is_string()) opts.unk_token = m.at("unk_token").get<std::string>();
  opts.byte_fallback = ctx.flag(m, "byte_fallback", false, where);
  opts.fuse_unk = ctx.flag(m, "fuse_unk", false, where);
  opts.ignore_merges = ctx.flag(m, "ignore_merges", false, where);
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(opts), ctx.file + " model");
}

}  // namespace

std::unique_ptr<Tokenizer::Impl> load_tokenizer_json(const std::filesystem::path& file) {
  // Bounded nesting matters here beyond printing: Sequence components are parsed recursively.
  return load_tokenizer_doc(read_json_file(file, "tokenizer file"), file.string());
}

std::unique_ptr<Tokenizer::Impl> load_tokenizer_doc(const json& j, const std::string& source) {
  Ctx ctx{source};
  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->source = ctx.file;
  try {
    impl->model = parse_model(ctx, ctx.field(j, "model", "top level"));
    parse_normalizer(ctx, j.value("normalizer", json()), "normalizer", impl->normalizers);
    parse_pre_tokenizer(ctx, j.value("pre_tokenizer", json()), "pre_tokenizer", impl->pre_tokenizers);
    bool fused = false;
    const json decoder = j.value("decoder", json());
    impl->decode.join_with_space = decoder.is_null();
    parse_decoder(ctx, decoder, impl->decode, fused);
    parse_post_processor(ctx, j.value("post_processor", json()), *impl);
    if (j.contains("added_tokens")) {
      for (const auto& t : j.at("added_tokens")) {
        AddedToken a;
        a.id = ctx.id(ctx.field(t, "id", "added_tokens"), "added_tokens id");
        a.content = ctx.str(t, "content", "added_tokens");
        a.special = ctx.flag(t, "special", false, "added_tokens");
        a.lstrip = ctx.flag(t, "lstrip", false, "added_tokens");
        a.rstrip = ctx.flag(t, "rstrip", false, "added_tokens");
        impl->added.push_back(std::move(a));
      }
    }
  } catch (const json::exception& e) {
    FH_FAIL(ctx.file, ": unexpected JSON structure: ", json_error_text(e));
  }
  return impl;
}

}  // namespace flexh2o::tok
