// The flexh2o subcommands. Each registers its flags on a CLI11 subcommand and runs with the
// parsed values; run_* returns the process exit code (0 ok, 1 failure or some bad input lines)
// or kInterrupted.
#pragma once

#include <CLI/CLI.hpp>
#include <set>
#include <optional>
#include <string>

#include "cli/common.h"
#include "cli/kv_flags.h"
#include "cli/offload_flags.h"
#include "engine/generate.h"
#include "policies/kv_config.h"

namespace flexh2o::cli {

// What run_* returns when Env::stop ended it early (what finished is kept); main() turns it
// into 128 + the signal's number, the shell's convention (130 for SIGINT, 143 for SIGTERM).
constexpr int kInterrupted = -1;

// --pipeline-stages and what goes with it (cli/pipeline_run.h).
struct PipelineArgs {
  int stages = 1;          // layers split over this many ranks (mpirun -np the same)
  int groups = 0;          // batches in flight (FlexGen's inner iterations); 0: one per stage
};

struct GenerateArgs {
  std::string model, tokenizer, input, output, report, device = "auto";
  std::optional<std::string> prompt;  // --prompt, which may be "" (generation from BOS alone)
  int64_t max_new_tokens = 32, batch_size = 8;
  bool batch_size_given = false;  // -b on the command line (check_batch_size_flag)
  // --sort-window: requests sorted by prompt length within windows of this many batches
  // (length_sorted_order); 1 = input order.
  int64_t sort_window = kDefaultSortWindow;
  bool continuous = false;  // --continuous: GenerateOptions::continuous
  float temperature = 1.0f, top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.f, repetition_penalty = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;
  int logprobs = -1;  // --logprobs N: per-token log-probabilities (and N alternatives); -1 = none
  std::vector<std::string> stop;  // --stop: the stop strings of --prompt and of flexh2o lines without "stop"
  // --generation-config auto|none: the model's generation_config.json sampling values as the
  // defaults of the sampling flags not given (their names in sampling_given), or not.
  std::string generation_config = "auto";
  std::set<std::string> sampling_given;
  uint64_t seed = 0;
  int threads = 0;
  bool greedy = false, ignore_eos = false, quiet = false;
  bool resume = false, overwrite = false;  // what to do with an --output that already holds results
  std::string progress = "auto";           // --progress auto|always|never
  double rank_timeout = 300;               // --rank-timeout: seconds a rank of an mpirun job may be silent
  OffloadArgs offload;
  KvArgs kv;
  PipelineArgs pipeline;
  // Renders an OpenAI chat body ("messages", ...) with the model's chat template into the
  // prompt text (special tokens as text; tokenized without adding BOS/EOS). Null in the
  // flexh2o binary: chat lines then fail with a message naming the Python front end.
  std::function<std::string(const nlohmann::ordered_json& body)> render_chat;
};
void register_generate(CLI::App& app, GenerateArgs& a);
int run_generate(const GenerateArgs& a, const Env& env);

struct BenchArgs {
  std::string model, report, device = "auto", progress = "auto";
  int64_t prompt_len = 512, gen_len = 32, num_prompts = 0, batch_size = 8;
  bool batch_size_given = false;  // -b on the command line (check_batch_size_flag)
  bool warmup = false;            // a first block's prefill before the timed run (FlexGen's)
  uint64_t seed = 0;
  float temperature = 0.f, top_p = 1.f;  // greedy by default, as FlexGen's benchmark
  int top_k = 0;
  int threads = 0;
  OffloadArgs offload;
  KvArgs kv;
};
void register_bench(CLI::App& app, BenchArgs& a);
int run_bench(const BenchArgs& a, const Env& env);

struct TokenizeArgs {
  std::string tokenizer, input, output;
  bool no_special = false;
};
void register_tokenize(CLI::App& app, TokenizeArgs& a, bool detokenize);
int run_tokenize(const TokenizeArgs& a, bool detokenize, const Env& env);

struct InfoArgs {
  std::string model;
  bool json = false;
};
void register_info(CLI::App& app, InfoArgs& a);
int run_info(const InfoArgs& a, const Env& env);

struct ConvertArgs {
  std::string model, output;
};
void register_convert(CLI::App& app, ConvertArgs& a);
int run_convert(const ConvertArgs& a, const Env& env);

struct EvalPplArgs {
  std::string model, tokenizer, file, device = "auto", progress = "auto";
  int64_t max_tokens = 1024;
  int threads = 0;
  bool json = false, streaming = false;
  KvArgs kv;
  OffloadArgs offload;  // any offloading flag: streamed through the offloading engine
};
void register_eval_ppl(CLI::App& app, EvalPplArgs& a);
int run_eval_ppl(const EvalPplArgs& a, const Env& env);

struct EvalChoiceArgs {
  std::string model, tokenizer, tasks, device = "auto", progress = "auto";
  std::string target_delimiter;  // between context and choice, as lm-eval's task option
  std::string log_samples;       // per-item JSONL output; empty: none
  bool streaming = false;        // score_choices_streamed: a token a step from the first
  int64_t num_fewshot = 0, limit = 0, batch_size = 0;
  uint64_t fewshot_seed = 1234;
  int threads = 0;
  bool json = false;
  KvArgs kv;
  OffloadArgs offload;  // any offloading flag: scored through the offloading engine
};
void register_eval_choice(CLI::App& app, EvalChoiceArgs& a);
int run_eval_choice(const EvalChoiceArgs& a, const Env& env);

struct PlanArgs {
  std::string model, hardware, overlap = "true", sep_layer = "true";
  int64_t prompt_len = 512, gen_len = 32, gpu_batch_size = 0, num_gpu_batches = 0;
  KvArgs kv;  // generate's KV flags: what the run would be given
  std::vector<double> percent;
  bool cpu_cache_compute = false, json = false;
  bool compress_weight = false, compress_cache = false, allow_compress = false, no_compress = false;
  int64_t pipeline_stages = 0, groups = 0;  // > 0 stages: plan a pipeline (planner/pipeline.h)
  std::string stage_link;                   // link preset or file; empty: the profile's
  std::string gpu_mem, cpu_mem, disk_mem;   // tier capacities over the profile's (cap_profile_memory)
};
void register_plan(CLI::App& app, PlanArgs& a);
int run_plan(const PlanArgs& a, const Env& env);

struct ProfileArgs {
  std::string offload_dir, output, name;
  int threads = 0;
};
void register_profile(CLI::App& app, ProfileArgs& a);
int run_profile(const ProfileArgs& a, const Env& env);

}  // namespace flexh2o::cli
