// StreamingDecoder: pieces are always complete UTF-8, their concatenation equals decode(),
// characters split across byte-fallback / byte-level tokens are held back; invalid bytes -> U+FFFD.
#include "tokenizer/tokenizer.h"
#include "tokenizer/test_util.h"

namespace flexh2o {
namespace {

using test::data_dir;
using test::read_json;

const std::string kFffd = "\xEF\xBF\xBD";

bool complete_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

class Streaming : public ::testing::TestWithParam<std::string> {};

TEST_P(Streaming, ConcatenationEqualsDecode) {
  const auto dir = data_dir() / GetParam();
  const auto tok = Tokenizer::load(dir);
  const bool hf = std::filesystem::exists(dir / "cases.json");
  const auto ref = read_json(hf ? dir / "cases.json" : dir / "reference/tokenizer_cases.json");
  for (bool skip : {false, true}) {
    for (const auto& c : ref.at("cases")) {
      const std::string text = c.at("text");
      SCOPED_TRACE(text);
      const auto ids = tok.encode(text, true);
      StreamingDecoder dec(tok, skip);
      std::string all;
      for (int32_t id : ids) {
        std::string piece = dec.push(id);
        EXPECT_TRUE(complete_utf8(piece));
        all += piece;
      }
      all += dec.flush();
      EXPECT_EQ(all, tok.decode(ids, skip));
      EXPECT_EQ(all.find(kFffd), std::string::npos);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Streaming,
                         ::testing::Values("tiny-opt", "tokenizers/bytelevel", "tokenizers/llama2",
                                           "tokenizers/metaspace", "tokenizers/llama3",
                                           "tokenizers/digits-bytelevel", "tokenizers/nfkc-punct",
                                           "tokenizers/metaspace-nfc", "tokenizers/bert"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '/' || c == '-') c = '_';
                           return n;
                         });

int32_t byte_id(int b) { return 3 + b; }  // llama2 layout: <unk> <s> </s> then <0x00>..<0xFF>

TEST(StreamingDecoder, EmojiSplitOverByteFallbackTokens) {
  const auto tok = Tokenizer::load(data_dir() / "tokenizers/llama2");
  StreamingDecoder dec(tok);
  const auto ok = tok.encode("ok", false);  // "▁ok" pieces: the leading space is stripped
  std::string head;
  for (int32_t id : ok) head += dec.push(id);
  EXPECT_EQ(head, "ok");
  EXPECT_EQ(dec.push(byte_id(0xF0)), "");
  EXPECT_EQ(dec.push(byte_id(0x9F)), "");
  EXPECT_EQ(dec.push(byte_id(0x98)), "");
  EXPECT_EQ(dec.push(byte_id(0x80)), "\xF0\x9F\x98\x80");
  EXPECT_EQ(dec.flush(), "");
}

TEST(StreamingDecoder, EmojiSplitOverByteLevelTokens) {
  const auto tok = Tokenizer::load(data_dir() / "tiny-opt");
  const auto ids = tok.encode("\xF0\x9F\x98\x80!", false);  // byte-level: one token per byte here
  ASSERT_GE(ids.size(), 2u);
  StreamingDecoder dec(tok);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(dec.push(id));
  pieces.push_back(dec.flush());
  std::string all;
  for (const auto& p : pieces) {
    EXPECT_TRUE(complete_utf8(p));
    all += p;
  }
  EXPECT_EQ(all, "\xF0\x9F\x98\x80!");
  EXPECT_EQ(pieces[0], "");  // the first byte alone is held back
}

TEST(StreamingDecoder, IncompleteAtFlushBecomesReplacement) {
  const auto tok = Tokenizer::load(data_dir() / "tokenizers/llama2");
  StreamingDecoder dec(tok);
  EXPECT_EQ(dec.push(byte_id(0xE2)), "");
  EXPECT_EQ(dec.push(byte_id(0x82)), "");
  EXPECT_EQ(dec.flush(), kFffd);
}

TEST(StreamingDecoder, InvalidSequenceIsReplacedWithoutWaiting) {
  const auto tok = Tokenizer::load(data_dir() / "tokenizers/llama2");
  StreamingDecoder dec(tok);
  EXPECT_EQ(dec.push(byte_id(0xE2)), "");
  EXPECT_EQ(dec.push(byte_id(0x41)), kFffd + "A");  // 'A' cannot continue E2: E2 is replaced
  EXPECT_EQ(dec.push(byte_id(0xFF)), kFffd);        // never valid in UTF-8
  EXPECT_EQ(dec.flush(), "");
}

TEST(StreamingDecoder, SkipsSpecialTokens) {
  const auto tok = Tokenizer::load(data_dir() / "tiny-opt");
  StreamingDecoder keep(tok, false), skip(tok, true);
  EXPECT_EQ(keep.push(2), "</s>");
  EXPECT_EQ(skip.push(2), "");
}

TEST(Decode, InvalidUtf8BecomesReplacement) {
  const auto tok = Tokenizer::load(data_dir() / "tokenizers/llama2");
  auto ids = [](std::initializer_list<int> bytes) {
    std::vector<int32_t> v;
    for (int b : bytes) v.push_back(byte_id(b));
    return v;
  };
  EXPECT_EQ(tok.decode(ids({0xFF})), kFffd);
  EXPECT_EQ(tok.decode(ids({0xC3})), kFffd);
  EXPECT_EQ(tok.decode(ids({0xC3, 0xA9})), "\xC3\xA9");
  EXPECT_EQ(tok.decode(ids({0xE2, 0x82, 0x41})), kFffd + "A");  // one U+FFFD per maximal subpart
  EXPECT_EQ(tok.decode(ids({0xED, 0xA0, 0x80})), kFffd + kFffd + kFffd);  // surrogate
  EXPECT_EQ(tok.decode(ids({0xF0, 0x9F, 0x98})), kFffd);
  EXPECT_EQ(tok.decode(ids({0x80, 0x41})), kFffd + "A");
}

TEST(Decode, ByteLevelInvalidBytes) {
  const auto tok = Tokenizer::load(data_dir() / "tiny-opt");
  // Byte-level tokens for 0xE9 ('é' as a raw Latin-1 byte) alone are invalid UTF-8.
  const auto ids = tok.encode("\xC3\xA9", false);
  ASSERT_FALSE(ids.empty());
  std::string bytes;
  for (int32_t id : ids) bytes += tok.token_bytes(id);
  EXPECT_EQ(bytes, "\xC3\xA9");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{ids.back()}), ids.size() == 1 ? "\xC3\xA9" : kFffd);
}

}  // namespace
}  // namespace flexh2o
