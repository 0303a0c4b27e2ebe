// `flexh2o tokenize` / `flexh2o detokenize`: JSONL text <-> ids with a tokenizer directory.
// A bad line (invalid JSON or UTF-8, a missing field, an id outside the vocabulary) becomes an
// error record with its line number and the rest still run. --output is replaced only when the
// whole input was read (output_file.h), so an interrupted run leaves it as it was.
#include <fstream>
#include <iostream>
#include <optional>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o::cli {
using nlohmann::json;

namespace {
// Thrown out of the per-line callback to stop reading when Env::stop is set.
struct Stopped {};
}  // namespace

void register_tokenize(CLI::App& app, TokenizeArgs& a, bool detokenize) {
  auto* t = detokenize ? app.add_subcommand("detokenize", "JSONL {\"ids\": [...]} -> {\"text\": ...}")
                       : app.add_subcommand("tokenize", "JSONL {\"text\": ...} -> {\"ids\": [...]}");
  t->add_option("--tokenizer,-t", a.tokenizer,
                "Directory with tokenizer.json, vocab.json + merges.txt, or tokenizer.model (no model needed)")->required();
  t->add_option("--input,-i", a.input, "JSONL input (default or -: standard input)");
  t->add_option("--output,-o", a.output,
                "JSONL output (default, - or /dev/stdout: standard output), one line per non-blank input line, "
                "in order (blank lines are skipped, as everywhere JSONL is read); replaced when the run ends, "
                "never the same file as --input");
  t->add_flag("--no-special", a.no_special,
              detokenize ? "Drop special tokens from the text" : "Do not add BOS/EOS");
  t->footer("A bad input line gets {\"line\": N, \"error\": ...} in its place and the others still run; the exit "
            "code is then 1. SIGINT/SIGTERM/SIGHUP stop between lines and leave --output as it was.");
}

int run_tokenize(const TokenizeArgs& args, bool detokenize, const Env& env) {
  TokenizeArgs a = args;  // "-" names standard input / output, as generate's --input and --output
  if (a.input == "-") a.input.clear();
  if (names_standard_output(a.output, "--output")) a.output.clear();
  const NamedPath input = a.input.empty() ? NamedPath{"standard input", "/dev/stdin"} : NamedPath{"--input", a.input};
  check_outputs_are_not_inputs({{"--output", a.output}}, {input});
  Tokenizer tok = Tokenizer::load(a.tokenizer);
  std::ifstream in_file;
  if (!a.input.empty()) {
    check_regular_file(a.input, "--input").throw_if_error();  // before a blocking open
    in_file.open(a.input);
    if (!in_file) FH_FAIL("cannot read --input ", a.input);
  }
  std::optional<OutputFile> out_file;
  if (!a.output.empty()) out_file.emplace(NamedPath{"--output", a.output}, OutputFile::Mode::kReplace);
  std::istream& in = a.input.empty() ? std::cin : in_file;
  auto put = [&](const json& j) {
    if (out_file) out_file->write(jsonl_line(j));
    else std::cout << jsonl_line(j);
  };
  const std::string where = a.input.empty() ? "stdin" : a.input;
  int64_t bad = 0;
  auto fail = [&](int64_t line, const std::string& msg) {
    ++bad;
    std::cerr << "flexh2o: " << where << ":" << line << ": " << msg << "\n";
    put(json{{"line", line}, {"error", msg}});
  };
  try {
    for_each_jsonl(
        in,
        [&](int64_t line, const nlohmann::ordered_json& oj) {
          const json j(oj);
          if (env.stop && env.stop->load()) throw Stopped{};
          try {
            if (detokenize) {
              if (!j.contains("ids") || !j["ids"].is_array()) FH_FAIL("line has no \"ids\" array");
              auto ids = json_to_ids(j["ids"], "field \"ids\"");
              for (int32_t id : ids)
                if (id < 0 || id >= tok.vocab_size()) FH_FAIL("token id ", id, " is outside the vocabulary");
              put(json{{"text", tok.decode(ids, a.no_special)}});
            } else {
              if (!j.contains("text")) FH_FAIL("line has no \"text\" field");
              if (!j["text"].is_string()) FH_FAIL("\"text\" must be a string, got ", j["text"].type_name());
              put(json{{"ids", tok.encode(j["text"].get<std::string>(), !a.no_special)}});
            }
          } catch (const std::exception& e) {
            fail(line, e.what());
          }
        },
        fail);
  } catch (const Stopped&) {
    std::cerr << "flexh2o: interrupted"
              << (out_file ? "; --output " + a.output + " is left as it was" : std::string()) << "\n";
    return kInterrupted;  // out_file's destructor removes the temporary
  }
  if (out_file) out_file->commit();
  if (bad) std::cerr << "flexh2o: " << bad << " line(s) failed; see the \"error\" records\n";
  return bad ? 1 : 0;
}

}  // namespace flexh2o::cli
