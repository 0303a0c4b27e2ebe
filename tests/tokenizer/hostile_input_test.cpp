// Hostile tokenizer files (issue #14 item 1): component trees nested 100000 deep (parsed
// recursively), token ids beyond int32 (used to wrap: 4294967298 became id 2), an id far beyond
// the vocabulary (used to allocate per-id tables of gigabytes), and FIFOs among the files.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>

#include "tokenizer/test_util.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o {
namespace {

using nlohmann::json;
using test::data_dir;
using test::read_json;
using test::ScratchDir;
using test::write_file;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

std::string load_error(const std::filesystem::path& dir) {
  try {
    (void)Tokenizer::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error loading " << dir;
  return "";
}

// The llama3 tokenizer.json with `edit` applied, written to `dir`.
void write_llama3(const ScratchDir& dir, const std::function<void(json&)>& edit) {
  json j = read_json(data_dir() / "tokenizers/llama3/tokenizer.json");
  edit(j);
  write_file(dir.path() / "tokenizer.json", j.dump());
}

TEST(HostileTokenizer, DeeplyNestedComponentsAreAnErrorNotAStackOverflow) {
  ScratchDir dir;
  // {"type": "Sequence", "normalizers": [ ... 100000 times ... ]}: parsed by recursion.
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"type": "Sequence", "normalizers": [)";
  for (int i = 0; i < 100000; ++i) deep += "]}";
  std::string text = read_json(data_dir() / "tokenizers/llama3/tokenizer.json").dump();
  text.insert(text.size() - 1, ", \"normalizer\": " + deep);
  write_file(dir.path() / "tokenizer.json", text);
  EXPECT_HAS(load_error(dir.path()), "tokenizer file " + (dir.path() / "tokenizer.json").string() +
                                         " nests arrays/objects more than 64 levels deep");
}

TEST(HostileTokenizer, IdsAboveInt32AreErrorsNotWrapped) {
  ScratchDir a;
  write_llama3(a, [](json& j) { j["model"]["vocab"]["zz-new"] = 4294967298ull; });
  EXPECT_HAS(load_error(a.path()),
             "model vocab id of \"zz-new\" must be an integer in [0, 2147483647], got 4294967298");
  ScratchDir b;
  write_llama3(b, [](json& j) { j["added_tokens"][0]["id"] = 4294967296ull; });
  EXPECT_HAS(load_error(b.path()), "added_tokens id must be an integer in [0, 2147483647], got 4294967296");
  ScratchDir c;
  write_file(c.path() / "vocab.json", R"({"a": 0, "b": 4294967298})");
  write_file(c.path() / "merges.txt", "#version: 0.2\n");
  EXPECT_HAS(load_error(c.path()), "vocab.json: id of token \"b\" must be an integer in [0, 2147483647]");
}

// One id of 20 million in an 801-token vocabulary used to size every per-id table by it
// (~1.4 GB); now it is refused before anything is allocated.
TEST(HostileTokenizer, IdFarBeyondTheVocabularyFailsBeforeAllocating) {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  const long before = ru.ru_maxrss;
  ScratchDir dir;
  write_llama3(dir, [](json& j) { j["model"]["vocab"]["zz-far"] = 20000000; });
  EXPECT_HAS(load_error(dir.path()), "token id 20000000 is far beyond the");
  ::getrusage(RUSAGE_SELF, &ru);
  EXPECT_LT(ru.ru_maxrss - before, 64 * 1024) << "KiB of peak RSS growth";
  // Ids with a modest gap (reserved ranges) still load.
  ScratchDir gap;
  write_llama3(gap, [](json& j) { j["model"]["vocab"]["zz-gap"] = 5000; });
  EXPECT_EQ(Tokenizer::load(gap.path()).vocab_size(), 5001);
}

TEST(HostileTokenizer, FifoConfigFileIsRefusedWithoutBlocking) {
  ScratchDir dir;
  for (const char* f : {"vocab.json", "merges.txt"})
    std::filesystem::copy_file(data_dir() / "tiny-opt" / f, dir.path() / f);
  const auto fifo = dir.path() / "tokenizer_config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string msg;
  auto f = std::async(std::launch::async, [&] { msg = load_error(dir.path()); });
  if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on a FIFO tokenizer_config.json for more than 2 s";
    ::close(::open(fifo.c_str(), O_WRONLY));
  }
  f.get();
  EXPECT_HAS(msg, "tokenizer file " + fifo.string() + " is a FIFO");
}

}  // namespace
}  // namespace flexh2o
