// `flexh2o generate`: one --prompt or a JSONL file of prompts -> JSONL results + run report.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <type_traits>

#include "cli/commands.h"
#include "core/error.h"
#include "core/input_guard.h"
#include "engine/generate.h"
#include "cli/run_setup.h"
#include "engine/offload_engine.h"

namespace flexh2o::cli {
namespace {
using nlohmann::json;

// One input line (or the --prompt) turned into a request, or the reason it cannot be.
struct Item {
  json id;
  int64_t line = 0;
  GenerationRequest req;
  std::string error;
};

template <typename T>
T field(const json& j, const char* key, T dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if constexpr (std::is_integral_v<T>) {  // range-checked: 4294967298 must not wrap to 2
    const int64_t hi = int64_t(std::min<uint64_t>(std::numeric_limits<T>::max(), INT64_MAX));
    return T(json_to_int(j[key], int64_t(std::numeric_limits<T>::min()), hi, "field \"" + std::string(key) + "\""));
  }
  try {
    return j[key].get<T>();
  } catch (const json::exception&) {
    FH_FAIL("field \"", key, "\" has the wrong type: ", json_excerpt(j[key]));
  }
}

Item make_item(const json& j, int64_t line, size_t index, const GenerateArgs& a, const LoadedModel& lm) {
  Item it;
  it.line = line;
  it.id = j.contains("id") ? j["id"] : json(index);
  try {
    if (j.contains("prompt_ids")) {
      it.req.prompt_ids = json_to_ids(j["prompt_ids"], "field \"prompt_ids\"");
    } else if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) FH_FAIL("field \"prompt\" must be a string");
      const std::string text = j["prompt"].get<std::string>();
      if (text.empty()) FH_FAIL("empty prompt");
      if (!lm.tokenizer) FH_FAIL("this model has no tokenizer: give \"prompt_ids\" or pass --tokenizer DIR");
      it.req.prompt_ids = lm.tokenizer->encode(text, /*add_special=*/true);
    } else {
      FH_FAIL("line has neither \"prompt\" nor \"prompt_ids\"");
    }
    it.req.max_new_tokens = field<int64_t>(j, "max_new_tokens", a.max_new_tokens);
    it.req.sampling.temperature = a.greedy ? 0.f : field<float>(j, "temperature", a.temperature);
    it.req.sampling.top_k = field<int>(j, "top_k", a.top_k);
    it.req.sampling.top_p = field<float>(j, "top_p", a.top_p);
    it.req.sampling.seed = field<uint64_t>(j, "seed", a.seed + index);
    validate_request(it.req, lm.model->config());
  } catch (const Error& e) {
    it.error = e.what();
  }
  return it;
}

}  // namespace

void register_generate(CLI::App& app, GenerateArgs& a) {
  auto* g = app.add_subcommand("generate", "Generate text for one prompt or a JSONL file of prompts");
  g->add_option("--model,-m", a.model,
                "Model: a HF model directory, a hub id found in the local HF cache (ORG/NAME), "
                "or a preset name from configs/models (dummy weights)")->required();
  g->add_option("--tokenizer", a.tokenizer, "Tokenizer directory (default: the model directory)");
  auto* p = g->add_option("--prompt,-p", a.prompt, "One prompt (BOS added per model convention)");
  auto* in = g->add_option("--input,-i", a.input, "JSONL input: {\"prompt\": ...} or {\"prompt_ids\": [...]} per line, "
                           "optional id, max_new_tokens, temperature, top_k, top_p, seed");
  p->excludes(in);
  g->add_option("--output,-o", a.output, "JSONL output (id, text, token_ids, finish_reason); default stdout");
  g->add_option("--report", a.report, "Write a JSON run report (timings, tokens/s, memory) to this file");
  g->add_option("--max-new-tokens,-n", a.max_new_tokens, "Tokens to generate per prompt (default for lines)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  g->add_option("--batch-size,-b", a.batch_size, "Prompts prefilled and decoded together")
      ->capture_default_str()->check(CLI::PositiveNumber);
  g->add_flag("--greedy", a.greedy, "Greedy decoding (temperature 0), overrides lines' temperature");
  g->add_option("--temperature", a.temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  g->add_option("--top-k", a.top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  g->add_option("--top-p", a.top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  g->add_option("--seed", a.seed, "Base seed; line i uses seed+i unless it sets its own")->capture_default_str();
  g->add_flag("--ignore-eos", a.ignore_eos, "Generate exactly max_new_tokens (benchmarks need fixed lengths)");
  g->add_option("--device", a.device,
                "cpu, cuda (the offloading engine on the GPU: everything resident, or placed by the offloading "
                "flags) or auto (cuda when a GPU is usable)")
      ->capture_default_str();
  g->add_option("--threads", a.threads, "CPU threads (default: all)");
  g->add_flag("--quiet,-q", a.quiet, "Do not print results to stdout when --output is a file");
  add_offload_flags(g, a.offload);
  add_kv_flags(g, a.kv);
}

int run_generate(const GenerateArgs& a, const Env& env) {
  if (a.prompt.empty() && a.input.empty()) FH_FAIL("give --prompt TEXT or --input FILE.jsonl");
  if (!a.input.empty()) check_regular_file(a.input, "--input").throw_if_error();  // before a blocking open
  const std::string device = select_device(a.device, std::cerr);
  LoadedModel lm = load_model(env, a.model, a.tokenizer);
  const ModelConfig& cfg = lm.model->config();
  std::cerr << "flexh2o: model " << cfg.name << " (" << lm.source << "), " << lm.model->parameter_count() / 1e6
            << "M params, loaded in " << lm.load_seconds << " s\n";

  std::vector<Item> items;
  int64_t bad = 0;
  if (!a.prompt.empty()) {
    items.push_back(make_item(json{{"prompt", a.prompt}}, 0, 0, a, lm));
  } else {
    std::ifstream in(a.input);
    if (!in) FH_FAIL("cannot read --input ", a.input);
    for_each_jsonl(
        in, [&](int64_t line, const json& j) { items.push_back(make_item(j, line, items.size(), a, lm)); },
        [&](int64_t line, const std::string& msg) {
          Item it;
          it.line = line;
          it.id = json(items.size());
          it.error = msg;
          items.push_back(std::move(it));
        });
  }
  std::vector<GenerationRequest> reqs;
  std::vector<size_t> req_item;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].error.empty()) {
      ++bad;
      std::cerr << "flexh2o: " << (a.input.empty() ? "prompt" : a.input + ":" + std::to_string(items[i].line))
                << ": " << items[i].error << "\n";
      continue;
    }
    req_item.push_back(i);
    reqs.push_back(items[i].req);
  }

  std::ofstream out_file;
  if (!a.output.empty()) {
    out_file.open(a.output);
    if (!out_file) FH_FAIL("cannot write --output ", a.output);
  }
  std::ostream& out = a.output.empty() ? std::cout : out_file;
  const bool human = !a.output.empty() && !a.quiet;
  const bool single = !a.prompt.empty() && a.output.empty();

  // Results are written in input order as soon as all earlier ones are done.
  std::vector<std::optional<GenerationResult>> ready(items.size());
  size_t next = 0;
  auto flush = [&] {
    while (next < items.size() && (!items[next].error.empty() || ready[next])) {
      const Item& it = items[next];
      json o{{"id", it.id}};
      if (!it.error.empty()) {
        o["error"] = it.error;
        if (it.line) o["line"] = it.line;
      } else {
        const GenerationResult& r = *ready[next];
        std::string text = lm.tokenizer ? lm.tokenizer->decode(r.tokens) : std::string();
        o["text"] = text;
        o["token_ids"] = r.tokens;
        o["finish_reason"] = finish_reason_name(r.finish);
        if (human) std::cout << "[" << it.id.dump() << "] " << text << "\n";
        if (single) {
          std::cout << text << "\n";
          ++next;
          continue;
        }
      }
      out << o.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      ++next;
    }
    out.flush();
  };
  flush();

  CpuDevice dev(a.threads);
  Forward fwd(*lm.model, dev);
  int64_t prompt = 1, gen = 1;
  for (const auto& r : reqs) {
    prompt = std::max<int64_t>(prompt, int64_t(r.prompt_ids.size()));
    gen = std::max<int64_t>(gen, r.max_new_tokens);
  }
  RunSetup rs = make_run_setup(a.offload, a.kv, a.batch_size, *lm.model, fwd, dev, env, prompt, gen,
                               int64_t(reqs.size()), device, std::cerr);
  StepRunner* runner = rs.runner.get();
  GenerateOptions go;
  go.batch_size = runner->max_batch();
  go.ignore_eos = a.ignore_eos;
  go.eos_id = lm.tokenizer && lm.tokenizer->eos_id() ? lm.tokenizer->eos_id() : cfg.eos_id;
  go.pad_id = cfg.pad_id.value_or(0);
  const auto start = std::chrono::steady_clock::now();
  if (env.stderr_is_tty) {
    go.on_progress = [&](int64_t done, int64_t total) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "\r[generate] %lld/%lld tokens, %.1f tok/s   ", (long long)done, (long long)total,
                   s > 0 ? double(done) / s : 0.0);
    };
  }
  go.on_result = [&](size_t r, const GenerationResult& res) {
    ready[req_item[r]] = res;
    flush();
  };
  GenerateStats st;
  generate(*runner, reqs, go, &st);
  if (env.stderr_is_tty) std::fprintf(stderr, "\n");
  flush();

  const double total_s = st.prefill_seconds + st.decode_seconds;
  json report = run_report(lm, rs, st, dev, device);
  report["requests"] = items.size();
  report["failed_requests"] = bad;
  if (!a.report.empty()) write_json_file(a.report, report);
  if (rs.offload) write_trace_file(a.offload, *rs.offload, std::cerr);
  std::cerr << "flexh2o: " << st.generated_tokens << " tokens for " << reqs.size() << " prompts in " << total_s
            << " s (" << report["tokens_per_s"].get<double>() << " tok/s; prefill " << st.prefill_seconds
            << " s, decode " << st.decode_seconds << " s)\n";
  if (bad) std::cerr << "flexh2o: " << bad << " input line(s) failed; see the \"error\" fields\n";
  return bad ? 1 : 0;
}

}  // namespace flexh2o::cli
