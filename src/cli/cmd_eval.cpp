// `flexh2o eval-ppl` (perplexity of a text file) and `flexh2o eval-choice` (multiple-choice
// accuracy, lm-eval-harness style), both with a KV policy applied exactly as in generation.
// Not here: the scoring itself (engine/evaluate.h) and the policies (policies/).
//
// Documented choices:
//  * eval-ppl streams: a 1-token prefill of BOS, then one token per decode step, so the policy's
//    budget holds at every step (attention sees at most B cached tokens, the new one included).
//    Budgets are fixed at prefill from the prompt length, which is 1 here, so ratio flags are
//    taken as fractions of N = the tokens scored and converted to absolute budgets first
//    (floor(ratio * N), at least 1 when ratio > 0). `--kv-policy full` reads the text in
//    prefill steps of many tokens (same numbers, it is tested), in memory and through the
//    offloading engine, unless --streaming is given.
//  * eval-choice: the context (few-shot examples + item) is the prompt of each choice; with the
//    full cache a batch of choices is one step, with a KV policy the contexts are prefilled and
//    the choices fed a token a step. Ratio flags are fractions of each item's context length,
//    as in generation. The engine evicts after prefill attention (H2O-FlexGen semantics), so a
//    choice's FIRST token is scored with the full context and only later tokens see the capped
//    cache. --streaming reads each choice's sequence a token a step from its first id instead,
//    ratios being fractions of all the tokens it reads, as h2o_hf's lm-eval masking restricts
//    attention inside the prompt too. Requests are HFLM's (prepare_item). Metrics are
//    lm-eval's multiple_choice ones: acc = argmax of the summed log-likelihood, acc_norm of it
//    over the choice's characters (code points, Python's len), acc_bytes over its UTF-8 bytes,
//    the delimiter not counted; acc_norm_token divides by the choice's tokens instead. Ties go
//    to the lowest choice index (numpy argmax, as lm-eval).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "cli/progress.h"
#include "cli/run_setup.h"
#include "core/error.h"
#include "core/input_guard.h"
#include "engine/evaluate.h"
#include "engine/offload_engine.h"
#include "engine/perplexity.h"

namespace flexh2o::cli {
using nlohmann::json;

namespace {

// What an evaluation's JSON names besides its numbers: the model, the input and the seconds the
// scoring took, so that a results file stands on its own.
void add_run_identity(nlohmann::json& j, const LoadedModel& lm, const std::string& input,
                      std::chrono::steady_clock::time_point t0) {
  j["model"] = lm.model->config().name;
  j["model_source"] = lm.source;
  j["input"] = input;
  j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}


std::optional<int32_t> bos_of(const LoadedModel& lm) {
  auto bos = lm.tokenizer->bos_id();
  return bos ? bos : lm.model->config().bos_id;
}

// "-" is standard input, as generate's --input, read to its end (at most kMaxInputFileBytes).
std::string read_file(const std::string& path) {
  return path == "-" ? read_input_fd(STDIN_FILENO, "standard input") : read_input_file(path, "input file");
}

// A file's name in messages: "-" is standard input.
std::string input_name(const std::string& path) { return path == "-" ? std::string("standard input") : path; }

// The engine flags an evaluation takes, as generate checks them, less what it has no use for: the
// planner's --policy auto (an evaluation has no generation length to plan for) and so --hardware.
void check_eval_engine_flags(const char* command, const OffloadArgs& off, const KvArgs& kv) {
  check_engine_flags(off, kv);
  if (off.policy_file == "auto") FH_FAIL(command, ": --policy auto is not supported; give --percent");
  if (!off.hardware.empty())
    FH_FAIL(command, ": --hardware ", off.hardware, " is the profile --policy auto plans for, which ", command,
            " does not take; drop it");
}

json budget_json(const KvPolicy* policy, int64_t prompt_len) {
  if (!policy) return nullptr;
  const KvBudget b = policy->budget(prompt_len);
  if (b.unbounded) return nullptr;
  return {{"sinks", b.sinks}, {"heavy", b.heavy}, {"recent", b.recent}, {"total", b.total()}};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// eval-ppl

void register_eval_ppl(CLI::App& app, EvalPplArgs& a) {
  auto* e = app.add_subcommand(
      "eval-ppl",
      "Perplexity of a text file (teacher forcing, BOS prepended). With a KV policy the text is fed one\n"
      "token per decode step; --heavy-ratio/--recent-ratio are then fractions of the tokens scored");
  e->add_option("--model,-m", a.model, "Model directory or hub id")->required();
  e->add_option("--tokenizer", a.tokenizer, "Tokenizer directory (default: the model directory)");
  e->add_option("--max-tokens", a.max_tokens, "Score the first N tokens of the file (at most the model's positions)")->capture_default_str()
      ->check(at_least(1));
  e->add_option("--device", a.device, "cpu, cuda or auto")->capture_default_str();
  add_threads_flag(e, a.threads);
  e->add_flag("--json", a.json, "Print one JSON object");
  e->add_flag("--streaming", a.streaming, "Feed one token per step even with --kv-policy full");
  add_progress_flag(*e, a.progress);
  add_kv_flags(e, a.kv, "the tokens scored");
  add_offload_flags(e, a.offload);
  e->add_option("file", a.file, "UTF-8 text file (- for standard input)")->required();
  e->footer(
      "Offloading flags (--percent, --offload-dir, --gpu-mem, ...) or --device cuda run the evaluation through the\n"
      "offloading engine (on the CPU device: the same numbers as in memory, for models that do not fit). With the\n"
      "full cache the text is read many tokens a step (a 64 MiB logits budget), unless --streaming is given.");
}

int run_eval_ppl(const EvalPplArgs& a, const Env& env) {
  check_can_write({"--trace", a.offload.trace});  // an output path: exit 1, not a flag's mistake
  check_flags([&] { check_eval_engine_flags("eval-ppl", a.offload, a.kv); });  // before loading anything
  KvPolicyConfig kv = make_kv_config(a.kv);
  const bool offload = offload_requested(a.offload);
  std::optional<OffloadOptions> oo;
  if (offload) oo = make_offload_options(a.offload);
  check_device_early(a.device);
  LoadedModel lm = load_model(env, a.model, a.tokenizer, 0, a.progress);
  std::cerr << lm.warning;
  const auto t0 = std::chrono::steady_clock::now();  // the scoring (placement included), not the load
  const std::string device = select_device(a.device, *lm.model, std::cerr);
  if (!lm.tokenizer) FH_FAIL("eval-ppl needs a tokenizer: pass --tokenizer DIR");
  const std::string text = read_file(a.file);
  std::vector<int32_t> toks = lm.tokenizer->encode(text, /*add_special=*/false);
  const ModelConfig& c = lm.model->config();
  std::vector<int32_t> ids;
  if (auto bos = bos_of(lm)) ids.push_back(*bos);
  const int64_t n = std::min<int64_t>({a.max_tokens, int64_t(toks.size()), c.max_positions});
  if (n < 1 || (ids.empty() && n < 2)) FH_FAIL(input_name(a.file), ": no tokens to score");
  if (n < std::min<int64_t>(a.max_tokens, int64_t(toks.size())))
    std::cerr << "flexh2o: eval-ppl: scoring the text's first " << n << " of " << toks.size()
              << " tokens: the model has " << c.max_positions << " positions\n";
  ids.insert(ids.end(), toks.begin(), toks.begin() + n);
  const int64_t scored = int64_t(ids.size()) - 1;
  // A plan file (flexh2o plan --json) runs under the KV policy it was planned for, as in generate.
  check_plan_file(a.offload, kv, *lm.model, int64_t(ids.size()), 1, std::cerr);
  if (kv.kind != KvPolicyKind::kFull) kv = ratios_to_budgets(kv, scored);
  std::unique_ptr<KvPolicy> policy = kv.kind == KvPolicyKind::kFull ? nullptr : make_policy(kv);

  CpuDevice dev(a.threads);
  Forward fwd(*lm.model, dev);
  const DType kv_dtype = run_kv_dtype(a.kv, oo ? oo->policy.compress_cache : a.offload.compress_cache, *lm.model);
  const bool engine_path = offload || device == "cuda";
  // One token a step where the policy must hold at every step, or where asked; otherwise the
  // runners score many rows a step (the same numbers up to rounding).
  const bool stream = policy || a.streaming;
  const uint64_t logits_bytes = stream ? 0 : kScoringLogitsBytes;
  PerplexityResult r;
  json off_report;
  std::unique_ptr<CompressedWeights> compressed;
  if (engine_path) {
    if (!oo) {  // everything resident on the GPU
      oo = make_offload_options(a.offload);
      oo->policy.gpu_batch_size = 1;
    }
    oo->kv_policy = policy.get();
    oo->kv_dtype = kv_dtype;
    std::unique_ptr<Device> owned;
    std::unique_ptr<OffloadEngine> placed =
        place_engine(*lm.model, open_device(device, *lm.model, dev, owned), *oo, a.progress, env.stderr_is_tty,
                     env.stop);
    OffloadEngine& engine = *placed;
    Progress progress("eval-ppl", "tokens", parse_progress_mode(a.progress), env.stderr_is_tty, &engine);
    r = streaming_perplexity(engine, ids, nullptr, [&](int64_t d, int64_t n) { progress.update(d, n); },
                             logits_bytes, env.stop);
    progress.finish();
    off_report = offload_report_json(engine);
    write_trace_file(a.offload, engine, std::cerr);
  } else if (stream) {
    compressed = compress_in_memory(a.offload, *lm.model, fwd);
    InMemoryRunner runner(fwd, 1, policy.get(), kv_dtype);
    Progress progress("eval-ppl", "tokens", parse_progress_mode(a.progress), env.stderr_is_tty);
    r = streaming_perplexity(runner, ids, nullptr, [&](int64_t d, int64_t n) { progress.update(d, n); },
                             logits_bytes, env.stop);
    progress.finish();
  } else {
    compressed = compress_in_memory(a.offload, *lm.model, fwd);
    Progress progress("eval-ppl", "tokens", parse_progress_mode(a.progress), env.stderr_is_tty);
    r = perplexity(fwd, ids, 256, kv_dtype, [&](int64_t d, int64_t n) { progress.update(d, n); }, env.stop);
    progress.finish();
  }
  json j{{"perplexity", r.perplexity}, {"mean_nll", r.mean_nll}, {"tokens", r.tokens},
         {"text_tokens", toks.size()}, {"kv_policy", describe(kv)},
         {"kv_budget", budget_json(policy.get(), 1)}, {"mode", stream ? "streaming" : "prefill"},
         {"kv_dtype", dtype_name(kv_dtype)}, {"device", device},
         {"compress_weight", oo ? oo->policy.compress_weight : a.offload.compress_weight},
         {"interrupted", r.interrupted}};
  add_run_identity(j, lm, a.file, t0);
  if (offload) j["offload"] = off_report;
  if (a.json)
    std::cout << j.dump() << "\n";
  else if (r.tokens == 0)  // a stop in the first step: no mean to print
    std::cout << "no perplexity: stopped before the first token was scored (interrupted)\n";
  else
    std::cout << "perplexity " << r.perplexity << " over " << r.tokens << " tokens (mean NLL " << r.mean_nll
              << ", " << describe(kv) << ", " << (stream ? "streaming" : "prefill")
              << (r.interrupted ? detail::concat(", interrupted: the first ", r.tokens, " of ", scored) : "") << ")\n";
  return r.interrupted ? kInterrupted : 0;
}

// ---------------------------------------------------------------------------------------------
// eval-choice

namespace {

struct TaskItem {
  std::string context;
  std::vector<std::string> choices;
  int64_t label = 0;
  int64_t line = 0;
};

std::vector<TaskItem> read_tasks(const std::string& path) {
  std::ifstream file;
  if (path != "-") {
    check_regular_file(path, "--tasks file").throw_if_error();  // before a blocking open
    file.open(path);
    if (!file) FH_FAIL("cannot read --tasks ", path);
  }
  std::istream& in = path == "-" ? std::cin : file;
  const std::string name = input_name(path);
  std::vector<TaskItem> items;
  std::string err;
  auto bad = [&](int64_t line, const std::string& msg) {
    if (err.empty()) err = name + ":" + std::to_string(line) + ": " + msg;
  };
  for_each_jsonl(
      in,
      [&](int64_t line, const nlohmann::ordered_json& oj) {
        const json j(oj);
        TaskItem t;
        t.line = line;
        if (!j.contains("context") || !j["context"].is_string()) return bad(line, "\"context\" must be a string");
        t.context = j["context"].get<std::string>();
        if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].size() < 2)
          return bad(line, "\"choices\" must be an array of at least 2 strings");
        for (const auto& ch : j["choices"]) {
          if (!ch.is_string() || ch.get<std::string>().empty())
            return bad(line, "every choice must be a non-empty string");
          t.choices.push_back(ch.get<std::string>());
        }
        if (!j.contains("label") || !j["label"].is_number_integer()) return bad(line, "\"label\" must be an integer");
        t.label = j["label"].get<int64_t>();
        if (t.label < 0 || t.label >= int64_t(t.choices.size()))
          return bad(line, "\"label\" " + std::to_string(t.label) + " is not a choice index");
        items.push_back(std::move(t));
      },
      bad);
  if (!err.empty()) FH_FAIL(err);
  if (items.empty()) FH_FAIL(name, ": no task items");
  return items;
}

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser: portable, deterministic
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The k other items with the smallest hash(seed, item, j): deterministic, excludes `item`.
std::vector<size_t> fewshot_indices(size_t item, size_t n, int64_t k, uint64_t seed) {
  std::vector<std::pair<uint64_t, size_t>> keyed;
  for (size_t j = 0; j < n; ++j)
    if (j != item) keyed.push_back({mix64(seed ^ mix64(item * 0x100000001b3ull ^ j)), j});
  std::sort(keyed.begin(), keyed.end());
  std::vector<size_t> out;
  for (int64_t i = 0; i < k && i < int64_t(keyed.size()); ++i) out.push_back(keyed[size_t(i)].second);
  return out;
}

// Whether a code point is whitespace to Python's str.isspace (so str.rstrip strips it).
bool python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

// The length of `s` (UTF-8) once str.rstrip() took its trailing whitespace.
size_t python_rstrip_size(const std::string& s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (uint8_t(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
    const auto lead = uint8_t(s[start]);
    const size_t len = end - start;
    uint32_t cp = len == 1 ? lead : len == 2 ? lead & 0x1Fu : len == 3 ? lead & 0x0Fu : lead & 0x07u;
    for (size_t i = start + 1; i < end; ++i) cp = (cp << 6) | (uint8_t(s[i]) & 0x3Fu);
    if (!python_space(cp)) break;
    end = start;
  }
  return end;
}

// A KV policy's description, its ratios said of what they are shares of: with --streaming all
// the tokens a choice's sequence reads, not its prompt.
std::string budget_basis(std::string described, bool streaming) {
  for (size_t at; streaming && (at = described.find("*prompt")) != std::string::npos;)
    described.replace(at, 7, "*tokens_read");
  return described;
}

// Python's len() of UTF-8 text: its code points (the bytes that do not continue a sequence).
double code_points(const std::string& s) {
  return double(std::count_if(s.begin(), s.end(), [](char ch) { return (uint8_t(ch) & 0xC0) != 0x80; }));
}

// The first index of the largest loglik[i] / length[i] (numpy argmax, as lm-eval).
int64_t best_per(const std::vector<double>& loglik, const std::vector<double>& length) {
  int64_t best = 0;
  for (size_t i = 1; i < loglik.size(); ++i)
    if (loglik[i] / length[i] > loglik[size_t(best)] / length[size_t(best)]) best = int64_t(i);
  return best;
}

// An item as it is scored: each choice's context and continuation ids.
struct PreparedItem {
  std::vector<LoglikRequest> choices;
  int64_t context_tokens = 0;  // before any cut
  bool truncated = false;      // a choice's context was cut to fit the model's positions
};

// lm-eval's HFLM (0.4.x) request for each choice of `context` (few-shot examples and the item):
// the context's trailing whitespace (str.rstrip's, Unicode spaces too) moves to the
// continuation; the context gets `bos` in front unless its ids start with it (has_bos_prefix),
// an empty one `prefix` alone; a continuation is encode(context + delimiter + choice) past
// encode(context)'s length (encoded alone after an empty context, less a first id that is the
// prefix: that is the context); a context + continuation longer than the model's positions + 1
// is cut from the left. Throws for a choice that encodes to no tokens or alone outruns the
// positions.
PreparedItem prepare_item(const Tokenizer& tok, const std::string& context, const std::vector<std::string>& choices,
                          const std::string& delimiter, std::optional<int32_t> bos, std::optional<int32_t> prefix,
                          const ModelConfig& c) {
  const std::string ctx = context.substr(0, python_rstrip_size(context));
  const std::string moved = context.substr(ctx.size());
  const std::vector<int32_t> ctx_enc = tok.encode(ctx, false);
  std::vector<int32_t> ctx_ids;
  if (ctx_enc.empty() && prefix)
    ctx_ids.push_back(*prefix);
  else if (!ctx_enc.empty() && bos && ctx_enc[0] != *bos)
    ctx_ids.push_back(*bos);
  ctx_ids.insert(ctx_ids.end(), ctx_enc.begin(), ctx_enc.end());
  if (ctx_ids.empty()) FH_FAIL("empty context and no BOS or EOS token");
  PreparedItem p;
  p.context_tokens = int64_t(ctx_ids.size());
  for (size_t k = 0; k < choices.size(); ++k) {
    const std::vector<int32_t> whole = tok.encode(ctx + moved + delimiter + choices[k], false);
    LoglikRequest r;
    if (whole.size() > ctx_enc.size())
      r.continuation.assign(whole.begin() + std::ptrdiff_t(ctx_enc.size()), whole.end());
    if (context.empty() && !r.continuation.empty() && r.continuation[0] == ctx_ids[0])
      r.continuation.erase(r.continuation.begin());  // its own first id is the prefix (lm-eval's LM.loglikelihood)
    if (r.continuation.empty())
      FH_FAIL("choice ", k, " ", nlohmann::json(choices[k]).dump(), " encodes to no tokens after the context");
    const int64_t room = c.max_positions + 1 - int64_t(r.continuation.size());  // context ids that fit
    if (room < 1)
      FH_FAIL("choice ", k, " is ", r.continuation.size(), " tokens; the model reads at most ", c.max_positions,
              " positions");
    const size_t cut = size_t(std::max<int64_t>(0, int64_t(ctx_ids.size()) - room));
    p.truncated = p.truncated || cut > 0;
    r.context.assign(ctx_ids.begin() + std::ptrdiff_t(cut), ctx_ids.end());
    p.choices.push_back(std::move(r));
  }
  return p;
}

}  // namespace

void register_eval_choice(CLI::App& app, EvalChoiceArgs& a) {
  auto* e = app.add_subcommand(
      "eval-choice",
      "Multiple-choice accuracy (lm-eval-harness style: the choice with the highest log-likelihood wins).\n"
      "--tasks is JSONL, one item a line: {\"context\": \"...\", \"choices\": [\" a\", \" b\", ...], \"label\": 0}.\n"
      "Each choice is appended to the context after --target-delimiter (default none: put the separating\n"
      "space in the choice, or give --target-delimiter ' ' as lm-eval's tasks do).\n"
      "Few-shot examples are other items with their right answer, joined by blank lines. Requests are\n"
      "lm-eval's (HFLM): the context's trailing whitespace moves to the choice, a context already starting\n"
      "with BOS gets no second one, and one too long for the model is cut from the left (the run says how many).\n"
      "Metrics are lm-eval's: acc (highest log-likelihood), acc_norm (per character of the choice) and\n"
      "acc_bytes (per UTF-8 byte), the delimiter not counted; acc_norm_token (per token) besides.");
  e->add_option("--model,-m", a.model, "Model directory or hub id")->required();
  e->add_option("--tokenizer", a.tokenizer, "Tokenizer directory (default: the model directory)");
  e->add_option("--tasks", a.tasks, "Task file (JSONL, see above; - for standard input)")->required();
  e->add_option("--num-fewshot", a.num_fewshot, "Solved examples prepended to each item (other items of the file)")
      ->capture_default_str();
  e->add_option("--fewshot-seed", a.fewshot_seed, "Seed of the (deterministic) few-shot selection")
      ->capture_default_str();
  e->add_option("--target-delimiter", a.target_delimiter,
                "Text between the context and each choice (lm-eval's target_delimiter; not counted in acc_norm)");
  e->add_option("--limit", a.limit, "Evaluate only the first N items (0: all)")->capture_default_str();
  e->add_option("--batch-size", a.batch_size,
                "Choices scored together (default: all choices of an item); with offloading flags the block, "
                "as --gpu-batch-size N")
      ->check(at_least(1));
  e->add_option("--device", a.device, "cpu, cuda or auto")->capture_default_str();
  add_threads_flag(e, a.threads);
  e->add_flag("--json", a.json, "Print one JSON object");
  e->add_flag("--streaming", a.streaming,
              "Read each choice's sequence a token a step from its first token, so a KV policy holds inside "
              "the context too, its ratios fractions of all the tokens read (H2O's lm-eval protocol); "
              "default: the context is prefilled with full attention, ratios of its length");
  e->add_option("--log-samples", a.log_samples,
                "Write a JSON line per item scored: its line in --tasks, label, predictions and each choice's "
                "log-likelihood, is_greedy, tokens, chars and bytes (lm-eval's --log_samples)");
  add_progress_flag(*e, a.progress);
  add_kv_flags(e, a.kv);
  add_offload_flags(e, a.offload);
  e->footer(
      "Offloading flags (--percent, --gpu-batch-size, --offload-dir, ...) or --device cuda score the choices\n"
      "through the offloading engine (blocks of --gpu-batch-size x --num-gpu-batches sequences).");
}

int run_eval_choice(const EvalChoiceArgs& args, const Env& env) {
  EvalChoiceArgs a = args;  // --batch-size may set the offloading engine's block
  check_can_write({"--trace", a.offload.trace});  // an output path: exit 1, not a flag's mistake
  check_can_write({"--log-samples", a.log_samples});
  check_outputs_are_not_inputs({{"--log-samples", a.log_samples}, {"--trace", a.offload.trace}},
                               {{"--tasks", a.tasks}});
  check_flags([&] {  // flag errors before loading anything
    check_eval_engine_flags("eval-choice", a.offload, a.kv);
    if (offload_requested(a.offload))
      apply_batch_size_flag(a.batch_size > 0, a.batch_size, a.offload, /*refuse=*/true, "--batch-size");
    if (a.num_fewshot < 0) FH_FAIL("--num-fewshot must be >= 0, got ", a.num_fewshot);
    if (a.limit < 0) FH_FAIL("--limit must be >= 0, got ", a.limit);
    if (a.batch_size < 0) FH_FAIL("--batch-size must be >= 0, got ", a.batch_size);
  });
  const KvPolicyConfig kv = make_kv_config(a.kv);
  std::vector<TaskItem> items = read_tasks(a.tasks);
  if (a.num_fewshot >= int64_t(items.size()))
    FH_FAIL("--num-fewshot ", a.num_fewshot, " needs more items than the ", items.size(), " in ", input_name(a.tasks));
  check_device_early(a.device);
  LoadedModel lm = load_model(env, a.model, a.tokenizer, 0, a.progress);
  std::cerr << lm.warning;
  const auto t0 = std::chrono::steady_clock::now();  // the scoring (placement included), not the load
  const std::string device = select_device(a.device, *lm.model, std::cerr);
  if (!lm.tokenizer) FH_FAIL("eval-choice needs a tokenizer: pass --tokenizer DIR");
  const Tokenizer& tok = *lm.tokenizer;
  // Contexts start with BOS where the tokenizer adds it to text (lm-eval's HFLM by default; not
  // SmolLM2's); an empty one is BOS (else EOS) alone, HFLM's prefix token.
  const auto bos = bos_of(lm);
  // (The text's own ids follow that BOS: a tokenizer that adds only EOS, BOS's id too, does not.)
  const std::vector<int32_t> with = tok.encode("a", true), plain = tok.encode("a", false);
  const bool adds_bos = bos && with.size() > plain.size() && with[0] == *bos &&
                        std::equal(plain.begin(), plain.end(), with.begin() + 1);
  const std::optional<int32_t> prefix = bos ? bos : tok.eos_id();
  // Every item is tokenized and checked before the first is scored: one that cannot be is
  // refused (naming its line) before the weights are placed, not after the items before it.
  const size_t n = a.limit > 0 ? std::min(items.size(), size_t(a.limit)) : items.size();
  std::vector<PreparedItem> prepared;
  int64_t truncated = 0;
  for (size_t i = 0; i < n; ++i) {
    std::string context;
    for (size_t j : fewshot_indices(i, items.size(), a.num_fewshot, a.fewshot_seed))
      context += items[j].context + a.target_delimiter + items[j].choices[size_t(items[j].label)] + "\n\n";
    context += items[i].context;
    try {
      prepared.push_back(prepare_item(tok, context, items[i].choices, a.target_delimiter,
                                      adds_bos ? bos : std::nullopt, prefix, lm.model->config()));
    } catch (const Error& e) {
      FH_FAIL(input_name(a.tasks), ":", items[i].line, ": ", e.what());
    }
    truncated += prepared.back().truncated;
  }
  if (truncated)
    std::cerr << "flexh2o: eval-choice: " << truncated << " of " << n
              << " items had their context cut from the left to fit the model's " << lm.model->config().max_positions
              << " positions, as lm-eval cuts it\n";
  std::unique_ptr<KvPolicy> policy = kv.kind == KvPolicyKind::kFull ? nullptr : make_policy(kv);
  size_t max_choices = 0;
  for (const auto& t : items) max_choices = std::max(max_choices, t.choices.size());
  CpuDevice dev(a.threads);
  Forward fwd(*lm.model, dev);
  DType kv_dtype = run_kv_dtype(a.kv, a.offload.compress_cache, *lm.model);
  std::unique_ptr<CompressedWeights> compressed;  // in memory with --compress-weight; outlives the runner
  std::unique_ptr<Device> owned_device;  // outlives the runner
  std::unique_ptr<StepRunner> owned;
  OffloadEngine* engine = nullptr;
  const int64_t batch = a.batch_size > 0 ? a.batch_size : int64_t(max_choices);
  if (offload_requested(a.offload) || device == "cuda") {
    check_plan_file(a.offload, kv, *lm.model, 1, 1, std::cerr);  // its KV policy and model, as in generate
    OffloadOptions o = make_offload_options(a.offload);
    if (!offload_requested(a.offload)) o.policy.gpu_batch_size = batch;  // everything resident on the GPU
    o.kv_policy = policy.get();
    o.kv_dtype = kv_dtype = run_kv_dtype(a.kv, o.policy.compress_cache, *lm.model);
    auto e = place_engine(*lm.model, open_device(device, *lm.model, dev, owned_device), o, a.progress,
                          env.stderr_is_tty, env.stop);
    engine = e.get();
    owned = std::move(e);
  } else {
    compressed = compress_in_memory(a.offload, *lm.model, fwd);
    owned = std::make_unique<InMemoryRunner>(fwd, batch, policy.get(), kv_dtype);
  }
  StepRunner& runner = *owned;

  int64_t correct = 0, correct_norm = 0, correct_bytes = 0, correct_norm_token = 0, context_tokens = 0;
  double chance = 0;
  std::string samples;  // --log-samples: a JSON line per item scored
  Progress progress("eval-choice", "items", parse_progress_mode(a.progress), env.stderr_is_tty, engine);
  size_t done = 0;  // items scored: all of them unless a stop signal came first
  for (; done < n && !(env.stop && env.stop->load(std::memory_order_relaxed)); ++done) {
    const size_t i = done;
    progress.update(int64_t(i), int64_t(n));
    const PreparedItem& p = prepared[i];
    ChoiceResult r;
    try {
      r = a.streaming ? score_choices_streamed(runner, p.choices, env.stop)
                      : score_choices(runner, p.choices, env.stop);
    } catch (const ScoringStopped&) {  // within the item's step under way: the items before count
      break;
    } catch (const Error& e) {
      FH_FAIL(input_name(a.tasks), ":", items[i].line, ": ", e.what(),
              a.num_fewshot ? " (try a smaller --num-fewshot)" : "");
    }
    std::vector<double> chars, bytes;
    for (const std::string& ch : items[i].choices) {
      chars.push_back(code_points(ch));
      bytes.push_back(double(ch.size()));
    }
    const int64_t pred_norm = best_per(r.loglik, chars), pred_bytes = best_per(r.loglik, bytes);
    correct += r.best == items[i].label;
    correct_norm += pred_norm == items[i].label;
    correct_bytes += pred_bytes == items[i].label;
    correct_norm_token += r.best_norm == items[i].label;
    if (!a.log_samples.empty()) {
      json choices = json::array();
      for (size_t k = 0; k < r.loglik.size(); ++k)
        choices.push_back({{"loglik", r.loglik[k]}, {"is_greedy", bool(r.greedy[k])}, {"tokens", r.tokens[k]},
                           {"chars", int64_t(chars[k])}, {"bytes", int64_t(bytes[k])}});
      samples += json{{"line", items[i].line}, {"label", items[i].label}, {"pred", r.best},
                      {"pred_norm", pred_norm}, {"pred_bytes", pred_bytes},
                      {"pred_norm_token", r.best_norm}, {"context_tokens", p.context_tokens},
                      {"truncated", p.truncated}, {"choices", choices}}
                     .dump() +
                 "\n";
    }
    chance += 1.0 / double(items[i].choices.size());
    context_tokens += p.context_tokens;
  }
  progress.update(int64_t(done), int64_t(n));
  progress.finish();
  const double dn = double(done);  // 0 after a stop before the first item: NaN rates, null in JSON
  json j{{"acc", double(correct) / dn}, {"acc_norm", double(correct_norm) / dn},
         {"acc_bytes", double(correct_bytes) / dn}, {"acc_norm_token", double(correct_norm_token) / dn},
         {"count", done}, {"items", n}, {"interrupted", done < n},
         {"correct", correct}, {"correct_norm", correct_norm}, {"correct_bytes", correct_bytes},
         {"correct_norm_token", correct_norm_token}, {"chance", chance / dn},
         {"num_fewshot", a.num_fewshot}, {"mean_context_tokens", double(context_tokens) / dn},
         {"mode", a.streaming ? "streaming" : "prefill"},
         {"kv_policy", budget_basis(describe(kv), a.streaming)}, {"target_delimiter", a.target_delimiter},
         {"truncated_items", truncated},
         {"kv_dtype", dtype_name(kv_dtype)}, {"device", device},
         {"compress_weight", engine ? engine->options().policy.compress_weight : a.offload.compress_weight}};
  add_run_identity(j, lm, a.tasks, t0);
  if (engine) {
    j["offload"] = offload_report_json(*engine);
    write_trace_file(a.offload, *engine, std::cerr);
  }
  if (!a.log_samples.empty()) write_text_file({"--log-samples", a.log_samples}, samples);
  if (a.json)
    std::cout << j.dump() << "\n";
  else
    std::cout << "acc " << double(correct) / dn << " acc_norm " << double(correct_norm) / dn << " over " << done
              << " items (chance " << chance / dn << ", " << a.num_fewshot << "-shot, "
              << budget_basis(describe(kv), a.streaming)
              << (done < n ? detail::concat(", interrupted: the first ", done, " of ", n) : "") << ")\n";
  return done < n ? kInterrupted : 0;
}

}  // namespace flexh2o::cli
