// Tokenizer::load: finds the tokenizer files in a checkpoint directory (tokenizer.json,
// vocab.json + merges.txt, or tokenizer.model), then applies
// tokenizer_config.json / special_tokens_map.json / added_tokens.json (special tokens, BOS/EOS/PAD,
// add_bos_token/add_eos_token, add_prefix_space) and builds the per-id tables (finalize).
#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_guard.h"
#include "tokenizer/detail/pipeline.h"

namespace flexh2o {

namespace fs = std::filesystem;
using nlohmann::json;

namespace tok {

json read_optional_json(const fs::path& file) {
  const Status st = check_regular_file(file, "tokenizer file");
  if (st.code() == StatusCode::kNotFound) return json();
  st.throw_if_error();
  return read_json_file(file, "tokenizer file");
}

namespace {

// A special token entry is "text", {"content": "text", ...} or null.
std::optional<std::string> token_text(const json& v, const std::string& where) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  FH_FAIL(where, ": expected a string or an object with \"content\"");
}

AddedToken* find_added(Tokenizer::Impl& impl, std::string_view content) {
  for (auto& a : impl.added)
    if (a.content == content) return &a;
  return nullptr;
}


// Makes `content` a special added token (matched in text, is_special) when it has an id.
std::optional<int32_t> mark_special(Tokenizer::Impl& impl, const std::string& content) {
  if (auto* a = find_added(impl, content)) {
    a->special = true;
    return a->id;
  }
  auto id = impl.model->find(content);
  if (id) impl.added.push_back({content, *id, true, false, false});
  return id;
}

}  // namespace

void apply_configs(Tokenizer::Impl& impl, const fs::path& dir) {
  const fs::path cfg_file = dir / "tokenizer_config.json", map_file = dir / "special_tokens_map.json";
  const std::string cfg_name = cfg_file.string(), map_name = map_file.string();
  json cfg = read_optional_json(cfg_file);
  json map = read_optional_json(map_file);
  const std::string added_name = (dir / "added_tokens.json").string();
  json added_json = read_optional_json(added_name);
  if (!cfg.is_null() && !cfg.is_object()) FH_FAIL(cfg_name, ": expected a JSON object");
  if (!map.is_null() && !map.is_object()) FH_FAIL(map_name, ": expected a JSON object");

  try {
    if (cfg.contains("added_tokens_decoder")) {
      for (const auto& [key, t] : cfg.at("added_tokens_decoder").items()) {
        const std::string what = cfg_name + ": added_tokens_decoder key " + quote_prefix(key);
        const auto id = int32_t(parse_int(key, 0, INT32_MAX, what));
        if (std::any_of(impl.added.begin(), impl.added.end(), [&](const AddedToken& a) { return a.id == id; }))
          continue;  // tokenizer.json already declared it
        auto content = token_text(t, cfg_name + " added_tokens_decoder." + key);
        if (!content) continue;
        impl.added.push_back({*content, id, t.value("special", false), t.value("lstrip", false),
                              t.value("rstrip", false)});
      }
    }
    if (added_json.is_object()) {
      for (const auto& [content, id] : added_json.items()) {
        const auto i = int32_t(json_to_int(id, 0, INT32_MAX, added_name + ": id of " + quote_prefix(content)));
        if (!find_added(impl, content)) impl.added.push_back({content, i, false, false, false});
      }
    }

    // tokenizer_config.json wins over special_tokens_map.json, as in transformers.
    auto lookup = [&](const char* key) -> std::optional<std::string> {
      if (cfg.contains(key) && !cfg.at(key).is_null()) return token_text(cfg.at(key), cfg_name + " " + key);
      if (map.contains(key)) return token_text(map.at(key), map_name + " " + key);
      return std::nullopt;
    };
    auto bos = lookup("bos_token"), eos = lookup("eos_token"), pad = lookup("pad_token"), unk = lookup("unk_token");
    if (cfg.is_null() && map.is_null() && !impl.has_post_processor && impl.model->find("<|endoftext|>")) {
      bos = eos = unk = "<|endoftext|>";  // bare GPT-2 directory: GPT2Tokenizer's defaults
    }
    for (const json* src : {&cfg, &map}) {
      if (src->contains("additional_special_tokens"))
        for (const auto& t : src->at("additional_special_tokens"))
          if (auto c = token_text(t, "additional_special_tokens")) mark_special(impl, *c);
    }
    if (bos) impl.bos = mark_special(impl, *bos);
    if (eos) impl.eos = mark_special(impl, *eos);
    if (pad) impl.pad = mark_special(impl, *pad);
    if (unk) mark_special(impl, *unk);

    // Which ids encode(text, true) adds. transformers 5 drops the config's add_bos_token /
    // add_eos_token when a tokenizer.json is there (its post-processor, or none, decides); from
    // vocab.json + merges.txt or tokenizer.model the keys decide.
    const bool keys = !impl.from_tokenizer_json;
    bool has_bos_key = keys && cfg.contains("add_bos_token") && cfg.at("add_bos_token").is_boolean();
    bool has_eos_key = keys && cfg.contains("add_eos_token") && cfg.at("add_eos_token").is_boolean();
    if (has_bos_key || has_eos_key || !impl.has_post_processor) {
      bool add_bos = has_bos_key ? cfg.at("add_bos_token").get<bool>() : !impl.prefix.empty();
      bool add_eos = has_eos_key ? cfg.at("add_eos_token").get<bool>() : !impl.suffix.empty();
      if (!has_bos_key && !impl.has_post_processor && !impl.from_tokenizer_json) {
        // GPT2Tokenizer (vocab.json + merges.txt) defaults to no BOS, except OPT checkpoints,
        // which prepend </s>.
        json model_cfg = read_optional_json(dir / "config.json");
        add_bos = model_cfg.is_object() && model_cfg.value("model_type", "") == "opt";
      }
      if (add_bos && !impl.bos)
        FH_FAIL(cfg_name, ": add_bos_token is true but bos_token is missing or not in the vocabulary");
      if (add_eos && !impl.eos)
        FH_FAIL(cfg_name, ": add_eos_token is true but eos_token is missing or not in the vocabulary");
      impl.prefix.clear();
      impl.suffix.clear();
      if (add_bos) impl.prefix.push_back(*impl.bos);
      if (add_eos) impl.suffix.push_back(*impl.eos);
    }
    // add_prefix_space of GPT2Tokenizer configs applies to the vocab.json+merges.txt path.
    if (!impl.has_post_processor && cfg.contains("add_prefix_space") && cfg.at("add_prefix_space").is_boolean()) {
      for (auto& pt : impl.pre_tokenizers)
        if (pt.kind == PreTokenizer::Kind::kByteLevel) pt.add_prefix_space = cfg.at("add_prefix_space").get<bool>();
    }
  } catch (const json::exception& e) {
    FH_FAIL(cfg_name, ": unexpected JSON structure: ", json_error_text(e));
  }
}

}  // namespace tok

void Tokenizer::Impl::finalize() {
  int32_t max_id = -1;
  for (const auto& [s, id] : model->vocab()) max_id = std::max(max_id, id);
  for (const auto& a : added) max_id = std::max(max_id, a.id);
  // The per-id tables below cost ~70 bytes per id whether used or not: an id far beyond the
  // number of tokens the files define would allocate gigabytes from a small file. Real
  // vocabularies are dense; kMaxUnusedIds leaves room for reserved ranges.
  constexpr int64_t kMaxUnusedIds = 65536;
  const int64_t defined = int64_t(model->vocab().size() + added.size());
  if (int64_t(max_id) >= defined + kMaxUnusedIds)
    FH_FAIL(source, ": token id ", max_id, " is far beyond the ", defined,
            " tokens the tokenizer files define (at most ", kMaxUnusedIds, " ids may be unused); the vocabulary is corrupt.");
  const std::size_t n = static_cast<std::size_t>(max_id + 1);
  token_strings.assign(n, std::string());
  token_bytes.assign(n, std::string());
  special.assign(n, 0);
  for (const auto& [s, id] : model->vocab()) {
    token_strings[id] = s;
    token_bytes[id] = tok::decode_token(decode, s);
  }
  for (const auto& a : added) {
    token_strings[a.id] = a.content;
    token_bytes[a.id] = a.content;
    special[a.id] = a.special;
  }
  for (const auto* ids : {&prefix, &suffix})
    for (int32_t id : *ids)
      if (static_cast<std::size_t>(id) >= n)
        FH_FAIL(source, ": post-processor token id ", id, " is not in the vocabulary (", n, " ids).");
  // Longest content first so that "<|a|>x" is preferred over a prefix "<|a|>".
  std::stable_sort(added.begin(), added.end(),
                   [](const tok::AddedToken& a, const tok::AddedToken& b) { return a.content.size() > b.content.size(); });
  std::erase_if(added, [](const tok::AddedToken& a) { return a.content.empty(); });
  for (auto& v : added_by_first_byte) v.clear();
  for (std::size_t i = 0; i < added.size(); ++i)
    added_by_first_byte[static_cast<unsigned char>(added[i].content[0])].push_back(static_cast<uint32_t>(i));
}

bool Tokenizer::present_in(const fs::path& dir) {
  return fs::exists(dir / "tokenizer.json") || fs::exists(dir / "vocab.json") || fs::exists(dir / "tokenizer.model");
}

std::optional<Tokenizer> Tokenizer::load_if_present(const fs::path& dir) {
  if (!present_in(dir)) return std::nullopt;
  return load(dir);
}

Tokenizer Tokenizer::load(const fs::path& dir) {
  if (!fs::is_directory(dir)) FH_FAIL("tokenizer directory ", dir.string(), " does not exist or is not a directory");
  std::unique_ptr<Impl> impl;
  // transformers' order: a tokenizer.json wins over the files it was converted from.
  if (fs::exists(dir / "tokenizer.json")) {
    impl = tok::load_tokenizer_json(dir / "tokenizer.json");
    impl->from_tokenizer_json = true;
  } else if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    impl = tok::load_vocab_merges(dir / "vocab.json", dir / "merges.txt");
  } else if (fs::exists(dir / "tokenizer.model")) {
    impl = tok::load_sentencepiece(dir / "tokenizer.model", tok::read_optional_json(dir / "tokenizer_config.json"));
  } else {
    FH_FAIL("no tokenizer found in ", dir.string(),
            ": looked for tokenizer.json, vocab.json + merges.txt, or tokenizer.model",
            fs::exists(dir / "vocab.json") ? " (vocab.json is there, merges.txt is missing)" : "");
  }
  tok::apply_configs(*impl, dir);
  impl->finalize();
  return Tokenizer(std::move(impl));
}

}  // namespace flexh2o
