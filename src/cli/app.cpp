// run_main(): the flexh2o command line (flag registration, dispatch to the subcommands, the
// mapping of failures to exit codes) shared by the binary and the Python front end.
#include "cli/app.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/signals.h"
#include "cli/run_setup.h"
#include "core/error.h"
#include "core/input_guard.h"
#include "kernels/cpu/isa.h"

namespace flexh2o::cli {
namespace {

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

// Where generate's chat hook looks for the chat template: --tokenizer, else the model
// directory (a directory or a hub id in the cache); a preset has none.
std::filesystem::path template_dir(const GenerateArgs& a, const Env& env) {
  if (!a.tokenizer.empty()) return a.tokenizer;
  if (!std::filesystem::is_directory(a.model) && preset_path(env, a.model)) return {};
  return resolve_model_dir(a.model, env.hub);
}

// Levenshtein distance, for a mistyped command's suggestion.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string out_of_memory_message(const std::string& command) {
  // Inputs are validated against what the files hold before allocating; what remains is a
  // run that genuinely needs more memory than this machine gives it.
  return "out of memory while running `" + command +
         "`: this run needs more host memory than is available (lower the batch: -b, --gpu-batch-size or "
         "--num-gpu-batches; offload more with --percent, or use a smaller model).";
}

const char* version() { return FLEXH2O_VERSION; }

std::string version_text() {
  return std::string("flexh2o ") + FLEXH2O_VERSION + " (" + FLEXH2O_BUILD_TYPE + " build)\n" +
         "CPU kernels: " + cpu::cpu_isa_name() + " on this machine\n" +
         (FLEXH2O_CUDA_VERSION[0] ? std::string("CUDA backend: built with CUDA ") + FLEXH2O_CUDA_VERSION +
                                        " (a GPU is looked for when a command runs)"
                                  : std::string("CUDA backend: not built (FLEXH2O_ENABLE_CUDA=OFF or no nvcc)"));
}

int run_main(int argc, const char* const* argv, const MainOptions& opts) {
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
  app.set_version_flag("--version", version_text());
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

  // A first word that names no command: CLI11 would only say "A subcommand is required".
  const CLI::App& commands = app;
  const std::vector<const CLI::App*> all = commands.get_subcommands([](const CLI::App*) { return true; });
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(all.begin(), all.end(), [&](const CLI::App* s) { return s->check_name(argv[1]); })) {
    std::string names, nearest;
    size_t best = 3;  // suggest a command at most 2 edits away
    for (const CLI::App* s : all) {
      names += (names.empty() ? "" : ", ") + s->get_name();
      if (const size_t d = edit_distance(argv[1], s->get_name()); d < best) best = d, nearest = s->get_name();
    }
    std::cerr << "flexh2o: unknown command \"" << argv[1] << "\""
              << (nearest.empty() ? "" : " (did you mean " + nearest + "?)") << "; the commands are " << names
              << " (flexh2o --help)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  env.hub = opts.hub;
  if (std::error_code ec; !configs.empty() && !std::filesystem::is_directory(configs, ec)) {
    std::cerr << "flexh2o: error: --configs " << configs << " is not a directory (it holds the models/*.json presets "
              << "and hardware/*.json profiles)\n";
    return 2;
  }
  env.configs_dir = configs.empty() ? opts.default_configs_dir : std::filesystem::path(configs);
  env.stderr_is_tty = opts.stderr_is_tty;
  env.owns_process = opts.handle_signals;
  env.mpi = opts.mpi;
  env.mpi_ranks = opts.mpi_ranks;
  if (opts.render_chat)
    gen.render_chat = [&](const nlohmann::ordered_json& body) { return opts.render_chat(template_dir(gen, env), body); };

  int code = 1;
  const StopSignals* signals = nullptr;
  try {
    CLI::App* sub = app.get_subcommands().front();
    const std::string name = sub->get_name();
    // Every rank of an mpirun job runs the command line: only generate shares the work out. (A
    // job of one rank, or a shell whose launcher variables say nothing of its size, runs it.)
    if (env.mpi_ranks > 1 && name != "generate")
      FH_FAIL(name, " runs as one process: under mpirun each rank would run all of it (only generate shares its "
                    "requests or layers among the ranks); run flexh2o ", name, " without mpirun");
    // Commands that stop at a clean point on SIGINT/SIGTERM/SIGHUP; the others keep the default (die).
    if (opts.handle_signals &&
        (name == "generate" || name == "bench" || name == "tokenize" || name == "detokenize" || name == "eval-ppl" ||
         name == "eval-choice")) {
      signals = &StopSignals::install();
      env.stop = &signals->stop();
      env.stop_signal = &signals->signal_flag();
      // A reader that closes generate's pipe (`| head`) makes a write fail with EPIPE, which it
      // turns into a clean stop (results on standard output) or quieter texts (results in
      // --output); the default action would end the run at once, without its report. Other
      // commands keep it, as `| head` users expect.
      if (name == "generate") ::signal(SIGPIPE, SIG_IGN);
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
  } catch (const PlacementStopped& e) {
    std::cerr << "flexh2o: " << e.what() << "\n";
    code = kInterrupted;
  } catch (const UsageError& e) {
    std::cerr << "flexh2o: error: " << printable_utf8(e.what()) << "\n";
    code = 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "flexh2o: error: " << out_of_memory_message(app.get_subcommands().front()->get_name()) << "\n";
    code = 1;
  } catch (const std::exception& e) {
    std::cerr << "flexh2o: error: " << printable_utf8(e.what()) << "\n";
    code = 1;
  }
  if (!stdout_ok() && code == 0) code = 1;
  if (code == kInterrupted) code = 128 + (signals ? signals->signal() : 0);
  return code;
}

}  // namespace flexh2o::cli
