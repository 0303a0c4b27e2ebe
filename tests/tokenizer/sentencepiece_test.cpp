// tokenizer.model (sentencepiece BPE) checkpoints: the piece types transformers gives meaning
// (control = special, user-defined = matched but not special), BOS/EOS from the model, the
// tokenizer.json-first order, and malformed or unsupported model files, built here byte by
// byte so each error names what is wrong. The cases against transformers are in
// tokenizer_json_test.cpp (variants spm-*).
#include <fstream>

#include "tokenizer/tokenizer.h"
#include "tokenizer/test_util.h"

namespace flexh2o {
namespace {

using test::data_dir;
using test::ScratchDir;
using test::write_file;
using test::expect_load_error;

const std::filesystem::path& spm_model() {
  static const auto p = data_dir() / "tokenizers/spm-llama/tokenizer.model";
  return p;
}

// The protobuf wire format, enough to write ModelProto files by hand.
std::string varint(uint64_t v) {
  std::string s;
  do {
    s.push_back(char((v & 0x7F) | (v > 0x7F ? 0x80 : 0)));
    v >>= 7;
  } while (v);
  return s;
}
std::string field_varint(int field, uint64_t v) { return varint(uint64_t(field) << 3) + varint(v); }
std::string field_bytes(int field, const std::string& b) {
  return varint(uint64_t(field) << 3 | 2) + varint(b.size()) + b;
}
std::string piece(const std::string& text, int type = 1) {
  return field_bytes(
      1, field_bytes(1, text) + varint(2 << 3 | 5) + std::string(4, '\0') + field_varint(3, uint64_t(type)));
}
// pieces <unk> <s> </s> then `rest` (normal); trainer_spec with model_type and ids.
std::string model_proto(const std::vector<std::string>& rest, int model_type = 2, int64_t bos_id = 1) {
  std::string m = piece("<unk>", 2) + piece("<s>", 3) + piece("</s>", 3);
  for (const auto& r : rest) m += piece(r);
  return m + field_bytes(2, field_varint(3, uint64_t(model_type)) + field_varint(41, uint64_t(bos_id)));
}

TEST(SentencePiece, PieceTypesAndSpecialIds) {
  const auto tok = Tokenizer::load(data_dir() / "tokenizers/spm-llama");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.pad_id().has_value());
  for (int32_t id : {0, 1, 2}) EXPECT_TRUE(tok.is_special(id)) << id;
  // The control symbol is special, the user-defined one is not, and both are matched in text.
  const auto ctrl = tok.encode("<ctrl>", false), user = tok.encode("<|user|>", false);
  ASSERT_EQ(ctrl.size(), 1u);
  ASSERT_EQ(user.size(), 1u);
  EXPECT_TRUE(tok.is_special(ctrl[0]));
  EXPECT_FALSE(tok.is_special(user[0]));
  EXPECT_EQ(tok.token_string(user[0]), "<|user|>");
  EXPECT_EQ(tok.decode(tok.encode("a<ctrl>b", false), /*skip_special=*/true), "ab");
  // Byte fallback: "😀" is not in the training text.
  const auto emoji = tok.encode("\xF0\x9F\x98\x80", false);
  ASSERT_EQ(emoji.size(), 5u);
  EXPECT_EQ(tok.token_string(emoji[1]), "<0xF0>");
  EXPECT_EQ(tok.token_bytes(emoji[1]), "\xF0");
  EXPECT_EQ(tok.decode(emoji), "\xF0\x9F\x98\x80");
  EXPECT_EQ(tok.encode("In the beginning", true).front(), 1);
}

TEST(SentencePiece, ATokenizerJsonBesideItWins) {
  ScratchDir dir;
  std::filesystem::copy_file(spm_model(), dir.path() / "tokenizer.model");
  std::filesystem::copy_file(data_dir() / "tokenizers/llama2/tokenizer.json", dir.path() / "tokenizer.json");
  const auto from_json = Tokenizer::load(data_dir() / "tokenizers/llama2");
  const auto both = Tokenizer::load(dir.path());
  EXPECT_EQ(both.vocab_size(), from_json.vocab_size());
  EXPECT_NE(both.vocab_size(), Tokenizer::load(data_dir() / "tokenizers/spm-llama").vocab_size());
  EXPECT_TRUE(Tokenizer::present_in(dir.path()));
  std::filesystem::remove(dir.path() / "tokenizer.json");
  EXPECT_TRUE(Tokenizer::present_in(dir.path()));
  std::filesystem::remove(dir.path() / "tokenizer.model");
  EXPECT_FALSE(Tokenizer::present_in(dir.path()));
}

TEST(SentencePiece, AHandWrittenModelLoads) {
  // The smallest model this reader accepts, to show the error cases below differ from it in one
  // thing each: "▁a" merges from "▁" + "a", "ab" is not reachable (no "b").
  ScratchDir dir;
  write_file(dir.path() / "tokenizer.model", model_proto({"\xE2\x96\x81", "a", "\xE2\x96\x81" "a", "ab"}));
  const auto tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.encode("a", false), std::vector<int32_t>{5});
  EXPECT_EQ(tok.decode(std::vector<int32_t>{5, 5}), "a a");
  // As in transformers 5, only tokenizer_config.json's add_bos_token / add_eos_token add ids.
  EXPECT_EQ(tok.encode("a a", true), (std::vector<int32_t>{5, 5}));
  write_file(dir.path() / "tokenizer_config.json", R"({"add_bos_token": true, "add_eos_token": true})");
  EXPECT_EQ(Tokenizer::load(dir.path()).encode("a a", true), (std::vector<int32_t>{1, 5, 5, 2}));
}

TEST(SentencePieceErrors, MalformedFiles) {
  ScratchDir dir;
  const auto file = dir.path() / "tokenizer.model";
  write_file(file, "");
  expect_load_error(dir.path(), {file.string(), "holds no pieces"});
  write_file(file, "{\"model\": \"not a protobuf\"}");
  expect_load_error(dir.path(), {file.string(), "not a valid sentencepiece model"});
  const std::string good = test::slurp(spm_model());
  write_file(file, good.substr(0, good.size() / 2));
  expect_load_error(dir.path(), {file.string(), "runs past the end", "truncated"});
  write_file(file, std::string(12, '\xFF'));
  expect_load_error(dir.path(), {"varint is longer than 10 bytes", "at byte 0"});
  write_file(file, varint(1 << 3 | 3) + model_proto({"a"}));  // a group (wire type 3)
  expect_load_error(dir.path(), {"wire type 3"});
  write_file(file, varint(1 << 3 | 0) + varint(7));  // pieces as a varint
  expect_load_error(dir.path(), {"ModelProto.pieces", "wire type 0, expected 2"});
  write_file(file, field_bytes(1, field_varint(3, 1)) + model_proto({"a"}));  // a piece without its string
  expect_load_error(dir.path(), {"without its piece string", "at byte"});
}

TEST(SentencePieceErrors, BadPiecesAndUnsupportedModels) {
  ScratchDir dir;
  const auto file = dir.path() / "tokenizer.model";
  write_file(file, model_proto({"a", "b", "a"}));
  expect_load_error(dir.path(), {"piece \"a\" appears twice", "ids 3 and 5"});
  write_file(file, model_proto({"a", "\xC3"}));
  expect_load_error(dir.path(), {"piece 4", "not valid UTF-8"});
  write_file(file, model_proto({"a", ""}));
  expect_load_error(dir.path(), {"piece 4", "empty"});
  write_file(file, model_proto({"a", std::string(33000, 'x')}));  // 33000^2 > 2^30
  expect_load_error(dir.path(), {"pieces are too long", "at most 1073741824"});
  write_file(file, model_proto({"a"}, /*model_type=*/1));
  expect_load_error(dir.path(), {"unigram", "not supported", "only BPE"});
  write_file(file, model_proto({"a"}, /*model_type=*/4));
  expect_load_error(dir.path(), {"model_type 4", "not supported"});
}

TEST(SentencePieceErrors, TokenizerConfig) {
  ScratchDir dir;
  std::filesystem::copy_file(spm_model(), dir.path() / "tokenizer.model");
  write_file(dir.path() / "tokenizer_config.json", R"({"tokenizer_class": "T5Tokenizer"})");
  expect_load_error(dir.path(), {"tokenizer_config.json", "\"T5Tokenizer\"", "LlamaTokenizer is", "tokenizer.json"});
  write_file(dir.path() / "tokenizer_config.json", R"({"legacy": "yes"})");
  expect_load_error(dir.path(), {"tokenizer_config.json", "\"legacy\" must be true or false"});
  write_file(dir.path() / "tokenizer_config.json", R"({"add_prefix_space": 1})");
  expect_load_error(dir.path(), {"\"add_prefix_space\" must be true or false"});
  write_file(dir.path() / "tokenizer_config.json",
             R"({"tokenizer_class": "LlamaTokenizerFast", "legacy": null, "add_bos_token": true})");
  EXPECT_EQ(Tokenizer::load(dir.path()).encode("a", true).front(), 1);
}

TEST(SentencePieceErrors, NoBosPieceMeansNoneAdded) {
  // bos_id -1 (a model trained without <s>): nothing to prepend, and asking for it is an error.
  ScratchDir dir;
  write_file(dir.path() / "tokenizer.model", model_proto({"\xE2\x96\x81", "a"}, 2, /*bos_id=*/-1));
  EXPECT_EQ(Tokenizer::load(dir.path()).encode("a", true), (std::vector<int32_t>{3, 4}));
  EXPECT_FALSE(Tokenizer::load(dir.path()).bos_id().has_value());
  write_file(dir.path() / "tokenizer_config.json", R"({"add_bos_token": true})");
  expect_load_error(dir.path(), {"add_bos_token is true but bos_token is missing"});
}

}  // namespace
}  // namespace flexh2o
