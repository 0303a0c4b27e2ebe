// What flexh2o.LLM holds (the Python extension's engine side, free of pybind11): a loaded
// model (weights memory-mapped for the session's life), its tokenizer, the CLI's offloading /
// KV-cache flags parsed by the CLI's own registration, and a runner built by the CLI's
// make_run_setup, kept while the workload fits it. Calls serialize on an internal mutex, so
// one Session may be shared by threads; every failure throws (flexh2o::Error, or UnknownFlag).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cli/common.h"
#include "cli/openai_batch.h"
#include "cli/openai_stream.h"
#include "cli/kv_flags.h"
#include "cli/offload_flags.h"
#include "cli/run_setup.h"
#include "cli/sampling_flags.h"

namespace flexh2o::python {

// A keyword argument of LLM(): `name` as Python spells it (heavy_ratio), its value as text
// (one item, or several for percent=[...]); `is_bool` when Python passed True/False.
struct Flag {
  std::string name;
  std::vector<std::string> values;
  bool is_bool = false;
};

// A keyword that is none of the CLI's offloading / KV-cache flags (Python raises TypeError).
class UnknownFlag : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct SessionOptions {
  std::string model, tokenizer, device = "auto";
  int64_t batch_size = 0;  // 0: not given (8; an offloading policy's block)
  int threads = 0;  // 0: all cores
  // "auto": the model's generation_config.json is read (Session::generation_config); "none": not.
  std::string generation_config = "auto";
  std::vector<Flag> flags;
  cli::Env env;
};

struct GenerateParams {
  int64_t max_new_tokens = 32;
  float temperature = 0.f, top_p = 1.f;
  int top_k = 0;
  uint64_t seed = 0;  // request i uses seed + i
  bool ignore_eos = false;
  // A sequence ends once its text holds one of these (finish_reason "stop"); its text is cut
  // before the first, as OpenAI's completions do; token_ids keep the tokens that made it.
  std::vector<std::string> stop;
  // Once true, generation ends within the step under way and generate() throws Interrupted.
  const std::atomic<bool>* interrupt = nullptr;
  float min_p = 0.f, repetition_penalty = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;  // sampler.h
  int logprobs = -1;  // GenerationRequest::top_logprobs
  std::vector<std::pair<int32_t, float>> logit_bias;  // SamplingParams::logit_bias, every prompt
  bool continuous = false;  // GenerateOptions::continuous
};

// What Session::openai() runs OpenAI request lines with.
struct OpenAiParams {
  cli::openai_batch::RunDefaults defaults;  // flags that are not OpenAI parameters, seed, max_tokens cap
  // The workload the runner is planned for at least (a server's bounds), so --policy auto
  // places the weights once rather than again for each larger batch.
  int64_t plan_prompt_len = 0, plan_gen_len = 0, plan_requests = 0;
  // The "model" of answers to requests without one (a server's --served-model-name); empty:
  // the config's name.
  std::string model_name;
  // A chat body -> prompt text (the model's template); null: chat lines get a 400 error.
  std::function<std::string(const nlohmann::ordered_json& body)> render_chat;
  // Once true, generation ends within the step under way and openai() throws Interrupted.
  const std::atomic<bool>* interrupt = nullptr;
  // "stream": true is honoured (a server); else refused as in Batch files.
  bool stream = false;
  bool continuous = false;  // GenerateOptions::continuous
  bool ignore_eos = false;  // GenerateOptions::ignore_eos: every request generates its max_tokens
  // With continuous: called on the generating thread while slots are free, for request lines
  // that arrived since the call began (JSON text, as `lines`); each takes the next line index.
  // One longer than the running batch was sized for gets a kDefer event and is not answered
  // (the caller runs it in a later call). Null: none.
  std::function<std::vector<std::string>()> more_lines;
  // Called on the generating thread as answers are ready (cli/openai_stream.h): each line's
  // output line as soon as its choices have ended (an error line before generation), and a
  // streamed line's chunks as its tokens are drawn. May be null.
  cli::openai_batch::LiveAnswers::Emit on_event;
};

// generate() was ended by GenerateParams::interrupt (Ctrl-C in Python).
struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// A prompt: text (BOS added per the model's convention) or token ids (used exactly).
using Prompt = std::variant<std::string, std::vector<int32_t>>;

struct Completion {
  std::string text;
  std::vector<int32_t> token_ids;  // generated only
  std::string finish_reason;       // "eos" | "length" | "stop"
  std::vector<float> logprobs;     // per token, when asked (GenerationResult)
  std::vector<std::vector<TokenLogprob>> top_logprobs;
};

class Session {
 public:
  // Parses the flags (the CLI's messages on bad values), selects the device and loads the model.
  explicit Session(SessionOptions opts);
  ~Session();

  const std::string& name() const;
  int64_t vocab_size() const;
  int64_t max_length() const;  // max_position_embeddings
  std::optional<int32_t> eos_id() const;
  // The ids that end a sequence (cli::end_of_sequence_ids: the tokenizer's, config.json's and
  // generation_config.json's, under "none" too).
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  std::optional<int32_t> bos_id() const;
  // The directory holding the tokenizer files (tokenizer_config.json); empty for a preset
  // without tokenizer=.
  const std::string& tokenizer_dir() const { return tokenizer_dir_; }
  // The sampling defaults of the model's generation_config.json (cli/sampling_flags.h): empty
  // with generation_config "none", for a preset, or a file without them. Generation does not
  // apply them itself; the front end passes them as defaults of its arguments (as the CLI does).
  const cli::GenerationConfig& generation_config() const { return generation_config_; }

  std::vector<int32_t> encode(const std::string& text, bool add_special) const;
  std::string decode(const std::vector<int32_t>& ids) const;

  std::vector<Completion> generate(const std::vector<Prompt>& prompts, const GenerateParams& p);
  // Builds the runner (placing the weights) for a workload of requests up to these sizes now,
  // so that a later call within them starts at once; placement errors (a budget too small)
  // are thrown here.
  void prepare(int64_t prompt_len, int64_t gen_len, int64_t requests);
  // OpenAI Batch input lines (JSON text: custom_id, method, url, body) -> their output lines, in
  // order, as `flexh2o generate` writes them (cli/openai_batch.h): a line that cannot run gets
  // its 400 error line, the others run together in the engine's batches; with more_lines, the
  // lines it brought follow (a deferred one's entry is "null"). Throws when the engine fails or
  // on Interrupted (the lines not yet answered through on_event are then not answered).
  std::vector<std::string> openai(const std::vector<std::string>& lines, const OpenAiParams& p);
  // (log p(continuation | context) in nats, is_greedy) per request; `streaming`: each read a
  // token a step from its first id (loglikelihoods_streamed, evaluate.h). The scoring calls
  // throw ScoringStopped within the step under way once `*interrupt` (optional) is set.
  std::vector<std::pair<double, bool>> loglikelihood(
      const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>& requests, bool streaming = false,
      const std::atomic<bool>* interrupt = nullptr);
  // Per sequence: sum over t >= 1 of log p(ids[t] | ids[:t]) (with a KV policy one token a
  // step, its ratios fractions of the sequence's tokens scored, else many; evaluate.h).
  std::vector<double> loglikelihood_rolling(const std::vector<std::vector<int32_t>>& seqs,
                                            const std::atomic<bool>* interrupt = nullptr);
  // Per sequence, for each token after the first: (log p(ids[t] | ids[:t]) in nats, the `top`
  // most likely tokens there as (id, log p), most likely first); what OpenAI's echo reports.
  using TokenScores = std::vector<std::pair<float, std::vector<std::pair<int32_t, float>>>>;
  std::vector<TokenScores> score(const std::vector<std::vector<int32_t>>& seqs, int top,
                                 const std::atomic<bool>* interrupt = nullptr);

  // The JSON run report of the last successful call ("" before the first). Its offload counts
  // (bytes moved, queue times, token steps) are that call's; a call that built the runner also
  // counts the weights' placement. Peaks are the runner's since it was built.
  std::string last_report() const;

 private:
  struct Runner;  // a RunSetup with the Forward it computes with
  struct Workload {
    int64_t prompt_len = 0, gen_len = 0, requests = 0;
    bool operator==(const Workload&) const = default;
  };
  // The runner for a workload, built when needed; a reused one starts a new report interval.
  Runner& runner_for(const Workload& w);
  // Keeps a call's report for last_report(); the runner's later calls count no placement.
  void keep_report(cli::RunSetup& rs, const nlohmann::json& report);
  std::unique_ptr<Runner> make_runner(const cli::KvArgs& kv, const Workload& w);
  const Tokenizer& tokenizer() const;
  // continuous=True that ran static batches (a KV policy, a window cap): said once per session.
  void note_static_batches(bool continuous, const GenerateStats& st);

  mutable std::mutex mu_;
  SessionOptions opts_;
  cli::OffloadArgs off_;
  cli::KvArgs kv_;
  std::string device_;
  std::string tokenizer_dir_;
  cli::GenerationConfig generation_config_;
  std::vector<int32_t> eos_ids_;
  cli::LoadedModel lm_;
  std::unique_ptr<CpuDevice> cpu_;
  std::unique_ptr<Runner> runner_;
  Workload runner_workload_;
  std::optional<cli::MeasuredProfile> measured_profile_;  // --policy auto's, for the plans after the first
  std::string report_;
  bool static_noted_ = false;
};

}  // namespace flexh2o::python
