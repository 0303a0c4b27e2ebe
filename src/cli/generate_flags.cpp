// `flexh2o generate`'s flags and --help text (the command itself: cmd_generate.cpp).
#include "cli/commands.h"
#include "cli/kv_flags.h"
#include "cli/offload_flags.h"
#include "cli/pipeline_run.h"
#include "cli/dp_generate.h"
#include "cli/progress.h"
#include "cli/sampling_flags.h"

namespace flexh2o::cli {

void register_generate(CLI::App& app, GenerateArgs& a) {
  auto* g = app.add_subcommand("generate", "Generate text for one prompt or a JSONL file of prompts");
  g->add_option("--model,-m", a.model,
                "Model: a HF model directory, a hub id found in the local HF cache (ORG/NAME), "
                "or a preset name from configs/models (dummy weights)")->required();
  g->add_option("--tokenizer", a.tokenizer, "Tokenizer directory (default: the model directory)");
  auto* p = g->add_option("--prompt,-p", a.prompt, "One prompt (BOS added per model convention)");
  auto* in = g->add_option(
      "--input,-i", a.input,
      "JSONL input (- : standard input), one request a line, in one of two formats (see below): flexh2o's {\"prompt\": ...}, "
      "{\"prompt_ids\": [...]} or {\"messages\": [...]} (a chat: `python -m flexh2o generate` renders the "
      "model's template) with optional id, max_new_tokens, temperature, top_k, top_p, min_p, "
      "repetition_penalty, presence_penalty, frequency_penalty, seed, logprobs, logit_bias, stop (chats also "
      "add_generation_prompt, continue_final_message, chat_template_kwargs, as in Batch bodies); or an OpenAI "
      "Batch file ({\"custom_id\", \"method\": \"POST\", \"url\": \"/v1/completions\" or \"/v1/chat/completions\", "
      "\"body\"}). Output lines follow the input's format");
  p->excludes(in);
  g->add_option("--output,-o", a.output,
                "JSONL output (id, text, token_ids, finish_reason, logprobs when asked; Batch output lines for a Batch file; default, - or /dev/stdout: standard output, without the printed texts). Results are appended as they "
                "finish and fsync'd after each batch; a file that already holds results is refused unless "
                "--resume or --overwrite is given");
  auto* resume = g->add_flag("--resume", a.resume,
                             "Finish an interrupted or killed run: keep --output's complete lines, skip the "
                             "requests whose id they hold (ids must be unique strings or numbers; a line with an "
                             "\"error\" counts as done: delete it to retry), append the rest. A missing --output "
                             "simply starts the run");
  g->add_flag("--overwrite", a.overwrite, "Replace the results an existing --output holds")->excludes(resume);
  g->add_option("--report", a.report,
                "Write a JSON run report (timings, tokens/s, memory) to this file; a single-process run that fails "
                "midway (a full disk), or while placing the weights, writes it too, with \"error\" and the steps and "
                "results done before");
  g->add_option("--max-new-tokens,-n", a.max_new_tokens, "Tokens to generate per prompt (default for lines)")
      ->capture_default_str()->check(at_least(0));
  g->add_option("--batch-size,-b", a.batch_size,
                "Prompts prefilled and decoded together. With offloading flags the batch is the policy's "
                "block (--gpu-batch-size, default 4, x --num-gpu-batches, default 1); -b given there is "
                "--gpu-batch-size B and contradicts --gpu-batch-size, --num-gpu-batches and --policy")
      ->capture_default_str()->check(at_least(1))->each([&a](const std::string&) { a.batch_size_given = true; });
  g->add_option("--sort-window", a.sort_window,
                 "Run requests sorted by prompt length (then max_new_tokens) within windows of this many batches, "
                 "so a batch pads less (each batch is left-padded to its longest prompt, and padding costs what "
                 "tokens do). Results are the same and stay in input order; a result is written once every earlier "
                 "one is done, up to this many batches later. 1: input order")
      ->capture_default_str()->check(at_least(1));
  g->add_flag("--continuous", a.continuous,
              "Continuous batching: a sequence that ends (EOS, a stop string, its max_new_tokens) hands its "
              "slot to the next request, in one step with the batch's other sequences once a quarter of the "
              "slots are free, instead of leaving it idle until the whole batch ends. Each result is the same as without "
              "it. Pays off when lengths vary (EOS, mixed max_tokens); needs a full cache (no --kv-policy or "
              "window cap; every placement, --cpu-cache-compute included), "
              "else it runs static batches and says so, as it does under mpirun (pipeline stages, data-parallel "
              "ranks)");
  add_sampling_flags(*g, a);
  g->add_option("--stop", a.stop,
                "A stop string (repeat for several): a sequence ends once its text holds one, the text is cut "
                "before it (token_ids keep every generated token), finish_reason \"stop\". For --prompt and the "
                "flexh2o lines without their own \"stop\" (a string or an array of strings; [] for none); Batch "
                "lines take their body's. A newline from a shell: --stop $'\\n\\n'")
      ->allow_extra_args(false);
  g->add_flag("--ignore-eos", a.ignore_eos, "Generate exactly max_new_tokens (benchmarks need fixed lengths)");
  g->add_option("--device", a.device,
                "cpu, cuda (the offloading engine on the GPU: everything resident, or placed by the offloading "
                "flags) or auto (cuda when a GPU is usable)")
      ->capture_default_str();
  add_threads_flag(g, a.threads);
  g->add_flag("--quiet,-q", a.quiet, "Do not print results to stdout when --output is a file");
  add_progress_flag(*g, a.progress);
  add_offload_flags(g, a.offload);
  add_kv_flags(g, a.kv);
  add_data_parallel_flags(*g, a.rank_timeout);
  add_pipeline_flags(g, a.pipeline);
  g->footer(
      "OpenAI Batch files (--input lines {\"custom_id\", \"method\": \"POST\", \"url\", \"body\"}):\n"
      "  Output: a line per request, in input order: {\"id\": \"batch_req_...\", \"custom_id\", \"response\": "
      "{\"status_code\": 200, \"request_id\", \"body\": a text_completion or chat.completion with choices and usage}, "
      "\"error\": null}; a line that cannot run gets status_code 400 and body.error {message, type, param, code}.\n"
      "  Body: model is echoed back, never used to pick a model (--model does). prompt: a string (BOS added, as for "
      "flexh2o lines), token ids (used as given), or an array of either (choices for each). max_tokens (or "
      "max_completion_tokens): default 16 for completions, up to the context for chat (give it: the KV cache is "
      "sized for it). temperature (default 1), top_p (1), presence_penalty and frequency_penalty (0), logprobs "
      "(completions: 0..5 alternatives; chat: true, with top_logprobs 0..20), n (choice k uses seed + k * "
      "0x9E3779B97F4A7C15), stop (up to 4 strings: the text is cut before the first, finish_reason \"stop\"), "
      "seed (default --seed + the line's index). --max-new-tokens, --temperature, --top-p and the two penalties do not apply; --greedy and "
      "--ignore-eos do.\n"
      "  vLLM's extra body parameters (an OpenAI client's extra_body) are taken too: top_k (-1 or 0: off), min_p and "
      "repetition_penalty (default --top-k, --min-p, --repetition-penalty); skip_special_tokens (default true, as "
      "vLLM's: special tokens' text is left out of choices); for chat add_generation_prompt (default "
      "true), continue_final_message (the prompt ends inside the last message, which the model continues, as "
      "transformers cuts it; needs add_generation_prompt false) and chat_template_kwargs (variables for the "
      "template, e.g. {\"enable_thinking\": false}; the two flags there override the body's, as in vLLM; messages, "
      "tools, documents and chat_template are refused).\n"
      "  logit_bias ({\"token id\": bias in [-100, 100]}, added after the penalties, greedy too) is taken; echo "
      "(completions: the text begins with the prompt's; with logprobs its tokens and their log-probabilities "
      "too, the first null; not with --pipeline-stages). "
      "Other OpenAI parameters (stream, suffix, tools, response_format, ...) are "
      "refused unless at their default, unknown ones are refused as OpenAI does, and user (and on chat lines "
      "metadata, store, service_tier, parallel_tool_calls, prompt_cache_key, safety_identifier) is ignored. "
      "custom_ids must be unique: a file that repeats one is refused before the run.\n"
      "  Chat lines need the model's (Jinja) chat template, which the flexh2o binary cannot render: "
      "`python -m flexh2o generate ...` (the same flags) renders it (its text is tokenized without adding BOS).\n\n"
      "Exit code: 0 when every request has a result, 1 when any line failed (its \"error\" is in the output) or on "
      "an error, 2 when the command line is wrong (a flag's value out of range, flags that contradict). "
      "SIGINT/SIGTERM/SIGHUP (SIGHUP unless ignored, as under nohup; SIGINT even where a script's background "
      "job came with it ignored) stop within the token step under way (at its next layer or offloaded unit; a "
      "large batch's prefill is one step; under mpirun at the next step): finished results are kept, the report "
      "says \"interrupted\": true, the exit code is 128 + the signal (130, 143, 129), and --resume finishes the "
      "run. A second signal (100 ms or more after the first: timeout(1) sends one twice) ends it at once, "
      "without a report (--resume still works).");
}

}  // namespace flexh2o::cli
