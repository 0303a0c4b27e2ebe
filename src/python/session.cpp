// flexh2o.LLM's engine side: flag parsing through the CLI's registration, model loading, and
// generation / scoring through the CLI's runner construction (session.h).
#include "python/session.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <ctime>
#include <deque>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/input_guard.h"
#include "engine/evaluate.h"
#include "cli/openai_batch.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"

namespace flexh2o::python {
using nlohmann::json;

struct Session::Runner {
  std::unique_ptr<Forward> fwd;  // declared first: the runner in rs refers to it
  cli::RunSetup rs;
};

namespace {

// Keyword arguments -> the CLI's argv, parsed by the CLI's own registration of the offloading
// and KV-cache flags, so values are checked and reported exactly as on the command line.
void parse_flags(const std::vector<Flag>& flags, cli::OffloadArgs& off, cli::KvArgs& kv) {
  CLI::App app{"flexh2o.LLM keyword arguments", "flexh2o.LLM"};
  app.set_help_flag();  // help=True is not a flag of LLM()
  cli::add_offload_flags(&app, off);
  cli::add_kv_flags(&app, kv);
  std::vector<std::string> args{"flexh2o.LLM"};
  for (const Flag& f : flags) {
    std::string dashed = f.name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    const CLI::Option* o = f.name.find('-') == std::string::npos && !f.name.empty()
                               ? app.get_option_no_throw("--" + dashed)
                               : nullptr;
    if (o == nullptr) throw UnknownFlag("LLM() got an unexpected keyword argument '" + f.name + "'");
    if (o->get_type_size() == 0 || f.values.size() == 1) {  // a switch takes --flag=true|false
      if (f.values.size() != 1) FH_FAIL("--", dashed, " takes one value, got ", f.values.size());
      args.push_back("--" + dashed + "=" + f.values[0]);
    } else {
      args.push_back("--" + dashed);
      args.insert(args.end(), f.values.begin(), f.values.end());
    }
  }
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(int(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    FH_FAIL(e.what());
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The run report of a scoring call: run_report()'s model, device and offload sections with
// the counts of this call (nothing is generated, so the generation fields are left out).
json scoring_report(const cli::LoadedModel& lm, const cli::RunSetup& rs, const CpuDevice& cpu, const std::string& device,
                    size_t requests, int64_t context_tokens, int64_t scored_tokens, double seconds) {
  json r = cli::run_report(lm, rs, GenerateStats{}, cpu, device);
  for (const char* k : {"batches", "prompt_tokens", "padded_prompt_tokens", "generated_tokens", "prefill_seconds",
                        "decode_seconds", "output_seconds", "decode_tokens", "prefill_tokens_per_s",
                        "decode_tokens_per_s", "peak_kv_bytes"})
    r.erase(k);
  r["requests"] = requests;
  r["context_tokens"] = context_tokens;
  r["scored_tokens"] = scored_tokens;
  r["total_seconds"] = seconds;
  r["tokens_per_s"] = seconds > 0 ? double(scored_tokens) / seconds : 0.0;
  return r;
}

}  // namespace

Session::Session(SessionOptions opts) : opts_(std::move(opts)) {
  opts_.env.measured_profile = &measured_profile_;  // a Session is neither copied nor moved (mu_)
  parse_flags(opts_.flags, off_, kv_);
  off_.progress = "auto";  // a "[place weights]" line on a terminal when placing takes a while
  const bool batch_given = opts_.batch_size != 0;
  if (!batch_given) opts_.batch_size = 8;
  if (opts_.batch_size < 1) FH_FAIL("batch_size must be >= 1, got ", opts_.batch_size);
  cli::apply_batch_size_flag(batch_given, opts_.batch_size, off_, /*refuse=*/false);
  const int cores = int(std::thread::hardware_concurrency());  // 0: unknown, no upper bound
  if (opts_.threads < 0 || (cores && opts_.threads > cores))
    FH_FAIL("threads must be in [0, ", cores, "] (0 or None: all ", cores, " hardware threads here), got ", opts_.threads);
  cli::check_hardware_flag(off_, false);
  if (opts_.generation_config != "auto" && opts_.generation_config != "none")
    FH_FAIL("generation_config must be \"auto\" or \"none\", got \"", opts_.generation_config, "\"");
  cli::check_engine_flags(off_, kv_);  // flag errors before loading anything, as the commands
  lm_ = cli::load_model(opts_.env, opts_.model, opts_.tokenizer);
  if (!lm_.warning.empty()) cli::write_stderr(lm_.warning);
  device_ = cli::select_device(opts_.device, *lm_.model, std::cerr);
  cli::run_kv_dtype(kv_, off_.compress_cache, *lm_.model);
  generation_config_ = cli::read_generation_config(opts_.generation_config, lm_.dir, "generation_config=\"none\"");
  std::ostringstream eos_note;
  eos_ids_ = cli::end_of_sequence_ids(lm_.model->config(), lm_.tokenizer ? lm_.tokenizer->eos_id() : std::nullopt,
                                      generation_config_, eos_note);
  if (eos_note.tellp() > 0) cli::write_stderr(eos_note.str());
  if (!opts_.tokenizer.empty()) tokenizer_dir_ = opts_.tokenizer;
  else if (lm_.tokenizer) tokenizer_dir_ = lm_.source;  // the model directory
  cpu_ = std::make_unique<CpuDevice>(opts_.threads);
}

Session::~Session() = default;

const std::string& Session::name() const { return lm_.model->config().name; }
int64_t Session::vocab_size() const { return lm_.model->config().vocab_size; }
int64_t Session::max_length() const { return lm_.model->config().max_positions; }

std::optional<int32_t> Session::eos_id() const {
  if (lm_.tokenizer && lm_.tokenizer->eos_id()) return lm_.tokenizer->eos_id();
  return lm_.model->config().eos_id;
}

std::optional<int32_t> Session::bos_id() const {
  if (lm_.tokenizer && lm_.tokenizer->bos_id()) return lm_.tokenizer->bos_id();
  return lm_.model->config().bos_id;
}

const Tokenizer& Session::tokenizer() const {
  if (!lm_.tokenizer) FH_FAIL("this model has no tokenizer: give token ids or pass tokenizer=DIR");
  return *lm_.tokenizer;
}

std::vector<int32_t> Session::encode(const std::string& text, bool add_special) const {
  return tokenizer().encode(text, add_special);
}

std::string Session::decode(const std::vector<int32_t>& ids) const {
  const Tokenizer& t = tokenizer();
  // The model's ids: those past the tokenizer's (a padded table, which sampling can draw) decode
  // to no text, as in Tokenizer::decode.
  check_token_ids(ids, lm_.model->config(), "decode:");
  return t.decode(ids);
}

void Session::keep_report(cli::RunSetup& rs, const json& report) {
  report_ = report.dump(2, ' ', false, json::error_handler_t::replace);
  rs.reported = true;
}

std::string Session::last_report() const {
  std::lock_guard<std::mutex> lk(mu_);
  return report_;
}

std::unique_ptr<Session::Runner> Session::make_runner(const cli::KvArgs& kv, const Workload& w) {
  auto r = std::make_unique<Runner>();
  r->fwd = std::make_unique<Forward>(*lm_.model, *cpu_);
  r->rs = cli::make_run_setup(off_, kv, opts_.batch_size, *lm_.model, *r->fwd, *cpu_, opts_.env, w.prompt_len,
                              w.gen_len, w.requests, device_, std::cerr);
  return r;
}

// Only --policy auto depends on the workload; its policy stays valid for any workload no larger.
// A new one is planned for the largest of each measure seen, so that calls of two shapes in
// turn plan (and place) at most twice, not on every call; the machine is measured once (measured_profile_).
Session::Runner& Session::runner_for(const Workload& w) {
  const bool fits = w.prompt_len <= runner_workload_.prompt_len && w.gen_len <= runner_workload_.gen_len &&
                    w.requests <= runner_workload_.requests;
  if (!runner_ || (off_.policy_file == "auto" && !fits)) {
    const Workload planned = !runner_ ? w
                                      : Workload{std::max(w.prompt_len, runner_workload_.prompt_len),
                                                 std::max(w.gen_len, runner_workload_.gen_len),
                                                 std::max(w.requests, runner_workload_.requests)};
    runner_.reset();  // its memory (device memory on a GPU) is free before the new one is placed
#ifdef __GLIBC__
    // ... and given back: freed heap stays the process's, and the plan reads what it can take.
    ::malloc_trim(0);
#endif
    try {
      runner_ = make_runner(kv_, planned);
      runner_workload_ = planned;
    } catch (const Error&) {
      if (planned == w) throw;
      runner_ = make_runner(kv_, w);  // the shapes together fit no plan: this call's alone
      runner_workload_ = w;
    }
  } else {
    runner_->rs.start_later_call();  // the report counts this call, not the runner's earlier ones
  }
  return *runner_;
}

std::vector<Completion> Session::generate(const std::vector<Prompt>& prompts, const GenerateParams& p) {
  std::lock_guard<std::mutex> lk(mu_);
  report_.clear();  // a call that fails or runs nothing leaves no earlier call's report
  const ModelConfig& cfg = lm_.model->config();
  std::vector<GenerationRequest> reqs;
  Workload w{1, std::max<int64_t>(1, p.max_new_tokens), int64_t(prompts.size())};
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    try {
      if (const auto* text = std::get_if<std::string>(&prompts[i])) {
        r.prompt_ids = tokenizer().encode(*text, /*add_special=*/true);  // "": BOS alone, as transformers
        if (r.prompt_ids.empty()) FH_FAIL("empty prompt: this model adds no BOS, so it gives no tokens");
      } else {
        r.prompt_ids = std::get<std::vector<int32_t>>(prompts[i]);
      }
      r.max_new_tokens = p.max_new_tokens;
      r.top_logprobs = p.logprobs;
      r.sampling = SamplingParams{p.temperature, p.top_k,         p.top_p,           p.seed + i,
                                  p.min_p,       p.repetition_penalty, p.presence_penalty, p.frequency_penalty,
                                  p.logit_bias};
      validate_request(r, cfg);
    } catch (const Error& e) {
      FH_FAIL("prompt ", i, ": ", e.what());
    }
    w.prompt_len = std::max<int64_t>(w.prompt_len, int64_t(r.prompt_ids.size()));
    reqs.push_back(std::move(r));
  }
  if (reqs.empty()) return {};
  Runner& run = runner_for(w);
  GenerateOptions go;
  go.batch_size = run.rs.runner->max_batch();
  go.ignore_eos = p.ignore_eos;
  go.continuous = p.continuous;
  go.eos_ids = eos_ids_;
  go.pad_id = cfg.pad_id.value_or(0);
  const cli::openai_batch::Decode decode = cli::openai_batch::decoder_of(lm_.tokenizer_or_null());
  cli::openai_batch::check_stop_strings(p.stop, "stop");
  if (!p.stop.empty())
    go.ends_at = [&](size_t, const GenerationResult& res) {
      return cli::openai_batch::text_holds_stop(decode, res.tokens, p.stop, false);
    };
  go.stop = p.interrupt;
  GenerateStats st;
  std::vector<GenerationResult> res = flexh2o::generate(
      *run.rs.runner, reqs, length_sorted_order(reqs, go.batch_size, kDefaultSortWindow), go, &st);
  if (st.interrupted) throw Interrupted();
  note_static_batches(p.continuous, st);
  std::vector<Completion> out;
  for (const GenerationResult& r : res) {
    // As vLLM's: the text leaves EOS out and ends before the first stop string.
    std::string text =
        cli::openai_batch::finish_choice(r.tokens, r.finish == FinishReason::kEos, decode, p.stop, false).text;
    out.push_back({std::move(text), r.tokens, finish_reason_name(r.finish), r.logprobs, r.top_logprobs});
  }
  json report = cli::run_report(lm_, run.rs, st, *cpu_, device_);
  report["requests"] = reqs.size();
  report["finished_requests"] = res.size();
  report["interrupted"] = st.interrupted;
  keep_report(run.rs, report);
  return out;
}

void Session::note_static_batches(bool continuous, const GenerateStats& st) {
  if (!continuous || st.continuous || st.batches == 0 || static_noted_) return;
  static_noted_ = true;  // the results are the same; only the speed differs
  cli::write_stderr("flexh2o: continuous batching needs a full cache (no kv_policy, no sliding-window cap): "
                    "this LLM runs static batches\n");
}

void Session::prepare(int64_t prompt_len, int64_t gen_len, int64_t requests) {
  std::lock_guard<std::mutex> lk(mu_);
  runner_for(Workload{std::max<int64_t>(1, prompt_len), std::max<int64_t>(1, gen_len), std::max<int64_t>(1, requests)});
}

std::vector<std::string> Session::openai(const std::vector<std::string>& lines, const OpenAiParams& p) {
  namespace batch = cli::openai_batch;
  std::lock_guard<std::mutex> lk(mu_);
  report_.clear();  // a call that fails or runs nothing leaves no earlier call's report
  const ModelConfig& cfg = lm_.model->config();
  batch::Hooks hooks = batch::make_hooks(lm_.tokenizer_or_null(), p.render_chat);
  hooks.score_prompts = true;  // echoed prompts' log-probabilities: scored before the call generates
  batch::IdMaker ids{std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32)};
  batch::LiveAnswers live(p.on_event, batch::decoder_of(lm_.tokenizer_or_null()),
                          batch::token_text_of(lm_.tokenizer_or_null()),
                          p.model_name.empty() ? cfg.name : p.model_name, int64_t(std::time(nullptr)), ids);
  // A deque: LiveAnswers holds pointers to the requests while more lines arrive.
  std::deque<std::optional<batch::Request>> requests;
  // Line i parsed and expanded into its engine requests; a line that cannot run gets its error
  // line (and no requests).
  auto expand = [&](size_t i, const std::string& text) {
    requests.emplace_back();
    nlohmann::ordered_json line;  // key order kept for a chat template's tojson
    try {
      line = nlohmann::ordered_json::parse(text);
    } catch (const json::exception& e) {
      live.fail(i, batch::error_line(json(), {"the request is not JSON: " + json_error_text(e), std::nullopt}, ids));
      return std::vector<GenerationRequest>();
    }
    batch::Parsed parsed = batch::parse_input_line(line, hooks, p.stream);
    if (parsed.error) {
      live.fail(i, batch::error_line(parsed.custom_id, *parsed.error, ids));
      return std::vector<GenerationRequest>();
    }
    batch::RunDefaults d = p.defaults;
    d.seed += i;
    try {
      std::vector<GenerationRequest> mine = batch::expand_request(*parsed.request, d, cfg);
      requests[i] = std::move(parsed.request);
      return mine;
    } catch (const batch::RefusedRequest& e) {
      live.fail(i, batch::error_line(parsed.custom_id, e.error, ids));
      return std::vector<GenerationRequest>();
    }
  };
  std::vector<GenerationRequest> reqs;
  Workload w{std::max<int64_t>(1, p.plan_prompt_len), std::max<int64_t>(1, p.plan_gen_len), 0};
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<GenerationRequest> mine = expand(i, lines[i]);
    if (mine.empty()) continue;
    live.add(i, *requests[i], reqs.size(), mine.size());
    for (GenerationRequest& g : mine) {
      w.prompt_len = std::max<int64_t>(w.prompt_len, int64_t(g.prompt_ids.size()));
      w.gen_len = std::max<int64_t>(w.gen_len, g.max_new_tokens);
      reqs.push_back(std::move(g));
    }
  }
  size_t n_lines = lines.size(), n_reqs = reqs.size();
  std::deque<GenerationRequest> ready;  // from more_lines, not yet handed to the driver
  GenerateOptions go;
  go.ignore_eos = p.ignore_eos;
  if (p.continuous && p.more_lines) {
    go.min_rows = std::min(p.plan_prompt_len, cfg.max_positions);
    go.min_capacity = std::min(p.plan_prompt_len + p.plan_gen_len, cfg.max_positions);
    go.more = [&](size_t max_count, int64_t max_prompt, int64_t max_total) {
      if (ready.size() < max_count)
        for (const std::string& text : p.more_lines()) {
          const size_t i = n_lines++;
          std::vector<GenerationRequest> mine = expand(i, text);
          if (mine.empty()) continue;
          if (requests[i]->scores_prompts()) {  // its prompt is scored before a call generates
            live.defer(i);
            continue;
          }
          const bool fits = std::all_of(mine.begin(), mine.end(), [&](const GenerationRequest& g) {
            const int64_t n = int64_t(g.prompt_ids.size());
            return n <= max_prompt && n + g.max_new_tokens <= max_total;
          });
          if (!fits) {
            live.defer(i);
            continue;
          }
          live.add(i, *requests[i], n_reqs, mine.size());
          n_reqs += mine.size();
          for (GenerationRequest& g : mine) ready.push_back(std::move(g));
        }
      std::vector<GenerationRequest> out;
      for (; !ready.empty() && out.size() < max_count; ready.pop_front()) out.push_back(std::move(ready.front()));
      return out;
    };
  }
  if (!reqs.empty() || go.more) {
    w.requests = std::max<int64_t>(int64_t(reqs.size()), p.plan_requests);
    Runner& run = runner_for(w);
    std::vector<batch::Request*> echoed;
    for (auto& r : requests)
      if (r && r->scores_prompts()) echoed.push_back(&*r);
    batch::score_echoed_prompts(*run.rs.runner, echoed);
    go.batch_size = run.rs.runner->max_batch();
    go.eos_ids = eos_ids_;
    go.pad_id = cfg.pad_id.value_or(0);
    go.stop = p.interrupt;
    go.continuous = p.continuous;
    go.ends_at = [&](size_t r, const GenerationResult& res) { return live.on_token(r, res); };
    go.on_result = [&](size_t r, const GenerationResult& res) { live.on_result(r, res); };
    GenerateStats st;
    const std::vector<GenerationResult> res =
        flexh2o::generate(*run.rs.runner, reqs, length_sorted_order(reqs, go.batch_size, kDefaultSortWindow), go, &st);
    if (st.interrupted) throw Interrupted();
    note_static_batches(p.continuous, st);
    json report = cli::run_report(lm_, run.rs, st, *cpu_, device_);
    report["requests"] = n_lines;
    report["finished_requests"] = res.size();
    report["cancelled_requests"] = live.cancelled();
    keep_report(run.rs, report);
  }
  std::vector<std::string> text;
  for (size_t i = 0; i < n_lines; ++i) text.push_back(live.line(i).dump(-1, ' ', false, json::error_handler_t::replace));
  return text;
}

std::vector<std::pair<double, bool>> Session::loglikelihood(
    const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>& requests, bool streaming,
    const std::atomic<bool>* interrupt) {
  std::lock_guard<std::mutex> lk(mu_);
  report_.clear();  // a call that fails or runs nothing leaves no earlier call's report
  if (requests.empty()) return {};
  std::vector<LoglikRequest> reqs;
  Workload w{1, 1, int64_t(requests.size())};
  int64_t ctx_tokens = 0, scored = 0;
  for (const auto& [ctx, cont] : requests) {
    reqs.push_back({ctx, cont});
    w.prompt_len = std::max<int64_t>(w.prompt_len, streaming ? 1 : int64_t(ctx.size()));
    w.gen_len = std::max<int64_t>(w.gen_len, int64_t(cont.size() + (streaming && !ctx.empty() ? ctx.size() - 1 : 0)));
    ctx_tokens += int64_t(ctx.size());
    scored += int64_t(cont.size());
  }
  const auto t0 = std::chrono::steady_clock::now();
  Runner& run = runner_for(w);
  const std::vector<LoglikResult> res =
      streaming ? loglikelihoods_streamed(*run.rs.runner, reqs, interrupt)
                : loglikelihoods(*run.rs.runner, reqs, kScoringLogitsBytes, interrupt);
  std::vector<std::pair<double, bool>> out;
  for (const LoglikResult& r : res) out.emplace_back(r.loglik, r.greedy);
  keep_report(run.rs,
              scoring_report(lm_, run.rs, *cpu_, device_, reqs.size(), ctx_tokens, scored, seconds_since(t0)));
  return out;
}

std::vector<Session::TokenScores> Session::score(const std::vector<std::vector<int32_t>>& seqs, int top,
                                                const std::atomic<bool>* interrupt) {
  if (top < 0 || top > kMaxTopLogprobs) FH_FAIL("top must be in [0, ", kMaxTopLogprobs, "], got ", top);
  std::lock_guard<std::mutex> lk(mu_);
  report_.clear();  // a call that fails or runs nothing leaves no earlier call's report
  std::vector<TokenScores> out(seqs.size());
  std::vector<LoglikRequest> reqs;
  std::vector<size_t> of;  // the sequence of each request (those of one token have nothing to score)
  Workload w{1, 1, 0};
  int64_t scored = 0;
  const int64_t positions = lm_.model->config().max_positions;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].size() < 2) continue;
    if (int64_t(seqs[i].size()) - 1 > positions)  // said of the sequence, not of the request it becomes
      FH_FAIL("sequence ", i, " is ", seqs[i].size(), " tokens; scoring it reads ", seqs[i].size() - 1,
              " of them, more than the model's ", positions, " positions");
    reqs.push_back({{seqs[i].front()}, {seqs[i].begin() + 1, seqs[i].end()}});
    of.push_back(i);
    w.gen_len = std::max<int64_t>(w.gen_len, int64_t(seqs[i].size()) - 1);
    scored += int64_t(seqs[i].size()) - 1;
  }
  if (reqs.empty()) return out;
  w.requests = int64_t(reqs.size());
  const auto t0 = std::chrono::steady_clock::now();
  Runner& run = runner_for(w);
  const std::vector<std::vector<ScoredToken>> res =
      score_tokens(*run.rs.runner, reqs, top, kScoringLogitsBytes, interrupt);
  for (size_t k = 0; k < res.size(); ++k)
    for (const ScoredToken& t : res[k]) {
      std::vector<std::pair<int32_t, float>> alts;
      for (const TokenLogprob& a : t.top) alts.emplace_back(a.id, a.logprob);
      out[of[k]].emplace_back(t.logprob, std::move(alts));
    }
  keep_report(run.rs, scoring_report(lm_, run.rs, *cpu_, device_, reqs.size(), int64_t(reqs.size()), scored,
                                     seconds_since(t0)));
  return out;
}

std::vector<double> Session::loglikelihood_rolling(const std::vector<std::vector<int32_t>>& seqs,
                                                   const std::atomic<bool>* interrupt) {
  std::lock_guard<std::mutex> lk(mu_);
  report_.clear();  // a call that fails or runs nothing leaves no earlier call's report
  if (seqs.empty()) return {};
  const ModelConfig& c = lm_.model->config();
  // Each sequence is a request from its first token, so a KV policy's ratios are fractions of
  // the tokens scored, per sequence (as eval-ppl), on one runner.
  std::vector<LoglikRequest> reqs;
  std::vector<size_t> of;  // the sequence of each request (those of one token sum to 0)
  int64_t longest = 1, scored = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].empty()) FH_FAIL("sequence ", i, " is empty");
    const int64_t n = int64_t(seqs[i].size()) - 1;
    if (n > c.max_positions)
      FH_FAIL("sequence ", i, " is ", seqs[i].size(), " tokens; scoring it reads ", n,
              " of them, more than the model's ", c.max_positions, " positions");
    check_token_ids(seqs[i], c, detail::concat("sequence ", i, ":").c_str());
    if (n == 0) continue;
    reqs.push_back({{seqs[i].front()}, {seqs[i].begin() + 1, seqs[i].end()}});
    of.push_back(i);
    longest = std::max(longest, n);
    scored += n;
  }
  std::vector<double> out(seqs.size(), 0.0);
  if (reqs.empty()) return out;
  const auto t0 = std::chrono::steady_clock::now();
  Runner& run = runner_for({1, longest, int64_t(reqs.size())});
  const std::vector<LoglikResult> res = loglikelihoods_streamed(*run.rs.runner, reqs, interrupt);
  for (size_t k = 0; k < res.size(); ++k) out[of[k]] = res[k].loglik;
  keep_report(run.rs, scoring_report(lm_, run.rs, *cpu_, device_, seqs.size(), int64_t(seqs.size()), scored,
                                     seconds_since(t0)));
  return out;
}

}  // namespace flexh2o::python
