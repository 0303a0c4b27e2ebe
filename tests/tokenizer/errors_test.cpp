// Bad input: missing files, malformed JSON, merges naming unknown tokens, unsupported
// tokenizer.json component types. Every error must name the file/field or type at fault.
#include "tokenizer/tokenizer.h"
#include "tokenizer/test_util.h"

namespace flexh2o {
namespace {

using test::data_dir;
using test::read_json;
using test::ScratchDir;
using test::write_file;
using test::expect_load_error;

TEST(LoadErrors, MissingDirectory) {
  expect_load_error("/nonexistent/flexh2o/tok", {"/nonexistent/flexh2o/tok", "does not exist"});
}

TEST(LoadErrors, NoTokenizerFiles) {
  ScratchDir dir;
  write_file(dir.path() / "vocab.json", "{}");  // merges.txt missing: not a GPT-2 dir either
  expect_load_error(dir.path(), {"no tokenizer found", "tokenizer.json", "vocab.json + merges.txt"});
}

TEST(LoadErrors, MalformedVocabJson) {
  ScratchDir dir;
  write_file(dir.path() / "vocab.json", "{\"a\": 0, \"b\": ");
  write_file(dir.path() / "merges.txt", "#version: 0.2\n");
  expect_load_error(dir.path(), {"vocab.json", "not valid JSON"});
  write_file(dir.path() / "vocab.json", "{\"a\": \"zero\"}");
  expect_load_error(dir.path(), {"vocab.json", "\"a\""});
}

// Decision: a merge naming a token absent from vocab.json is an error (Hugging Face tokenizers
// refuses such files too); silently skipping it would hide a mismatched vocab/merges pair.
TEST(LoadErrors, MergeWithUnknownToken) {
  ScratchDir dir;
  write_file(dir.path() / "vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  write_file(dir.path() / "merges.txt", "#version: 0.2\na b\nab zz\n");
  expect_load_error(dir.path(), {"merges.txt", "'zz'", "merge 2"});
  write_file(dir.path() / "merges.txt", "#version: 0.2\na b c\n");
  expect_load_error(dir.path(), {"merges.txt", "line 2"});
  write_file(dir.path() / "merges.txt", "#version: 0.2\na b\n");  // and the good file loads
  const auto tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.encode("ab", false), std::vector<int32_t>{2});
}

TEST(LoadErrors, MalformedTokenizerConfig) {
  ScratchDir dir;
  for (const char* f : {"vocab.json", "merges.txt"}) std::filesystem::copy_file(data_dir() / "tiny-opt" / f, dir.path() / f);
  write_file(dir.path() / "tokenizer_config.json", "{not json");
  expect_load_error(dir.path(), {"tokenizer_config.json", "not valid JSON"});
  write_file(dir.path() / "tokenizer_config.json", R"({"bos_token": 5})");
  expect_load_error(dir.path(), {"tokenizer_config.json", "bos_token"});
  write_file(dir.path() / "tokenizer_config.json", R"({"add_bos_token": true, "bos_token": "<nope>"})");
  expect_load_error(dir.path(), {"tokenizer_config.json", "add_bos_token", "bos_token"});
}

// Writes the llama3 tokenizer.json with `edit` applied, and expects the load to fail naming `parts`.
template <typename Edit>
void expect_json_error(Edit edit, std::initializer_list<std::string> parts) {
  ScratchDir dir;
  auto j = read_json(data_dir() / "tokenizers/llama3/tokenizer.json");
  edit(j);
  write_file(dir.path() / "tokenizer.json", j.dump());
  expect_load_error(dir.path(), parts);
}

TEST(TokenizerJsonErrors, UnknownComponentTypesAreNamed) {
  using nlohmann::json;
  expect_json_error([](json& j) { j["model"]["type"] = "WordPiece"; }, {"tokenizer.json", "model", "\"WordPiece\""});
  expect_json_error([](json& j) { j["model"]["type"] = "Unigram"; }, {"\"Unigram\""});
  expect_json_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["type"] = "UnicodeScripts"; },
                    {"tokenizer.json", "pre_tokenizer.pretokenizers[1]", "\"UnicodeScripts\""});
  expect_json_error([](json& j) { j["normalizer"] = {{"type", "Nmt"}}; }, {"tokenizer.json: normalizer:", "\"Nmt\""});
  expect_json_error([](json& j) { j["decoder"] = {{"type", "CTC"}}; }, {"decoder", "\"CTC\""});
  expect_json_error([](json& j) { j["post_processor"] = {{"type", "Mystery"}}; }, {"post_processor", "\"Mystery\""});
}

// sentencepiece's precompiled_charsmap is a compiled trie of its own: refused by name.
TEST(TokenizerJsonErrors, PrecompiledNormalizerIsRefusedByName) {
  using nlohmann::json;
  expect_json_error(
      [](json& j) {
        j["normalizer"] = {{"type", "Sequence"},
                           {"normalizers", json::array({{{"type", "NFKC"}},
                                                        {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}}})}};
      },
      {"tokenizer.json", "normalizer.normalizers[1]", "\"Precompiled\"", "precompiled_charsmap"});
}

// Each bad field of the new component types: the message names the file, the JSON path, the
// field and the value.
TEST(TokenizerJsonErrors, UnknownFieldIsNamed) {
  using nlohmann::json;
  expect_json_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behaviour"] = "Isolated"; },
                    {"tokenizer.json", "pre_tokenizer.pretokenizers[0]", "unknown field \"behaviour\"",
                     "Split pre_tokenizer", "known: pattern, behavior, invert"});
  expect_json_error([](json& j) { j["normalizer"] = {{"type", "NFC"}, {"form", "C"}}; },
                    {"normalizer", "unknown field \"form\"", "NFC normalizer", "known: none"});
  expect_json_error([](json& j) { j["normalizer"] = {{"type", "Strip"}, {"left", true}}; },
                    {"normalizer", "unknown field \"left\"", "strip_left"});
}

TEST(TokenizerJsonErrors, InvalidFieldValuesAreNamed) {
  using nlohmann::json;
  auto set_pt = [](json v) { return [v](json& j) { j["pre_tokenizer"]["pretokenizers"][0] = v; }; };
  expect_json_error(set_pt({{"type", "Digits"}, {"individual_digits", "yes"}}),
                    {"pre_tokenizer.pretokenizers[0]", "\"individual_digits\" must be true or false", "\"yes\""});
  expect_json_error(set_pt({{"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Isolate"}}),
                    {"pre_tokenizer.pretokenizers[0]", "unknown behavior \"Isolate\"", "MergedWithNext"});
  expect_json_error(set_pt({{"type", "Split"}, {"pattern", {{"Str", "x"}}}, {"behavior", "Isolated"}}),
                    {"pre_tokenizer.pretokenizers[0] (Split pattern)", "{\"Str\":\"x\"}"});
  expect_json_error(set_pt({{"type", "Split"}, {"pattern", {{"String", 5}}}, {"behavior", "Isolated"}}),
                    {"pre_tokenizer.pretokenizers[0] (Split pattern)", "{\"String\":5}"});
  expect_json_error(set_pt({{"type", "Punctuation"}, {"behavior", 3}}),
                    {"pre_tokenizer.pretokenizers[0]", "\"behavior\" must be a string, got 3"});
  expect_json_error(set_pt({{"type", "CharDelimiterSplit"}, {"delimiter", "ab"}}),
                    {"pre_tokenizer.pretokenizers[0]", "\"delimiter\" must be one character", "\"ab\""});
  expect_json_error(set_pt({{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}}),
                    {"pre_tokenizer.pretokenizers[0]", "unknown prepend_scheme \"sometimes\""});
  expect_json_error(set_pt({{"type", "Metaspace"}, {"replacement", ""}}),
                    {"pre_tokenizer.pretokenizers[0]", "\"replacement\" must not be empty"});
  expect_json_error(set_pt({{"type", "Sequence"}, {"pretokenizers", {{"type", "Digits"}}}}),
                    {"pre_tokenizer.pretokenizers[0]", "\"pretokenizers\" must be an array"});
  expect_json_error([](json& j) { j["normalizer"] = {{"type", "BertNormalizer"}, {"lowercase", 1}}; },
                    {"tokenizer.json: normalizer:", "\"lowercase\" must be true or false, got 1"});
  expect_json_error([](json& j) { j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "(x"}}}, {"content", ""}}; },
                    {"normalizer (Replace pattern)", "(x"});
  expect_json_error([](json& j) { j["normalizer"] = {{"type", 7}}; }, {"normalizer", "\"type\" must be a string, got 7"});
}

TEST(TokenizerJsonErrors, StructuralProblems) {
  using nlohmann::json;
  expect_json_error([](json& j) { j.erase("model"); }, {"tokenizer.json", "\"model\""});
  expect_json_error([](json& j) { j["model"]["merges"].push_back(json::array({"Ġ", "notatoken"})); },
                    {"tokenizer.json", "notatoken"});
  expect_json_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
                    {"tokenizer.json", "Split", "(unclosed"});
  expect_json_error([](json& j) { j["model"]["unk_token"] = "<missing-unk>"; }, {"<missing-unk>"});
  ScratchDir dir;
  write_file(dir.path() / "tokenizer.json", "{\"model\": {");
  expect_load_error(dir.path(), {"tokenizer.json", "not valid JSON"});
}

// Ids past the vocabulary (a model's table padded past its tokenizer's, which sampling can draw)
// add no text anywhere in a sequence, as Hugging Face tokenizers drop them, and stream so; a
// negative id is a bug and throws.
TEST(Decode, IdsPastTheVocabularyAddNoTextNegativeIdsThrow) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    SCOPED_TRACE(name);
    const auto tok = Tokenizer::load(data_dir() / name);
    const int32_t past = tok.vocab_size(), far = 999999;
    const std::vector<int32_t> ids = tok.encode("In the beginning God created", true);
    std::vector<int32_t> with = {past};
    for (int32_t id : ids) with.insert(with.end(), {id, far});
    for (bool skip : {false, true}) {
      EXPECT_EQ(tok.decode(with, skip), tok.decode(ids, skip));
      StreamingDecoder a(tok, skip), b(tok, skip);
      std::string sa, sb;
      for (int32_t id : with) sa += a.push(id);
      for (int32_t id : ids) sb += b.push(id);
      EXPECT_EQ(sa + a.flush(), sb + b.flush());
    }
    EXPECT_FALSE(tok.is_special(past));
    EXPECT_EQ(tok.token_bytes(far), "");
    EXPECT_THROW((void)tok.decode(std::vector<int32_t>{5, -1}), Error);
    StreamingDecoder dec(tok);
    EXPECT_THROW((void)dec.push(-3), Error);
  }
}

}  // namespace
}  // namespace flexh2o
