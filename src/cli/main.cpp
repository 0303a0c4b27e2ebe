// flexh2o command-line entry point: parses flags (CLI11), reads the environment once, runs a
// subcommand and maps failures to exit codes (0 ok, 1 error or bad input, 2 usage error,
// 128 + signal after SIGINT/SIGTERM stopped a command that stops cleanly).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <new>
#include <thread>

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

// SIGINT/SIGTERM for the commands that poll Env::stop: both signals are blocked in every thread
// (install before any thread starts, so the engine's threads inherit the mask and never see
// EINTR) and taken by one thread with sigwait(). The first sets the stop flag; a second ends the
// process at once by the signal's default action.
std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

void stop_on_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  if (int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0)
    throw std::runtime_error(std::string("cannot block SIGINT/SIGTERM: ") + std::strerror(rc));
  // Detached: it ends with the process; it only touches the two atomics above.
  std::thread([set] {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) return;
    g_signal.store(sig);
    g_stop.store(true);
    if (sigwait(&set, &sig) != 0) return;
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    raise(sig);
  }).detach();
}

// Standard output is checked once at the end (a full disk or /dev/full must not exit 0).
bool stdout_ok() {
  errno = 0;
  std::cout.flush();  // through stdio (synced): a failed write sets errno here or in fflush
  const bool ok = std::cout.good() && std::fflush(stdout) == 0 && !std::ferror(stdout);
  const int err = errno;
  if (!ok)
    std::cerr << "flexh2o: error: cannot write standard output" << (err ? std::string(": ") + std::strerror(err) : "")
              << "\n";
  return ok;
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
      "  flexh2o convert -m facebook/opt-1.3b -o opt-1.3b-safetensors\n"
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
  ConvertArgs convert;
  EvalPplArgs ppl;
  EvalChoiceArgs choice;
  PlanArgs plan;
  ProfileArgs profile;
  register_generate(app, gen);
  register_bench(app, bench);
  register_tokenize(app, tok, false);
  register_tokenize(app, detok, true);
  register_info(app, info);
  register_convert(app, convert);
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

  int code = 1;
  try {
    CLI::App* sub = app.get_subcommands().front();
    const std::string name = sub->get_name();
    // Commands that stop at a clean point on SIGINT/SIGTERM; the others keep the default (die).
    if (name == "generate" || name == "tokenize" || name == "detokenize") {
      stop_on_signals();
      env.stop = &g_stop;
    }
    if (name == "generate") code = run_generate(gen, env);
    else if (name == "bench") code = run_bench(bench, env);
    else if (name == "tokenize") code = run_tokenize(tok, false, env);
    else if (name == "detokenize") code = run_tokenize(detok, true, env);
    else if (name == "info") code = run_info(info, env);
    else if (name == "convert") code = run_convert(convert, env);
    else if (name == "eval-ppl") code = run_eval_ppl(ppl, env);
    else if (name == "eval-choice") code = run_eval_choice(choice, env);
    else if (name == "plan") code = run_plan(plan, env);
    else if (name == "profile") code = run_profile(profile, env);
    else {
      std::cerr << "flexh2o: unknown command " << name << "\n";
      return 2;
    }
  } catch (const std::bad_alloc&) {
    // Inputs are validated against what the files hold before allocating; what remains is a
    // run that genuinely needs more memory than this machine gives it.
    std::cerr << "flexh2o: error: out of memory while running `" << app.get_subcommands().front()->get_name()
              << "`: this run needs more host memory than is available (lower --gpu-batch-size or "
                 "--num-gpu-batches, offload more with --percent, or use a smaller model).\n";
    code = 1;
  } catch (const std::exception& e) {
    std::cerr << "flexh2o: error: " << e.what() << "\n";
    code = 1;
  }
  if (!stdout_ok() && code == 0) code = 1;
  if (code == kInterrupted) code = 128 + g_signal.load();
  return code;
}
