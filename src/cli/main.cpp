// flexh2o command-line entry point: parses flags (CLI11), reads the environment once, runs a
// subcommand and maps failures to exit codes (0 ok, 1 error or bad input, 2 usage error).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <new>

#include "cli/commands.h"
#include "core/error.h"

#ifndef FLEXH2O_SOURCE_CONFIGS
#define FLEXH2O_SOURCE_CONFIGS ""
#endif

namespace {
namespace fs = std::filesystem;

std::optional<fs::path> env_path(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return fs::path(v);
}

// configs/ next to the installed binary (share/flexh2o/configs) or the source tree's.
fs::path default_configs_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path p : {exe.parent_path() / "../share/flexh2o/configs", exe.parent_path() / "../configs"})
      if (fs::is_directory(p / "models")) return fs::weakly_canonical(p);
  }
  return FLEXH2O_SOURCE_CONFIGS;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flexh2o::cli;
  CLI::App app{
      "flexh2o: high-throughput batch generation for LLMs larger than your GPU\n"
      "(offloading across GPU / host / NVMe, H2O KV-cache eviction).\n\n"
      "Examples:\n"
      "  flexh2o generate -m tests/data/tiny-opt --input prompts.jsonl --output out.jsonl --report run.json\n"
      "  flexh2o generate -m facebook/opt-1.3b --prompt \"Hello\" --greedy -n 20\n"
      "  flexh2o bench -m opt-1.3b --prompt-len 512 --gen-len 32 --percent 50 50 0 100 100 0 --gpu-batch-size 8\n"
      "  flexh2o info opt-30b\n"
      "  flexh2o tokenize --tokenizer tests/data/tiny-opt < texts.jsonl\n",
      "flexh2o"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "flexh2o 0.1.0");
  Env env;
  std::string configs;
  app.add_option("--configs", configs, "Directory with models/*.json presets (default: the installed configs/)");

  GenerateArgs gen;
  BenchArgs bench;
  TokenizeArgs tok, detok;
  InfoArgs info;
  EvalPplArgs ppl;
  EvalChoiceArgs choice;
  PlanArgs plan;
  ProfileArgs profile;
  register_generate(app, gen);
  register_bench(app, bench);
  register_tokenize(app, tok, false);
  register_tokenize(app, detok, true);
  register_info(app, info);
  register_eval_ppl(app, ppl);
  register_eval_choice(app, choice);
  register_plan(app, plan);
  register_profile(app, profile);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  env.hub.hf_hub_cache = env_path("HF_HUB_CACHE");
  env.hub.hf_home = env_path("HF_HOME");
  env.hub.home = env_path("HOME");
  env.configs_dir = configs.empty() ? default_configs_dir() : fs::path(configs);
  env.stderr_is_tty = isatty(STDERR_FILENO) != 0;

  try {
    CLI::App* sub = app.get_subcommands().front();
    const std::string name = sub->get_name();
    if (name == "generate") return run_generate(gen, env);
    if (name == "bench") return run_bench(bench, env);
    if (name == "tokenize") return run_tokenize(tok, false);
    if (name == "detokenize") return run_tokenize(detok, true);
    if (name == "info") return run_info(info, env);
    if (name == "eval-ppl") return run_eval_ppl(ppl, env);
    if (name == "eval-choice") return run_eval_choice(choice, env);
    if (name == "plan") return run_plan(plan, env);
    if (name == "profile") return run_profile(profile, env);
    std::cerr << "flexh2o: unknown command " << name << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    // Inputs are validated against what the files hold before allocating; what remains is a
    // run that genuinely needs more memory than this machine gives it.
    std::cerr << "flexh2o: error: out of memory while running `" << app.get_subcommands().front()->get_name()
              << "`: this run needs more host memory than is available (lower --gpu-batch-size or "
                 "--num-gpu-batches, offload more with --percent, or use a smaller model).\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "flexh2o: error: " << e.what() << "\n";
    return 1;
  }
}
