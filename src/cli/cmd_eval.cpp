// `flexh2o eval-ppl`: teacher-forced perplexity of the first N tokens of a text file.
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "engine/perplexity.h"

namespace flexh2o::cli {
using nlohmann::json;

void register_eval_ppl(CLI::App& app, EvalPplArgs& a) {
  auto* e = app.add_subcommand("eval-ppl", "Perplexity of a text file (teacher forcing, BOS prepended)");
  e->add_option("--model,-m", a.model, "Model directory or hub id")->required();
  e->add_option("--tokenizer", a.tokenizer, "Tokenizer directory (default: the model directory)");
  e->add_option("--max-tokens", a.max_tokens, "Score the first N tokens of the file")->capture_default_str()
      ->check(CLI::PositiveNumber);
  e->add_option("--device", a.device, "cpu, cuda or auto")->capture_default_str();
  e->add_option("--threads", a.threads, "CPU threads (default: all)");
  e->add_flag("--json", a.json, "Print one JSON object");
  e->add_option("file", a.file, "UTF-8 text file")->required();
}

int run_eval_ppl(const EvalPplArgs& a, const Env& env) {
  select_device(a.device, std::cerr);
  LoadedModel lm = load_model(env, a.model, a.tokenizer);
  if (!lm.tokenizer) FH_FAIL("eval-ppl needs a tokenizer: pass --tokenizer DIR");
  std::ifstream in(a.file);
  if (!in) FH_FAIL("cannot read ", a.file);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int32_t> toks = lm.tokenizer->encode(ss.str(), /*add_special=*/false);
  const ModelConfig& c = lm.model->config();
  std::vector<int32_t> ids;
  auto bos = lm.tokenizer->bos_id() ? lm.tokenizer->bos_id() : c.bos_id;
  if (bos) ids.push_back(*bos);
  const int64_t n = std::min<int64_t>({a.max_tokens, int64_t(toks.size()), c.max_positions});
  ids.insert(ids.end(), toks.begin(), toks.begin() + n);
  CpuDevice dev(a.threads);
  Forward fwd(*lm.model, dev);
  PerplexityResult r = perplexity(fwd, ids);
  json j{{"perplexity", r.perplexity}, {"mean_nll", r.mean_nll}, {"tokens", r.tokens},
         {"text_tokens", toks.size()}, {"kv_policy", "full"}};
  if (a.json)
    std::cout << j.dump() << "\n";
  else
    std::cout << "perplexity " << r.perplexity << " over " << r.tokens << " tokens (mean NLL " << r.mean_nll << ")\n";
  return 0;
}

}  // namespace flexh2o::cli
