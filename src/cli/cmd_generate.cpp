// `flexh2o generate`: one --prompt or a JSONL file of prompts (flexh2o's lines, or an OpenAI Batch
// file: openai_batch.h) -> JSONL results (in the same format) + run report.
// Results are appended to --output as they finish and fsync'd after each batch, so a run that
// is interrupted (SIGINT/SIGTERM/SIGHUP: it stops within a token step and keeps what finished) or killed
// is finished by `--resume`, which skips every request whose id already has a complete line.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <type_traits>

#include "cli/commands.h"
#include "cli/dp_generate.h"
#include "cli/generate_items.h"
#include "cli/pipeline_run.h"
#include "cli/openai_batch.h"
#include "cli/progress.h"
#include "cli/sampling_flags.h"
#include "cli/output_file.h"
#include "cli/prior_results.h"
#include "core/error.h"
#include "core/input_guard.h"
#include "engine/generate.h"
#include "cli/run_setup.h"
#include "engine/offload_engine.h"

namespace flexh2o::cli {
using nlohmann::json;
namespace batch = openai_batch;

int run_generate(const GenerateArgs& args, const Env& env) {
  GenerateArgs a = args;  // the model's generation_config.json may set sampling defaults
  const bool to_stdout = names_standard_output(a.output, "--output");  // "-o -", "-o /dev/stdout"
  if (to_stdout) a.output.clear();  // the result lines on standard output, as without -o
  // Before the ranks part: under mpirun every rank (data-parallel worker, pipeline stage) places
  // its engine from these flags, so -b must be the block on each of them.
  check_flags([&] { apply_batch_size_flag(a.batch_size_given, a.batch_size, a.offload); });
  std::optional<DataParallel> dp;  // under mpirun: rank 0 goes on below, the others serve it
  std::optional<PipelineJob> pipe;  // ... or with --pipeline-stages, the others run their stages
  if (a.pipeline.stages > 1) {
    if (!env.mpi)
      FH_FAIL("--pipeline-stages ", a.pipeline.stages, " splits the model over the ranks of an mpirun job: mpirun -np ",
              a.pipeline.stages, " flexh2o generate ... --pipeline-stages ", a.pipeline.stages);
    pipe.emplace(env, a);
    if (!pipe->is_root()) return pipe->serve(a, env);
  } else if (env.mpi) {
    dp.emplace(env, a);
    if (!dp->is_root()) return dp->run_worker(a, env);
  }
  if (!a.prompt && a.input.empty())
    throw UsageError("give --prompt TEXT or --input FILE.jsonl (- for standard input)");
  const bool from_stdin = a.input == "-";
  if (!a.input.empty() && !from_stdin) check_regular_file(a.input, "--input").throw_if_error();  // before a blocking open
  if (a.resume && a.output.empty()) throw UsageError("--resume needs --output FILE: the results of the run to finish");
  if (a.overwrite && args.output.empty())
    throw UsageError("--overwrite replaces the results an --output FILE holds, and no --output is given");
  {  // before anything is opened for writing
    std::vector<NamedPath> inputs;
    inputs.push_back({"--input", a.input});  // "-": the file standard input is redirected from
    if (a.offload.policy_file != "auto") inputs.push_back({"--policy", a.offload.policy_file});
    for (auto& f : files_in("--model", a.model)) inputs.push_back(std::move(f));
    for (auto& f : files_in("--tokenizer", a.tokenizer)) inputs.push_back(std::move(f));
    check_outputs_are_not_inputs({{"--output", a.output}, {"--report", a.report}, {"--trace", a.offload.trace}},
                                 inputs);
  }
  // The input is read twice (its format, then its requests): standard input is kept for that.
  // Both readers cap lines (kMaxLineBytes); what a pipe holds is as large as a file would be.
  std::istringstream piped;
  std::ifstream file;
  auto open_input = [&]() -> std::istream& {
    if (from_stdin) {
      piped.clear();
      piped.seekg(0);
      return piped;
    }
    file.close();
    file.clear();
    file.open(a.input);
    if (!file) FH_FAIL("cannot read --input ", a.input);
    return file;
  };
  const auto stdin_start = std::chrono::steady_clock::now();
  if (from_stdin) piped.str(read_standard_input());
  const std::chrono::steady_clock::duration stdin_read = std::chrono::steady_clock::now() - stdin_start;
  const Format format = a.input.empty() ? Format::kFlexh2o : input_format(open_input(), a.input);
  const bool is_batch = format == Format::kBatch;
  PriorResults prior;
  std::optional<OutputFile> out_file;
  std::optional<OutputLock> out_lock;  // held to the end: no second run writes --output meanwhile
  if (!a.output.empty()) out_lock.emplace(NamedPath{"--output", a.output});
  const OutputFile::Mode out_mode =
      a.output.empty() ? OutputFile::Mode::kAppend : check_results(a, format, prior, env.stop);
  check_can_write({"--report", a.report});
  check_can_write({"--trace", a.offload.trace});  // an output path: exit 1, not a flag's mistake
  check_device_early(a.device);  // --device cuda without a GPU: not the command line's fault
  check_flags([&] {
    check_hardware_flag(a.offload, a.pipeline.stages > 1);
    check_engine_flags(a.offload, a.kv);
    batch::check_stop_strings(a.stop, "--stop");
    check_sampling_defaults(a);  // the flags, before the model loads
  });
  std::ostringstream defaults_note;  // said after the model's line
  GenerationConfig gen_config;      // and its end-of-sequence ids
  if (const std::optional<std::filesystem::path> dir = model_dir(env, a.model)) {  // and its generation_config.json
    gen_config = apply_generation_config(a, *dir, defaults_note);
    check_sampling_defaults(a);
  }
  LoadedModel lm = load_model(env, a.model, a.tokenizer, 0, a.progress);
  if (!a.stop.empty() && !lm.tokenizer)
    FH_FAIL("--stop needs the text: this model has no tokenizer (pass --tokenizer DIR)");
  const std::string device = select_device(a.device, *lm.model, std::cerr);
  const ModelConfig& cfg = lm.model->config();
  const std::vector<int32_t> eos_ids =
      end_of_sequence_ids(cfg, lm.tokenizer ? lm.tokenizer->eos_id() : std::nullopt, gen_config, defaults_note);
  const json identity =
      run_identity(a, *lm.model, run_kv_dtype(a.kv, a.offload.compress_cache, *lm.model), format, eos_ids);
  if (a.resume) check_resume_identity(a.output, identity);  // before the requests are read
  std::cerr << "flexh2o: model " << cfg.name << " (" << lm.source << "), " << lm.model->parameter_count() / 1e6
            << "M params, loaded in " << lm.load_seconds << " s\n" << lm.warning << defaults_note.str();

  // Every request is read and tokenized before the first batch: a million lines take seconds.
  const auto input_start = std::chrono::steady_clock::now();
  std::vector<GenerateItem> items;
  if (a.prompt) {
    if (!lm.tokenizer) FH_FAIL("--prompt needs the text read: this model has no tokenizer (pass --tokenizer DIR)");
    items.push_back(make_item(nlohmann::ordered_json{{"prompt", *a.prompt}}, 0, 0, a, lm));
    // --prompt alone prints just the text: its request's error is the run's, on stderr.
    if (a.output.empty() && !to_stdout && !items.back().error.empty()) FH_FAIL("--prompt: ", items.back().error);
  } else {
    std::istream& in = open_input();
    const int64_t input_bytes =
        from_stdin ? int64_t(piped.view().size()) : int64_t(std::filesystem::file_size(a.input));
    Progress reading = startup_progress("read input", a.progress, env.stderr_is_tty);
    auto read_so_far = [&] {  // where the line reader is (it reads ahead in blocks); done after the loop
      if (!reading.enabled()) return;  // tellg() is a system call a line
      const std::streamoff at = in.tellg();
      reading.update(std::min<int64_t>(at < 0 ? input_bytes : at, input_bytes - 1), input_bytes);
    };
    auto stopped = [&](int64_t line) {  // a million lines take seconds to read and tokenize
      if (env.stop && env.stop->load(std::memory_order_relaxed))
        throw PlacementStopped(detail::concat("stopped while reading the input (line ", line, "); --output is as it "
                                              "was"));
    };
    for_each_jsonl(
        in,
        [&](int64_t line, const nlohmann::ordered_json& j) {
          stopped(line);
          items.push_back(is_batch ? make_batch_item(j, line, items.size(), a, lm)
                                   : make_item(j, line, items.size(), a, lm));
          read_so_far();
        },
        [&](int64_t line, const std::string& msg) {
          stopped(line);
          GenerateItem it;
          it.line = line;
          it.id = is_batch ? json() : json(items.size());  // a Batch line's custom_id is unknown
          it.error = msg;
          it.unread = true;
          items.push_back(std::move(it));
          read_so_far();
        });
    reading.update(input_bytes, input_bytes);
  }
  const double input_seconds =  // standard input, read before the model loads, too
      std::chrono::duration<double>(std::chrono::steady_clock::now() - input_start + stdin_read).count();
  const std::string where = a.input.empty() ? "prompt" : from_stdin ? "standard input" : a.input;
  if (is_batch && !a.stop.empty())
    std::cerr << "flexh2o: --stop is for flexh2o lines and --prompt; a Batch file's requests take their body's "
                 "\"stop\"\n";
  if (items.empty()) std::cerr << "flexh2o: " << where << " holds no requests (blank lines are skipped)\n";
  const char* id_name = is_batch ? "custom_id" : "id";
  // Ids must identify requests, as --resume finds results by id: an input whose ids repeat is
  // refused before any work, rather than once a long run needs resuming (OpenAI's Batch API
  // refuses such a file too). With --resume, the requests whose id has a result are done.
  auto key_of = [&](const GenerateItem& it) { return is_batch ? batch::custom_id_key(it.id) : resume_key(it.id); };
  std::vector<bool> done(items.size(), false);
  std::map<std::string, size_t> item_of_id;
  int64_t unkeyed_left = prior.unkeyed;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::optional<std::string> key = key_of(items[i]);
    if (!key) {
      // A Batch line without a usable custom_id is that line's error (parse_input_line): done
      // once its error line is in --output. A flexh2o id that is neither string nor number
      // could not be found again by --resume: refused before any work, as repeated ids are.
      if (!is_batch)
        FH_FAIL(where, ":", items[i].line, ": \"id\" must be a string or a number, as --resume finds results by it; got ",
                items[i].id.type_name());
      if (unkeyed_left > 0) --unkeyed_left, done[i] = true;
      continue;
    }
    auto [at, fresh] = item_of_id.emplace(*key, i);
    if (!fresh) {
      const GenerateItem& first = items[at->second];
      // A flexh2o line that could not be read has its index as its id, whatever id it holds.
      const GenerateItem* unread = first.unread ? &first : items[i].unread ? &items[i] : nullptr;
      FH_FAIL(where, ":", items[i].line, " repeats ", id_name, " ", *key, " of line ", first.line, "; ", id_name,
              "s must be unique, as --resume finds results by them",
              is_batch ? "" : " (a line without \"id\" has its 0-based index as its id)",
              unread && !is_batch ? detail::concat(". Line ", unread->line, " could not be read (", unread->error,
                                      "), so its id is its index; fix or remove that line")
                     : std::string());
    }
    done[i] = prior.line_of.count(*key) > 0;
  }
  if (unkeyed_left > 0)
    FH_FAIL("--resume: --output ", a.output, " holds ", prior.unkeyed, " error lines of requests without a usable "
            "custom_id, more than ", where, " has; is it the output of another input?");
  for (const auto& [key, line] : prior.line_of)
    if (!item_of_id.count(key))
      FH_FAIL("--resume: --output ", a.output, ":", line, " has ", id_name, " ", key, ", which is not in ", where,
              "; is it the output of another input?");
  int64_t bad = prior.failed;
  size_t skipped = 0, to_run = 0;
  std::vector<GenerationRequest> reqs;
  std::vector<size_t> req_item;
  for (size_t i = 0; i < items.size(); ++i) {
    if (done[i]) {
      ++skipped;
      continue;
    }
    if (!items[i].error.empty()) {
      ++bad;
      std::cerr << "flexh2o: " << (a.input.empty() ? "prompt" : where + ":" + std::to_string(items[i].line))
                << ": " << printable_utf8(items[i].error) << "\n";
      continue;
    }
    ++to_run;
    items[i].first_req = reqs.size();
    for (GenerationRequest& r : items[i].reqs) {  // the item keeps the count and the other fields, not the prompt
      req_item.push_back(i);
      reqs.push_back(std::move(r));
    }
  }
  if (a.resume)
    std::cerr << "flexh2o: --resume: " << skipped << " of " << items.size() << " requests already in " << a.output
              << "\n";

  const bool human = !a.output.empty() && !a.quiet;
  const bool single = a.prompt && a.output.empty() && !to_stdout;  // --prompt alone: just the text
  std::vector<std::optional<GenerationResult>> ready(reqs.size());
  const batch::Decode decode = batch::decoder_of(lm.tokenizer_or_null());
  batch::IdMaker ids{std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32)};
  // A Batch line's result: its choices (cut at stop strings) and usage.
  auto batch_line = [&](const GenerateItem& it) {
    if (!it.error.empty()) return batch::error_line(it.id, {it.error, it.error_param, it.error_code}, ids);
    std::vector<const GenerationResult*> results;
    for (size_t k = 0; k < it.reqs.size(); ++k) results.push_back(&*ready[it.first_req + k]);
    json line = batch::result_line(*it.batch, results, decode, batch::token_text_of(lm.tokenizer_or_null()),
                                   cfg.name, int64_t(std::time(nullptr)), ids);
    if (human) std::cout << "[" << it.id.dump() << "] " << batch::first_choice_text(line) << "\n";
    return line;
  };
  // One result line for item i; the --prompt-only mode prints just the text.
  std::vector<int64_t> emitted;  // each line emitted, in order: its results' generated tokens, -1 an error's
  auto emit = [&](size_t i) {
    const GenerateItem& it = items[i];
    int64_t tokens = it.error.empty() ? 0 : -1;
    if (it.error.empty())
      for (size_t k = 0; k < it.reqs.size(); ++k) tokens += int64_t(ready[it.first_req + k]->tokens.size());
    emitted.push_back(tokens);
    json o{{"id", it.id}};
    if (is_batch) {
      o = batch_line(it);
    } else if (!it.error.empty()) {
      o["error"] = it.error;
      if (it.line) o["line"] = it.line;
    } else {
      const GenerationResult& r = *ready[it.first_req];
      // EOS ends the text without adding its own (`<|im_end|>`, `</s>`), as in Batch results.
      std::string text = batch::finish_choice(r.tokens, r.finish == FinishReason::kEos, decode, it.stop, false).text;
      if (human) std::cout << "[" << it.id.dump() << "] " << text << "\n";
      if (single) {
        std::cout << text << "\n";
        return;
      }
      o["text"] = std::move(text);
      o["token_ids"] = r.tokens;
      o["finish_reason"] = finish_reason_name(r.finish);
      add_logprobs(it.reqs[0], r, o);
    }
    if (out_file) out_file->write(jsonl_line(o));
    else std::cout << jsonl_line(o);
  };
  // The results the output holds (a failed write's torn line and later lines not among them; all
  // emitted where it is standard output): their count and generated tokens.
  auto kept = [&] {
    const size_t n = out_file ? std::min(out_file->lines_written(), emitted.size()) : emitted.size();
    std::pair<size_t, int64_t> k{0, 0};
    for (size_t i = 0; i < n; ++i)
      if (emitted[i] >= 0) ++k.first, k.second += emitted[i];
    return k;
  };
  // Results are written in input order as soon as all earlier ones are done.
  size_t next = 0;
  bool stdout_failed = false;  // texts beside an --output stop at a closed standard output
  auto flush = [&] {
    for (; next < items.size() && (done[next] || !items[next].error.empty() || items[next].ready()); ++next)
      if (!done[next]) emit(next);
    if (out_file) out_file->flush();
    if (!stdout_failed) stdout_failed = standard_output_failed(out_file.has_value(), env.owns_process);
  };

  CpuDevice dev(dp ? dp->threads(a.threads) : pipe ? pipe->threads(a.threads) : a.threads);
  Forward fwd(*lm.model, dev);
  // The run report: the engine's (run_report) and the requests' counts.
  auto report_with = [&](const RunSetup& rs, const GenerateStats& st, bool interrupted) {
    json report = run_report(lm, rs, st, dev, device);
    report["requests"] = items.size();
    report["failed_requests"] = bad;
    report["finished_requests"] = kept().first;  // in the output: what --resume skips
    report["kept_tokens"] = kept().second;
    report["resumed_requests"] = skipped;  // already in --output (--resume)
    report["interrupted"] = interrupted;
    report["sort_window"] = a.sort_window;
    report["input_seconds"] = input_seconds;  // reading and tokenizing the requests
    return report;
  };
  if (reqs.empty() && !pipe && !dp) {
    // Nothing to run (--resume found every request done, every line failed, an empty input): the
    // weights are not placed, which offloaded is minutes of I/O for nothing. (Under mpirun the
    // other ranks wait for rank 0's batches and end through the run below.)
    if (!items.empty()) std::cerr << "flexh2o: no request to run; the weights are not placed\n";
    if (!a.output.empty()) {
      out_file.emplace(NamedPath{"--output", a.output}, out_mode);
      out_lock->keep();
      record_run_identity(a.output, identity);
    }
    flush();  // the lines that failed
    if (out_file) out_file->commit();
    if (!a.report.empty())
      write_json_file(a.report, report_with(unplaced_run_setup(a.offload, a.kv, *lm.model), GenerateStats{}, false),
                      "--report");
    if (bad) std::cerr << "flexh2o: " << bad << " input line(s) failed; see the \"error\" fields\n";
    return bad ? 1 : 0;
  }
  int64_t prompt = 1, gen = 1;
  for (const auto& r : reqs) {
    prompt = std::max<int64_t>(prompt, int64_t(r.prompt_ids.size()));
    gen = std::max<int64_t>(gen, r.max_new_tokens);
  }
  std::optional<PipelineDriverSetup> stages;  // rank 0 of a pipeline: its stage and the driver
  RunSetup own;
  auto report_nothing_ran = [&](const std::exception& e) {  // --report of a run stopped or failed before it began
    const bool stopped = dynamic_cast<const PlacementStopped*>(&e) != nullptr;
    try {
      if (!a.report.empty()) {
        json report = report_with(unplaced_run_setup(a.offload, a.kv, *lm.model), GenerateStats{}, stopped);
        report[stopped ? "interrupted_while" : "error"] = printable_utf8(e.what());
        write_json_file(a.report, report, "--report");
      }
    } catch (const std::exception&) {  // the stop or the failure is the cause, not the report
    }
  };
  // The engine runs request order[j] as its j-th (length-sorted batches); the callbacks below
  // get j and map it back, so everything else stays in request order. A batch that does not fit
  // the budgets is found before the weights are placed (minutes of I/O offloaded) and before
  // --output is opened (which empties it under --overwrite), not when the run reaches it.
  // Data-parallel ranks run these requests' static batches under the same flags (each rank
  // checks its own again); pipeline stages form others.
  std::vector<size_t> order;
  std::vector<GenerationRequest> run_reqs;
  bool arranged = false;
  GenerateOptions shape;
  shape.continuous = a.continuous && !dp;
  auto arrange = [&](const StepRunner& runner) {  // once the block is known
    order = length_sorted_order(reqs, runner.max_batch(), a.sort_window);
    run_reqs.reserve(reqs.size());
    for (size_t r : order) run_reqs.push_back(std::move(reqs[r]));
    reqs.clear();
    arranged = true;
    if (!pipe) check_batches(runner, run_reqs, shape);
  };
  if (pipe) {
    stages.emplace(pipe->start(a, env, *lm.model, dev,
                               choose_layout(a, env, *lm.model, dev, device, pipe->comm().size(), prompt, gen,
                                             int64_t(reqs.size()), std::cerr),
                               device, std::cerr));
  } else {
    a.offload.progress = a.progress;  // this rank draws the lines (under mpirun, rank 0)
    try {
      own = make_run_setup(a.offload, a.kv, a.batch_size, *lm.model, fwd, dev, env, prompt, gen,
                           dp ? dp->plan_requests(reqs.size()) : int64_t(reqs.size()), device, std::cerr,
                           dp ? dp->cuda_index(device) : 0, nullptr, arrange);
    } catch (const std::exception& e) {
      // Stopped, or failed (a disk that fills while the store is written, a batch the budgets
      // refuse): a harness that always reads --report learns that nothing ran, and why.
      report_nothing_ran(e);
      throw;
    }
  }
  // A stop that came while the model loaded (a preset's dummy weights take seconds) or the run was
  // set up in memory (no placement to stop): nothing ran, so --output stays as it was, under
  // --overwrite too.
  if (!stages && !dp && env.stop && env.stop->load()) {
    const PlacementStopped e("stopped before the run began; --output is as it was");
    report_nothing_ran(e);
    throw e;
  }
  RunSetup& rs = stages ? stages->rs : own;
  StepRunner* runner = rs.runner.get();
  if (!arranged) arrange(*runner);  // in memory, or a pipeline: not through before_placing
  else check_batches(*runner, run_reqs, shape);  // again: the free space for disk-homed KV, weights written
  // Batch lines with echo and logprobs: their prompts are scored before generation, and before
  // --output is opened, so that a failure there leaves it as it was too.
  std::vector<batch::Request*> echoed;
  for (size_t i = 0; i < items.size(); ++i)
    if (!done[i] && items[i].batch && items[i].batch->scores_prompts()) echoed.push_back(&*items[i].batch);
  batch::score_echoed_prompts(*runner, echoed);
  if (!a.output.empty()) {
    out_file.emplace(NamedPath{"--output", a.output}, out_mode);
    out_lock->keep();
    record_run_identity(a.output, identity);
  }
  flush();  // the lines that failed before the run
  GenerateOptions go;
  go.batch_size = runner->max_batch();
  go.ignore_eos = a.ignore_eos;
  go.continuous = a.continuous;
  go.eos_ids = eos_ids;
  go.pad_id = cfg.pad_id.value_or(0);
  // A pipeline stops when any of its ranks is asked to (the driver hears of the stages').
  go.stop = stages ? &stages->driver->stop() : env.stop;
  // A request with stop strings ends once its text holds one (finish_choice then cuts the same
  // text), instead of generating the rest of max_tokens.
  go.ends_at = [&](size_t j, const GenerationResult& res) {
    const GenerateItem& it = items[req_item[order[j]]];
    return batch::text_holds_stop(decode, res.tokens, it.stop_strings(), it.stop_skips_special());
  };
  Progress progress("generate", "tokens", parse_progress_mode(a.progress), env.stderr_is_tty, rs.offload);
  go.on_progress = [&](int64_t done_tokens, int64_t total) { progress.update(done_tokens, total); };
  // A batch's results arrive together: make them durable then.
  size_t results = 0, finished = 0;  // engine requests; lines whose requests all finished
  size_t capped = 0;  // requests the model's positions ended before their max_new_tokens
  const size_t batch = size_t(runner->max_batch());
  go.on_result = [&](size_t j, const GenerationResult& res) {
    const size_t r = order[j];
    capped += res.finish == FinishReason::kLength && int64_t(res.tokens.size()) < run_reqs[j].max_new_tokens;
    ready[r] = res;
    finished += ++items[req_item[r]].results == items[req_item[r]].reqs.size();
    flush();
    if (++results % batch == 0 || results == run_reqs.size())
      if (out_file) out_file->sync();
  };
  GenerateStats st;
  std::optional<dist::PipelineReport> pipe_report;
  // Whether --resume can finish this run from --output: a file (not standard output, /dev/null).
  auto resumable = [&] {
    std::error_code ec;
    return !a.output.empty() && std::filesystem::is_regular_file(a.output, ec);
  };
  // Every finished result, even those after an unfinished one, so that --resume skips them all.
  auto keep_finished = [&] {
    flush();
    for (size_t i = next; i < items.size(); ++i)
      if (!done[i] && (!items[i].error.empty() || items[i].ready())) emit(i);
    if (out_file) out_file->commit();
  };
  auto report_of = [&] { return report_with(rs, st, st.interrupted); };
  // A failure mid-run (a full disk, an I/O error, a rank or stage that failed): what finished is
  // kept and said, and the report records how far the run got and why it stopped; then the error
  // ends the command (exit 1). An output that failed itself is left as it is (a line retried
  // there would be written twice); a second failure while keeping them is dropped: the first is
  // the cause.
  auto after_failure = [&](const std::exception& ex) {
    progress.finish();
    bool all_kept = false;
    try {
      if (!out_file || !out_file->failed()) {
        keep_finished();
        all_kept = true;
      }
    } catch (const std::exception&) {
    }
    try {
      if (!a.report.empty()) {
        json report = report_of();
        if (dp) dp->add_to_report(report);
        report["error"] = printable_utf8(ex.what());
        write_json_file(a.report, report, "--report");
      }
    } catch (const std::exception&) {
    }
    if (out_file && out_file->failed() && resumable())
      std::cerr << "flexh2o: " << a.output << " holds " << kept().first << " of the " << to_run
                << " requests' results (a torn last line, which --resume drops, aside); the same command with "
                << (a.overwrite ? "--resume in place of --overwrite" : "--resume")
                << " finishes the run once the cause below is fixed\n";
    else if (all_kept && finished > 0)
      std::cerr << "flexh2o: " << finished << " of " << to_run << " requests finished before the error below"
                << (!resumable() ? std::string()
                                     : "; their results are in " + a.output + ", and the same command with " +
                                           (a.overwrite ? "--resume in place of --overwrite" : "--resume") +
                                           " finishes the run once the cause is fixed")
                << "\n";
  };
  bool failure_said = false;
  try {
    if (stages) {
      try {
        generate(*stages->driver, run_reqs, go, &st);
        pipe_report = stages->driver->finish(false, st.interrupted ? stages->driver->stop_signal() : 0);
      } catch (const std::exception& e) {
        after_failure(e);  // first (it keeps every finished result): a broken pipeline ends every rank in fail()
        failure_said = true;
        pipe->fail(*stages->driver, e, out_file.has_value());
        throw;
      }
    } else if (dp) {
      dp->generate(*runner, run_reqs, go, [&](size_t j) { return items[req_item[order[j]]].stop_rule(); }, prompt,
                   gen, &st);
    } else {
      generate(*runner, run_reqs, go, &st);
    }
  } catch (const std::exception& ex) {
    if (!failure_said) after_failure(ex);
    throw;
  }
  progress.finish();
  if (st.interrupted) keep_finished();
  else {
    flush();
    if (out_file) out_file->commit();
  }

  json report = report_of();
  if (dp) dp->add_to_report(report);
  if (dp && !dp->failure().empty()) report["error"] = printable_utf8(dp->failure());  // a worker's
  if (pipe_report) {  // the driver's stats hold no stage's KV
    report["pipeline"] = pipeline_report_json(stages->layout, *pipe_report);
    report["peak_kv_bytes"] = pipe_report->peak_kv_bytes();
  }
  if (!a.report.empty()) write_json_file(a.report, report, "--report");
  if (rs.offload) write_trace_file(a.offload, *rs.offload, std::cerr);
  // Under mpirun the time is the job's wall time; the ranks' prefill and decode seconds add up.
  // An interrupted run's tokens include the unfinished requests' (the line after says which are kept).
  std::cerr << "flexh2o: " << st.generated_tokens
            << (st.interrupted ? " tokens (" + std::to_string(finished) + " prompts finished) in "
                               : " tokens for " + std::to_string(finished) + " prompts in ")
            << report["total_seconds"].get<double>() << " s (" << report["tokens_per_s"].get<double>()
            << " tok/s; prefill " << st.prefill_seconds << " s, decode " << st.decode_seconds << " s"
            << (dp ? ", summed over the ranks" : "") << ")\n";
  if (st.interrupted && kept().second != st.generated_tokens)  // unfinished requests' tokens: work, not results
    std::cerr << "flexh2o: " << kept().second << " of those tokens are in the " << kept().first
              << " results written; the unfinished requests' are dropped\n";
  if (a.continuous && (stages || dp))
    std::cerr << "flexh2o: --continuous: "
              << (stages ? "pipeline stages run static batches\n"
                         : "data-parallel ranks take one batch at a time, so their batches are static\n");
  else if (a.continuous && !st.continuous && run_reqs.size() > batch)
    std::cerr << "flexh2o: --continuous: this run runs static batches (continuous batching needs a full cache, "
                 "without --kv-policy or a sliding-window cap)\n";
  if (capped)  // transformers warns here; OpenAI's server refuses the request
    std::cerr << "flexh2o: " << capped << " request(s) reached the model's " << lm.model->config().max_positions
              << " positions before their max_new_tokens (finish_reason \"length\")\n";
  if (bad) std::cerr << "flexh2o: " << bad << " input line(s) failed; see the \"error\" fields\n";
  if (st.interrupted) {
    const bool failed = dp && !dp->failure().empty();  // a rank's failure stopped the job: said below
    const std::string resume = failed ? "; once that is fixed, --resume finishes " : "; rerun with --resume to finish ";
    std::cerr << "flexh2o: " << (failed ? "the job failed on a rank (below): " : "interrupted: ") << finished << " of "
              << to_run << " requests finished this run" << (resumable() ? resume + a.output : std::string()) << "\n";
    if (stages && stages->driver->stop_signal() > 0) return 128 + stages->driver->stop_signal();
    return dp ? dp->finish(kInterrupted) : kInterrupted;
  }
  return bad ? 1 : 0;
}

}  // namespace flexh2o::cli
