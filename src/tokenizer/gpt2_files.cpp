// Loads a GPT-2/OPT style tokenizer from vocab.json + merges.txt: byte-level BPE with the GPT-2
// pre-tokeniser regex and ByteLevel decoder. Special tokens and BOS/EOS come from config.cpp.
// A merge naming a token absent from vocab.json is an error (as in Hugging Face tokenizers).
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_guard.h"
#include "tokenizer/detail/pipeline.h"

namespace flexh2o::tok {

std::unique_ptr<Tokenizer::Impl> load_vocab_merges(const std::filesystem::path& vocab_file,
                                                   const std::filesystem::path& merges_file) {
  const std::string vname = vocab_file.string(), mname = merges_file.string();
  VocabMap vocab;
  const nlohmann::json j = read_json_file(vocab_file, "tokenizer file");
  if (!j.is_object()) FH_FAIL(vname, ": expected a JSON object of token -> id");
  vocab.reserve(j.size());
  for (const auto& [tok, id] : j.items())
    vocab.emplace(tok, int32_t(json_to_int(id, 0, INT32_MAX, vname + ": id of token " + quote_prefix(tok))));

  std::vector<std::pair<std::string, std::string>> merges;
  std::string text = read_input_file(merges_file, "tokenizer file");
  std::size_t line_no = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    auto sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      FH_FAIL(mname, ": line ", line_no, " is not \"a b\": ", quote_prefix(line));
    merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
  }

  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->source = vname;
  impl->model = std::make_unique<BpeModel>(std::move(vocab), merges, BpeModel::Options{}, mname);
  PreTokenizer pt{};
  pt.kind = PreTokenizer::Kind::kByteLevel;
  pt.use_regex = true;
  pt.pattern = Pattern{{}, std::make_shared<Regex>(kGpt2Pattern, "GPT-2 pre-tokenizer")};
  impl->pre_tokenizers.push_back(std::move(pt));
  impl->decode.per_token.push_back({DecodeStep::Kind::kByteLevel, {}, {}});
  return impl;
}

}  // namespace flexh2o::tok
