// Reference cases of the tiny test models (vocab.json + merges.txt, GPT-2 byte-level BPE):
// ids, tokens and decoded text must match exactly; BOS conventions of OPT and LLaMA; a bare
// GPT-2 directory without configs; eval-text speed and round trip; concurrent use.
#include <chrono>
#include <thread>

#include "tokenizer/tokenizer.h"
#include "tokenizer/test_util.h"

namespace flexh2o {
namespace {

using test::data_dir;
using test::read_json;

class ReferenceCases : public ::testing::TestWithParam<const char*> {};

TEST_P(ReferenceCases, MatchExactly) {
  const auto dir = data_dir() / GetParam();
  const auto tok = Tokenizer::load(dir);
  const auto ref = read_json(dir / "reference/tokenizer_cases.json");
  const int32_t bos = ref.at("bos_token_id").get<int32_t>();
  ASSERT_GT(ref.at("cases").size(), 10u);
  for (const auto& c : ref.at("cases")) {
    const std::string text = c.at("text");
    SCOPED_TRACE("text: \"" + text + "\"");
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto ids = tok.encode(text, false);
    EXPECT_EQ(ids, want);
    const auto tokens = c.at("tokens").get<std::vector<std::string>>();
    ASSERT_EQ(ids.size(), tokens.size());
    for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(tok.token_string(ids[i]), tokens[i]);
    EXPECT_EQ(tok.decode(want), c.at("decoded").get<std::string>());
    auto with_bos = want;
    with_bos.insert(with_bos.begin(), bos);
    EXPECT_EQ(tok.encode(text, true), with_bos);
  }
}

TEST_P(ReferenceCases, SpecialTokens) {
  const auto dir = data_dir() / GetParam();
  const auto tok = Tokenizer::load(dir);
  const auto ref = read_json(dir / "reference/tokenizer_cases.json");
  EXPECT_EQ(tok.bos_id(), ref.at("bos_token_id").get<int32_t>());
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.pad_id(), 1);
  EXPECT_EQ(tok.vocab_size(), 4096);
  for (int32_t id : {0, 1, 2, 3}) EXPECT_TRUE(tok.is_special(id)) << id;
  EXPECT_FALSE(tok.is_special(4));
  // Special-token text inside the input is matched before BPE.
  EXPECT_EQ(tok.encode("</s><s>", false), (std::vector<int32_t>{2, 0}));
  const auto ids = tok.encode("a</s>b", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(tok.decode(ids), "a</s>b");
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "ab");
  EXPECT_EQ(tok.token_string(1372), "\xC4\xA0world");  // "Ġworld"
  EXPECT_EQ(tok.token_bytes(1372), " world");
  EXPECT_THROW(tok.token_string(4096), Error);
  EXPECT_THROW(tok.token_bytes(-1), Error);
}

TEST_P(ReferenceCases, EvalTextIsFastAndRoundTrips) {
  const auto dir = data_dir() / GetParam();
  const auto tok = Tokenizer::load(dir);
  const std::string text = test::slurp(dir / "reference/eval.txt");
  ASSERT_GT(text.size(), 5000u);
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(text, false);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("encode_ms", std::to_string(ms));
  EXPECT_LT(ms, 250.0) << "encoding " << text.size() << " bytes took " << ms << " ms";
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(tok.decode(ids), text);
}

// Threads share one tokenizer from cold: they fill its word cache together, then read from it.
TEST_P(ReferenceCases, SharedConstAcrossThreads) {
  const auto dir = data_dir() / GetParam();
  const auto tok = Tokenizer::load(dir);
  const std::string text = test::slurp(dir / "reference/eval.txt");
  const auto want = Tokenizer::load(dir).encode(text, true);
  std::vector<std::vector<int32_t>> got(4), again(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      got[i] = tok.encode(text, true);
      again[i] = tok.encode(text, true);
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], want);
    EXPECT_EQ(again[i], want);
  }
}

// More distinct words than the word cache holds, some longer than it keeps: the ids a word gets
// are the same merged, cached, or past the cache's bounds.
TEST_P(ReferenceCases, WordsPastTheCachesBoundsEncodeAlike) {
  const auto dir = data_dir() / GetParam();
  std::string text;
  uint64_t x = 88172645463325252ull;
  for (int w = 0; w < 12000; ++w) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const int len = w % 97 == 0 ? 300 : int(3 + x % 9);
    text += ' ';
    for (int k = 0; k < len; ++k) text += char('a' + (x >> (k % 50)) % 26);
  }
  const auto tok = Tokenizer::load(dir);
  const auto first = tok.encode(text, false), second = tok.encode(text, false);
  EXPECT_EQ(first, second);
  // Each word alone, on a fresh tokenizer, as the whole text has it.
  const auto fresh = Tokenizer::load(dir);
  std::vector<int32_t> words;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find(' ', at + 1), text.size());
    const auto ids = fresh.encode(text.substr(at, end - at), false);
    words.insert(words.end(), ids.begin(), ids.end());
    at = end;
  }
  EXPECT_EQ(words, first);
  // Against merging alone: a sample of the cached words, each on a tokenizer that has seen no other.
  for (size_t at = 0, n = 0; at < text.size() && n < 10000; ++n) {
    const size_t end = std::min(text.find(' ', at + 1), text.size());
    if (n % 200 == 7) {
      const std::string word = text.substr(at, end - at);
      EXPECT_EQ(tok.encode(word, false), Tokenizer::load(dir).encode(word, false)) << word;
    }
    at = end;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ReferenceCases, ::testing::Values("tiny-opt", "tiny-llama"),
                         [](const auto& info) { return std::string(info.param == std::string("tiny-opt") ? "opt" : "llama"); });

// The same awkward + fuzzed texts as the tokenizer.json variants, through HF's BPE built from
// tiny-opt's vocab.json + merges.txt (tests/tools/make_tokenizer_cases.py).
TEST(VocabMergesFiles, MatchHuggingFaceOnFuzzedTexts) {
  const auto tok = Tokenizer::load(data_dir() / "tiny-opt");
  const auto ref = read_json(data_dir() / "tokenizers/tiny-opt-files/cases.json");
  ASSERT_GT(ref.at("cases").size(), 60u);
  for (const auto& c : ref.at("cases")) {
    const std::string text = c.at("text");
    SCOPED_TRACE("text: \"" + text + "\"");
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, false), want);
    EXPECT_EQ(tok.decode(want), text);
  }
}

// vocab.json + merges.txt with no configuration at all (a bare GPT-2 style directory).
TEST(BareGpt2Dir, EncodesWithoutConfig) {
  test::ScratchDir dir;
  for (const char* f : {"vocab.json", "merges.txt"})
    std::filesystem::copy_file(data_dir() / "tiny-opt" / f, dir.path() / f);
  const auto tok = Tokenizer::load(dir.path());
  EXPECT_FALSE(tok.bos_id().has_value());  // no <|endoftext|> in this vocab, no config
  EXPECT_FALSE(tok.eos_id().has_value());
  EXPECT_FALSE(tok.is_special(0));
  const auto ref = read_json(data_dir() / "tiny-opt/reference/tokenizer_cases.json");
  for (const auto& c : ref.at("cases")) {
    const std::string text = c.at("text");
    SCOPED_TRACE(text);
    EXPECT_EQ(tok.encode(text, false), c.at("ids").get<std::vector<int32_t>>());
    EXPECT_EQ(tok.encode(text, true), tok.encode(text, false));
  }
  // Without a config "<s>" is ordinary text.
  EXPECT_EQ(tok.encode("<s>", false).size(), 3u);
}

TEST(BareGpt2Dir, EndOfTextIsSpecialByDefault) {
  test::ScratchDir dir;
  auto vocab = read_json(data_dir() / "tiny-opt/vocab.json");
  vocab["<|endoftext|>"] = 4096;
  test::write_file(dir.path() / "vocab.json", vocab.dump());
  std::filesystem::copy_file(data_dir() / "tiny-opt/merges.txt", dir.path() / "merges.txt");
  const auto tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.vocab_size(), 4097);
  EXPECT_EQ(tok.bos_id(), 4096);
  EXPECT_EQ(tok.eos_id(), 4096);
  EXPECT_TRUE(tok.is_special(4096));
  const auto ids = tok.encode("a<|endoftext|>", false);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[1], 4096);
  EXPECT_EQ(tok.encode("a", true), tok.encode("a", false));  // GPT2Tokenizer adds no BOS
}

// OPT checkpoints without add_bos_token in tokenizer_config.json still get </s> prepended.
TEST(ConfigRules, OptDefaultsToBosWhenKeyAbsent) {
  test::ScratchDir dir;
  for (const char* f : {"vocab.json", "merges.txt", "config.json", "special_tokens_map.json"})
    std::filesystem::copy_file(data_dir() / "tiny-opt" / f, dir.path() / f);
  auto cfg = read_json(data_dir() / "tiny-opt/tokenizer_config.json");
  cfg.erase("add_bos_token");
  cfg["bos_token"] = {{"content", "</s>"}, {"lstrip", false}};  // object form
  test::write_file(dir.path() / "tokenizer_config.json", cfg.dump());
  const auto tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.encode("a", true), (std::vector<int32_t>{2, tok.encode("a", false)[0]}));
}

TEST(ConfigRules, AddEosToken) {
  test::ScratchDir dir;
  for (const char* f : {"vocab.json", "merges.txt", "special_tokens_map.json"})
    std::filesystem::copy_file(data_dir() / "tiny-llama" / f, dir.path() / f);
  auto cfg = read_json(data_dir() / "tiny-llama/tokenizer_config.json");
  cfg["add_eos_token"] = true;
  cfg["add_bos_token"] = false;
  test::write_file(dir.path() / "tokenizer_config.json", cfg.dump());
  const auto tok = Tokenizer::load(dir.path());
  const auto ids = tok.encode("a", true);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids.back(), 2);
}

}  // namespace
}  // namespace flexh2o
