// Parses a Hugging Face tokenizer.json into Tokenizer::Impl: the BPE model, added_tokens, and
// the normalizer / pre_tokenizer / decoder / post_processor component trees. Unknown component
// types are rejected with an error naming the type. tokenizer_config.json is handled in config.cpp.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_guard.h"
#include "tokenizer/detail/pipeline.h"

namespace flexh2o::tok {

using nlohmann::json;

namespace {

// Context for error messages: "<file>: <where>".
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
    if (!v.is_string()) fail(where, std::string("field \"") + key + "\" must be a string");
    return v.get<std::string>();
  }
  // A token id: an integer in [0, 2^31 - 1] (ids are int32; 4294967298 must not become 2).
  int32_t id(const json& v, const std::string& where) const {
    return int32_t(json_to_int(v, 0, INT32_MAX, file + ": " + where));
  }
  bool flag(const json& obj, const char* key, bool dflt) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return dflt;
    return obj.at(key).get<bool>();
  }
};

std::string type_of(const Ctx& ctx, const json& j, std::string_view where) {
  return ctx.str(j, "type", where);
}

Pattern parse_pattern(const Ctx& ctx, const json& j, std::string_view where) {
  if (j.is_object() && j.contains("String")) return Pattern{j.at("String").get<std::string>(), nullptr};
  if (j.is_object() && j.contains("Regex")) {
    std::string what = ctx.file + ": " + std::string(where);
    return Pattern{{}, std::make_shared<Regex>(j.at("Regex").get<std::string>(), what)};
  }
  ctx.fail(where, "pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

PrependScheme parse_prepend(const Ctx& ctx, const json& j, std::string_view where) {
  if (j.contains("prepend_scheme")) {
    std::string s = j.at("prepend_scheme").get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    ctx.fail(where, "unknown prepend_scheme \"" + s + "\"");
  }
  return ctx.flag(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

// ---------------------------------------------------------------------------------------------
// normalizer
// ---------------------------------------------------------------------------------------------

void parse_normalizer(const Ctx& ctx, const json& j, std::vector<Normalizer>& out) {
  if (j.is_null()) return;
  const std::string where = "normalizer";
  std::string type = type_of(ctx, j, where);
  if (type == "Sequence") {
    for (const auto& n : ctx.field(j, "normalizers", where)) parse_normalizer(ctx, n, out);
  } else if (type == "Prepend") {
    out.push_back({Normalizer::Kind::kPrepend, ctx.str(j, "prepend", where), {}});
  } else if (type == "Replace") {
    out.push_back({Normalizer::Kind::kReplace, ctx.str(j, "content", where),
                   parse_pattern(ctx, ctx.field(j, "pattern", where), where + " Replace")});
  } else if (type == "Strip") {
    Normalizer n{Normalizer::Kind::kStrip, {}, {}};
    n.left = ctx.flag(j, "strip_left", false);
    n.right = ctx.flag(j, "strip_right", false);
    out.push_back(std::move(n));
  } else {
    ctx.fail(where, "unsupported normalizer type \"" + type +
                        "\" (supported: Sequence, Prepend, Replace, Strip)");
  }
}

// ---------------------------------------------------------------------------------------------
// pre_tokenizer
// ---------------------------------------------------------------------------------------------

SplitBehavior parse_behavior(const Ctx& ctx, const std::string& s) {
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  ctx.fail("pre_tokenizer Split", "unknown behavior \"" + s + "\"");
}

void parse_pre_tokenizer(const Ctx& ctx, const json& j, std::vector<PreTokenizer>& out) {
  if (j.is_null()) return;
  const std::string where = "pre_tokenizer";
  std::string type = type_of(ctx, j, where);
  PreTokenizer pt{};
  if (type == "Sequence") {
    for (const auto& p : ctx.field(j, "pretokenizers", where)) parse_pre_tokenizer(ctx, p, out);
    return;
  } else if (type == "ByteLevel") {
    pt.kind = PreTokenizer::Kind::kByteLevel;
    pt.add_prefix_space = ctx.flag(j, "add_prefix_space", true);
    pt.use_regex = ctx.flag(j, "use_regex", true);
    if (pt.use_regex)
      pt.pattern = Pattern{{}, std::make_shared<Regex>(kGpt2Pattern, ctx.file + ": ByteLevel regex")};
  } else if (type == "Split") {
    pt.kind = PreTokenizer::Kind::kSplit;
    pt.pattern = parse_pattern(ctx, ctx.field(j, "pattern", where), "pre_tokenizer Split");
    pt.behavior = parse_behavior(ctx, ctx.str(j, "behavior", where));
    pt.invert = ctx.flag(j, "invert", false);
  } else if (type == "Metaspace") {
    pt.kind = PreTokenizer::Kind::kMetaspace;
    pt.replacement = ctx.str(j, "replacement", where);
    pt.prepend = parse_prepend(ctx, j, where);
    pt.split = ctx.flag(j, "split", true);
  } else if (type == "WhitespaceSplit") {
    pt.kind = PreTokenizer::Kind::kWhitespaceSplit;
  } else {
    ctx.fail(where, "unsupported pre_tokenizer type \"" + type +
                        "\" (supported: Sequence, ByteLevel, Split, Metaspace, WhitespaceSplit)");
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
  opts.byte_fallback = ctx.flag(m, "byte_fallback", false);
  opts.fuse_unk = ctx.flag(m, "fuse_unk", false);
  opts.ignore_merges = ctx.flag(m, "ignore_merges", false);
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(opts), ctx.file + " model");
}

}  // namespace

std::unique_ptr<Tokenizer::Impl> load_tokenizer_json(const std::filesystem::path& file) {
  Ctx ctx{file.string()};
  // Bounded nesting matters here beyond printing: Sequence components are parsed recursively.
  const json j = read_json_file(file, "tokenizer file");
  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->source = ctx.file;
  try {
    impl->model = parse_model(ctx, ctx.field(j, "model", "top level"));
    parse_normalizer(ctx, j.value("normalizer", json()), impl->normalizers);
    parse_pre_tokenizer(ctx, j.value("pre_tokenizer", json()), impl->pre_tokenizers);
    bool fused = false;
    parse_decoder(ctx, j.value("decoder", json()), impl->decode, fused);
    parse_post_processor(ctx, j.value("post_processor", json()), *impl);
    if (j.contains("added_tokens")) {
      for (const auto& t : j.at("added_tokens")) {
        AddedToken a;
        a.id = ctx.id(ctx.field(t, "id", "added_tokens"), "added_tokens id");
        a.content = ctx.str(t, "content", "added_tokens");
        a.special = ctx.flag(t, "special", false);
        a.lstrip = ctx.flag(t, "lstrip", false);
        a.rstrip = ctx.flag(t, "rstrip", false);
        impl->added.push_back(std::move(a));
      }
    }
  } catch (const json::exception& e) {
    FH_FAIL(ctx.file, ": unexpected JSON structure: ", e.what());
  }
  return impl;
}

}  // namespace flexh2o::tok
