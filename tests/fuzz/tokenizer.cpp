// Fuzz target, built twice: the tokenizer files of one checkpoint directory, loaded by
// Tokenizer::load as every command does, then used to encode and decode a fixed sample. The
// input is the files' contents separated by NUL bytes (FUZZ_TOKENIZER_FILES names them, see
// CMakeLists.txt): tokenizer.json [\0 tokenizer_config.json] for fuzz_tokenizer_json,
// vocab.json \0 merges.txt [\0 special_tokens_map.json] for fuzz_vocab_merges. With one file
// named (fuzz_sentencepiece: tokenizer.model, a protobuf that holds NULs) it is the whole input.
#include <initializer_list>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {

// Plain words, digits, spaces, a special-looking token, multi-byte UTF-8, text that Unicode
// normalization changes (ligature, full-width digit, superscript, combining accent, Hangul) and
// a stray byte.
constexpr std::string_view kSample =
    "Hello world, it's 2024!  </s><s> caf\xc3\xa9 \xe2\x96\x81x \xf0\x9f\x99\x82 \xff end "
    "\xef\xac\x81 \xef\xbc\x91\xc2\xb2 e\xcc\x81 \xe1\x84\x92\xe1\x85\xa1 \xc4\xb0 a|b-c";

void exercise(const flexh2o::Tokenizer& tok) {
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(kSample, special);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.vocab_size()) flexh2o::fuzz::finding("encode returned an id outside the vocabulary");
    (void)tok.decode(ids, /*skip_special=*/!special);
    flexh2o::StreamingDecoder dec(tok);
    for (int32_t id : ids) (void)dec.push(id);
    (void)dec.flush();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flexh2o;
  const std::filesystem::path& dir = fuzz::scratch();
  // JSON and merges.txt never hold a raw NUL; a part the input lacks leaves its file absent.
  std::string_view rest = fuzz::as_text(data, size);
  bool more = true;
  const std::initializer_list<const char*> names = {FUZZ_TOKENIZER_FILES};
  for (const char* name : names) {
    std::error_code ec;
    std::filesystem::remove(dir / name, ec);
    if (!more) continue;
    const size_t nul = names.size() == 1 ? std::string_view::npos : rest.find('\0');
    fuzz::write_file(dir / name, rest.substr(0, nul));
    more = nul != std::string_view::npos;
    if (more) rest.remove_prefix(nul + 1);
  }
  fuzz::expect_clean(dir.string(), [&] { exercise(Tokenizer::load(dir)); });
  return 0;
}
