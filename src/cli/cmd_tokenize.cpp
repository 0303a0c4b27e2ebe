// `flexh2o tokenize` / `flexh2o detokenize`: JSONL text <-> ids with a tokenizer directory.
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o::cli {
using nlohmann::json;

void register_tokenize(CLI::App& app, TokenizeArgs& a, bool detokenize) {
  auto* t = detokenize ? app.add_subcommand("detokenize", "JSONL {\"ids\": [...]} -> {\"text\": ...}")
                       : app.add_subcommand("tokenize", "JSONL {\"text\": ...} -> {\"ids\": [...]}");
  t->add_option("--tokenizer,-t", a.tokenizer,
                "Directory with tokenizer.json, or vocab.json + merges.txt (no model needed)")->required();
  t->add_option("--input,-i", a.input, "JSONL input (default stdin)");
  t->add_option("--output,-o", a.output, "JSONL output (default stdout)");
  t->add_flag("--no-special", a.no_special,
              detokenize ? "Drop special tokens from the text" : "Do not add BOS/EOS");
}

int run_tokenize(const TokenizeArgs& a, bool detokenize) {
  Tokenizer tok = Tokenizer::load(a.tokenizer);
  std::ifstream in_file;
  if (!a.input.empty()) {
    check_regular_file(a.input, "--input").throw_if_error();  // before a blocking open
    in_file.open(a.input);
    if (!in_file) FH_FAIL("cannot read --input ", a.input);
  }
  std::ofstream out_file;
  if (!a.output.empty()) {
    out_file.open(a.output);
    if (!out_file) FH_FAIL("cannot write --output ", a.output);
  }
  std::istream& in = a.input.empty() ? std::cin : in_file;
  std::ostream& out = a.output.empty() ? std::cout : out_file;
  const std::string where = a.input.empty() ? "stdin" : a.input;
  int64_t bad = 0;
  auto fail = [&](int64_t line, const std::string& msg) {
    ++bad;
    std::cerr << "flexh2o: " << where << ":" << line << ": " << msg << "\n";
    out << json{{"line", line}, {"error", msg}}.dump() << "\n";
  };
  for_each_jsonl(
      in,
      [&](int64_t line, const json& j) {
        try {
          if (detokenize) {
            if (!j.contains("ids") || !j["ids"].is_array()) FH_FAIL("line has no \"ids\" array");
            auto ids = json_to_ids(j["ids"], "field \"ids\"");
            for (int32_t id : ids)
              if (id < 0 || id >= tok.vocab_size()) FH_FAIL("token id ", id, " is outside the vocabulary");
            out << json{{"text", tok.decode(ids, a.no_special)}}.dump(-1, ' ', false,
                                                                    json::error_handler_t::replace)
                << "\n";
          } else {
            if (!j.contains("text") || !j["text"].is_string()) FH_FAIL("line has no \"text\" string");
            out << json{{"ids", tok.encode(j["text"].get<std::string>(), !a.no_special)}}.dump() << "\n";
          }
        } catch (const std::exception& e) {
          fail(line, e.what());
        }
      },
      fail);
  return bad ? 1 : 0;
}

}  // namespace flexh2o::cli
