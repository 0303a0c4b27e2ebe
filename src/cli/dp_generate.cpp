// Data-parallel generate: the messages between rank 0 and the workers (tags below), the
// worker's run, and rank 0's loop that runs its own batches while it takes the workers' results,
// progress and heartbeats, and watches every rank's silence against --rank-timeout.
#include "cli/dp_generate.h"

#include <algorithm>
#include <chrono>
#include <iostream>

#include "cli/openai_batch.h"
#include "core/error.h"
#include "dist/channel.h"

namespace flexh2o::cli {
namespace {
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Rank 0 -> worker.
constexpr int kSetup = 1;  // batch size, workload for the plan, number of batches, job terms, EOS rule
constexpr int kWork = 2;   // one batch of requests
constexpr int kQuit = 3;   // rank 0 ends the job early: the reason
constexpr int kBye = 4;    // every result arrived (or the job stopped): finish
constexpr int kStop = 9;   // the job stops at the next token step (a signal on some rank): the signal
// Both ways: "still alive" (worker -> 0 carries its tokens generated so far).
constexpr int kBeat = 5;
// Worker -> rank 0.
constexpr int kResult = 6;  // one request's tokens
constexpr int kDone = 7;    // its share is done, or it stopped at a step: stopped, signal, run report
constexpr int kFailed = 8;  // it cannot go on: the error

// Rank 0 sends heartbeats to waiting workers at most this often; workers send theirs (with
// their progress) at most this often, and always after a step that took longer.
constexpr double kBeatEvery = 1.0;
constexpr double kWorkerBeatEvery = 0.05;
// A worker waits for rank 0 in slices this long, so a signal ends the wait between them.
constexpr double kWaitSlice = 0.05;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string seconds(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

void put_request(dist::Writer& w, const GenerationRequest& r, const StopRule& stop) {
  w.put_array(std::span<const int32_t>(r.prompt_ids));
  w.put<int64_t>(r.max_new_tokens)
      .put<float>(r.sampling.temperature)
      .put<int32_t>(r.sampling.top_k)
      .put<float>(r.sampling.top_p)
      .put<uint64_t>(r.sampling.seed)
      .put<float>(r.sampling.min_p)
      .put<float>(r.sampling.repetition_penalty)
      .put<float>(r.sampling.presence_penalty)
      .put<float>(r.sampling.frequency_penalty)
      .put<int32_t>(r.top_logprobs)
      .put<uint32_t>(uint32_t(r.sampling.logit_bias.size()));
  for (const auto& [id, bias] : r.sampling.logit_bias) w.put<int32_t>(id).put<float>(bias);
  w.put<uint32_t>(uint32_t(stop.strings.size()));
  for (const std::string& s : stop.strings) w.put_string(s);
  w.put<uint8_t>(stop.skip_special);
}

GenerationRequest get_request(dist::Reader& rd, StopRule* stop) {
  GenerationRequest r;
  r.prompt_ids = rd.get_array<int32_t>();
  r.max_new_tokens = rd.get<int64_t>();
  r.sampling.temperature = rd.get<float>();
  r.sampling.top_k = rd.get<int32_t>();
  r.sampling.top_p = rd.get<float>();
  r.sampling.seed = rd.get<uint64_t>();
  r.sampling.min_p = rd.get<float>();
  r.sampling.repetition_penalty = rd.get<float>();
  r.sampling.presence_penalty = rd.get<float>();
  r.sampling.frequency_penalty = rd.get<float>();
  r.top_logprobs = rd.get<int32_t>();
  const uint32_t biased = rd.get<uint32_t>();
  FH_CHECK(biased <= 1024, "a request message with ", biased, " logit_bias entries");
  for (uint32_t i = 0; i < biased; ++i) {
    const int32_t id = rd.get<int32_t>();
    r.sampling.logit_bias.emplace_back(id, rd.get<float>());
  }
  stop->strings.resize(rd.get<uint32_t>());
  for (std::string& s : stop->strings) s = rd.get_string();
  stop->skip_special = rd.get<uint8_t>() != 0;
  return r;
}

void add(GenerateStats& into, const GenerateStats& s) {
  into.prefill_seconds += s.prefill_seconds;
  into.decode_seconds += s.decode_seconds;
  into.prompt_tokens += s.prompt_tokens;
  into.padded_prompt_tokens += s.padded_prompt_tokens;
  into.generated_tokens += s.generated_tokens;
  into.batches += s.batches;
  into.decode_steps += s.decode_steps;
  into.decode_tokens += s.decode_tokens;
  into.peak_kv_bytes = std::max(into.peak_kv_bytes, s.peak_kv_bytes);
  into.interrupted = into.interrupted || s.interrupted;
}

}  // namespace

void add_data_parallel_flags(CLI::App& g, double& rank_timeout_s) {
  g.add_option("--rank-timeout", rank_timeout_s,
               "Under mpirun (data or pipeline parallel): a rank that sends nothing for this many seconds is taken "
               "as hung and the job ends (finished results are kept; --resume finishes it). Ranks send a heartbeat "
               "after every token step, so this must exceed the longest step (a batch's prefill) and a model's load")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);  // seconds, not an integer
}

struct DataParallel::Root {
  GenerateStats own;                       // rank 0's share
  int64_t own_requests = 0;
  std::vector<json> reports;               // of each worker (kDone), by rank
  std::vector<int64_t> requests;           // given to each rank
  std::vector<int64_t> tokens;             // generated by each worker so far (its beats)
  std::vector<int64_t> delivered;          // tokens of the results each worker sent
  std::vector<Clock::time_point> heard;    // last message from each worker
  std::vector<bool> done;                  // kDone arrived
  double wall_s = 0;
  std::string failure;                     // a rank failed or went silent: why
  bool silent = false;                     // a rank went silent (it cannot finish MPI)
  bool stopping = false;                   // a signal on some rank stops the job at a token step
  int signal = 0;                          // ... that signal (0: unknown)
  double longest_step_s = 0;               // the longest gap between one rank's messages
  // A worker whose report never came (it died or went silent): the tokens it is known to have
  // generated.
  int64_t lost_tokens(int w) const { return std::max(tokens[size_t(w)], delivered[size_t(w)]); }
};

// The Comm does not watch the stop flag: after a signal the ranks still exchange their last
// results and reports, and the job ends in order.
DataParallel::DataParallel(const Env& env, const GenerateArgs& a)
    : comm_(std::make_unique<dist::Comm>()),
      timeout_s_(a.rank_timeout),
      stop_signal_(env.stop_signal),
      has_output_(!a.output.empty()),
      args_(a) {
  if (is_root()) root_ = std::make_unique<Root>();
}

DataParallel::~DataParallel() {
  if (!is_root() || ended_) return;
  // Rank 0 leaves before the job's end: the workers would otherwise wait for it until their
  // timeout. A signal (Ctrl-C while the weights are placed) stops them as a stop does, so every
  // rank exits 128 + the signal; anything else is an error.
  const int signal = own_signal();
  for (int r = 1; r < size(); ++r) {
    if (signal > 0) {
      comm_->send(r, kStop, dist::Writer().put<int32_t>(signal).take());
      comm_->send(r, kBye, {});
    } else {
      comm_->send(r, kQuit, dist::Writer().put_string("it stopped with an error (see its message)").take());
    }
  }
  (void)comm_->flush(5);
}

int DataParallel::threads(int requested) const { return rank_threads(*comm_, requested); }

int DataParallel::cuda_index(const std::string& device) const { return rank_cuda_index(*comm_, device); }

int64_t DataParallel::plan_requests(size_t total) const {
  return std::max<int64_t>(1, (int64_t(total) + size() - 1) / size());
}

int DataParallel::run_worker(const GenerateArgs& a, const Env& env) {
  dist::Comm& c = *comm_;
  const std::string me = c.describe(c.rank());
  std::atomic<bool> stop{false};
  std::string quit;  // why rank 0 ended the job, when it did
  // The job's stop: by a signal here, or passed on by rank 0 (kStop) from any rank.
  bool stopped = false, by_me = false;
  int signal = 0;
  auto stopped_now = [&] {
    if (!stopped && env.stop && env.stop->load()) {
      stopped = by_me = true;
      signal = own_signal();
    }
    return stopped;
  };
  auto stop_from_root = [&](const dist::Message& m) {
    if (stopped) return;
    stopped = true;
    signal = dist::Reader(m.bytes, "a stop message").get<int32_t>();
  };
  // The next message from rank 0 with `tag`; its heartbeats keep the wait going, its kQuit ends
  // it. Empty once the job stops (except for kBye, which ends a stopped run too).
  auto from_root = [&](int tag) {
    auto heard = Clock::now();
    for (;;) {
      if (tag != kBye && stopped_now()) return std::optional<dist::Message>();
      dist::Message m;
      if (!c.recv(0, dist::kAnyTag, kWaitSlice, &m).ok()) {
        if (since(heard) < timeout_s_) continue;
        say("flexh2o: ", me, " heard nothing from ", c.describe(0), " in ", seconds(timeout_s_), " (--rank-timeout ",
            seconds(timeout_s_), "): it hangs or was stopped; ending the job");
        c.abort(1);  // rank 0 hangs: it cannot end the job itself
      }
      heard = Clock::now();
      if (m.tag == kBeat) continue;
      if (tag == kBye && m.tag == kWork) continue;  // a batch the stop left unrun
      if (m.tag == kStop) {
        stop_from_root(m);
        if (tag == kBye) continue;
        return std::optional<dist::Message>();
      }
      if (m.tag == kQuit)
        FH_FAIL(c.describe(0), " ended the job: ", dist::Reader(m.bytes, "a quit message").get_string());
      if (m.tag == kPipelineLayoutTag) {  // rank 0 runs a pipeline and waits for this rank as a stage
        say("flexh2o: error: ", me, " was not given --pipeline-stages and rank 0 was; give every rank the same "
            "flags; ending the job");
        c.abort(1);
      }
      if (m.tag != tag) FH_FAIL(me, ": a message with tag ", m.tag, " from ", c.describe(0), " where ", tag, " was due");
      return std::optional<dist::Message>(std::move(m));
    }
  };
  try {
    LoadedModel lm = load_model(env, a.model, a.tokenizer);
    say("flexh2o: ", me, ": model ", lm.model->config().name, " loaded in ", lm.load_seconds, " s");
    c.send(0, kBeat, dist::Writer().put<int64_t>(0).take());
    json report{{"requests", 0}, {"generated_tokens", 0}};
    GenerateStats total;
    int64_t requests = 0;
    int64_t batch_size = 0, prompt_len = 0, gen_len = 0, plan = 0, batches = 0;
    bool ignore_eos = false;  // rank 0's, with its end-of-sequence id: it decides, as for sampling
    std::optional<int32_t> eos_id;
    if (std::optional<dist::Message> setup = from_root(kSetup)) {
      dist::Reader sr(setup->bytes, "the setup from " + c.describe(0));
      batch_size = sr.get<int64_t>();
      prompt_len = sr.get<int64_t>();
      gen_len = sr.get<int64_t>();
      plan = sr.get<int64_t>();
      batches = sr.get<int64_t>();
      check_job_terms(sr.get_string(), job_terms(lm.model->config(), a), me);
      ignore_eos = sr.get<uint8_t>() != 0;
      if (const int32_t e = sr.get<int32_t>(); e >= 0) eos_id = e;
    }
    if (batches > 0) {
      const std::string device = select_device(a.device, *lm.model, std::cerr);
      CpuDevice dev(threads(a.threads));
      Forward fwd(*lm.model, dev);
      RunSetup rs = make_run_setup(a.offload, a.kv, batch_size, *lm.model, fwd, dev, env, prompt_len, gen_len, plan,
                                   device, std::cerr, cuda_index(device));
      const ModelConfig& cfg = lm.model->config();
      GenerateOptions go;
      go.batch_size = rs.runner->max_batch();
      go.ignore_eos = ignore_eos;
      go.eos_id = eos_id;
      go.pad_id = cfg.pad_id.value_or(0);
      go.stop = &stop;
      uint64_t first = 0;
      std::vector<StopRule> stops;
      const openai_batch::Decode decode = openai_batch::decoder_of(lm.tokenizer_or_null());
      go.ends_at = [&](size_t r, const GenerationResult& res) {
        return openai_batch::text_holds_stop(decode, res.tokens, stops[r].strings, stops[r].skip_special);
      };
      go.on_result = [&](size_t r, const GenerationResult& res) {
        dist::Writer w;
        w.put<uint64_t>(first + r)
            .put<uint8_t>(uint8_t(res.finish))
            .put_array(std::span<const int32_t>(res.tokens))
            .put_array(std::span<const float>(res.logprobs))
            .put<uint32_t>(uint32_t(res.top_logprobs.size()));
        for (const auto& step : res.top_logprobs) {
          w.put<uint32_t>(uint32_t(step.size()));
          for (const TokenLogprob& t : step) w.put<int32_t>(t.id).put<float>(t.logprob);
        }
        c.send(0, kResult, w.take());
      };
      int64_t before = 0;  // tokens of the earlier batches
      auto last_beat = Clock::now();
      go.on_progress = [&](int64_t done, int64_t) {
        if (since(last_beat) >= kWorkerBeatEvery) {
          last_beat = Clock::now();
          c.send(0, kBeat, dist::Writer().put<int64_t>(before + done).take());
        }
        dist::Message m;
        while (c.poll(0, kBeat, &m)) {
        }
        if (c.poll(0, kQuit, &m)) {
          quit = dist::Reader(m.bytes, "a quit message").get_string();
          stop = true;
        }
        if (c.poll(0, kStop, &m)) stop_from_root(m);
        if (stopped_now()) stop = true;
      };
      for (int64_t b = 0; b < batches && !stop; ++b) {
        std::optional<dist::Message> work = from_root(kWork);
        if (!work) break;
        dist::Reader wr(work->bytes, "a batch from " + c.describe(0));
        first = wr.get<uint64_t>();
        std::vector<GenerationRequest> reqs(wr.get<uint32_t>());
        stops.assign(reqs.size(), {});
        for (size_t i = 0; i < reqs.size(); ++i) reqs[i] = get_request(wr, &stops[i]);
        GenerateStats bs;
        flexh2o::generate(*rs.runner, reqs, go, &bs);
        add(total, bs);
        before = total.generated_tokens;
        requests += int64_t(reqs.size());
      }
      if (!quit.empty()) FH_FAIL(c.describe(0), " ended the job: ", quit);
      report = run_report(lm, rs, total, dev, device);
      report["requests"] = requests;
    }
    stopped_now();
    report["rank"] = c.rank();
    report["host"] = c.host();
    report["interrupted"] = stopped;
    c.send(0, kDone, dist::Writer().put<uint8_t>(stopped).put<int32_t>(signal).put_string(report.dump()).take());
    say("flexh2o: ", me, ": ", total.generated_tokens, " tokens for ", requests, " requests");
    if (stopped) {
      if (by_me) say("flexh2o: ", me, " stopped by signal ", signal, " at a token step");
      else say("flexh2o: ", me, ": the job was stopped by signal ", signal, " at a token step");
    }
    (void)from_root(kBye);
    (void)c.flush(timeout_s_);
    return stopped ? (signal > 0 ? 128 + signal : kInterrupted) : 0;
  } catch (const Error& e) {
    c.send(0, kFailed, dist::Writer().put_string(e.what()).take());
    (void)c.flush(5);
    throw;
  }
}

void DataParallel::generate(StepRunner& runner, const std::vector<GenerationRequest>& reqs, const GenerateOptions& go,
                            const std::function<StopRule(size_t)>& stops, int64_t prompt_len,
                            int64_t gen_len, GenerateStats* st) {
  dist::Comm& c = *comm_;
  Root& R = *root_;
  const int n = size();
  const auto start = Clock::now();
  const size_t batch = size_t(std::max<int64_t>(1, runner.max_batch()));
  const size_t batches = (reqs.size() + batch - 1) / batch;
  R.requests.assign(size_t(n), 0);
  R.tokens.assign(size_t(n), 0);
  R.delivered.assign(size_t(n), 0);
  R.reports.assign(size_t(n), json());
  R.done.assign(size_t(n), false);
  R.heard.assign(size_t(n), start);
  for (int w = 1; w < n; ++w) {
    int64_t mine = 0;
    for (size_t b = size_t(w); b < batches; b += size_t(n)) ++mine;
    c.send(w, kSetup,
           dist::Writer()
               .put<int64_t>(int64_t(batch))
               .put<int64_t>(prompt_len)
               .put<int64_t>(gen_len)
               .put<int64_t>(plan_requests(reqs.size()))
               .put<int64_t>(mine)
               .put_string(job_terms(runner.config(), args_))
               .put<uint8_t>(go.ignore_eos)
               .put<int32_t>(go.eos_id.value_or(-1))
               .take());
  }
  for (size_t b = 0; b < batches; ++b) {
    const size_t w = b % size_t(n), first = b * batch, count = std::min(batch, reqs.size() - first);
    R.requests[w] += int64_t(count);
    if (w == 0) continue;
    dist::Writer wr;
    wr.put<uint64_t>(first).put<uint32_t>(uint32_t(count));
    for (size_t r = first; r < first + count; ++r) put_request(wr, reqs[r], stops(r));
    c.send(int(w), kWork, wr.take());
  }
  int64_t total = 0;
  for (const auto& r : reqs) total += r.max_new_tokens;

  std::atomic<bool> stop{false};
  int64_t own_before = 0, own_now = 0;
  auto report_progress = [&] {
    int64_t sum = own_now;
    for (int w = 1; w < n; ++w) sum += R.tokens[size_t(w)];
    if (go.on_progress) go.on_progress(sum, total);
  };
  auto fail = [&](const std::string& why, bool silent) {
    if (!R.failure.empty()) return;
    R.failure = why;
    R.silent = silent;
    stop = true;
    say("flexh2o: ", why);
  };
  // Once: this rank's own steps end, and every worker stops at its next step.
  auto begin_stop = [&](int signal) {
    if (R.stopping || !R.failure.empty()) return;
    R.stopping = true;
    R.signal = signal;
    stop = true;
    for (int w = 1; w < n; ++w)
      if (!R.done[size_t(w)]) c.send(w, kStop, dist::Writer().put<int32_t>(signal).take());
    // Said at once: under mpirun a signal is often followed by SIGKILL a second later.
    say("flexh2o: signal ", signal, ": the job stops at the next token step on every rank",
        (has_output_ ? "; finished results are in --output (rerun with --resume to finish)" : ""));
  };
  auto handle = [&](dist::Message& m) {
    const size_t w = size_t(m.source);
    R.longest_step_s = std::max(R.longest_step_s, since(R.heard[w]));
    R.heard[w] = Clock::now();
    const std::string from = "a message from " + c.describe(m.source);
    dist::Reader rd(m.bytes, from);
    if (m.tag == kBeat) {
      R.tokens[w] = rd.get<int64_t>();
      report_progress();
    } else if (m.tag == kResult) {
      const auto r = rd.get<uint64_t>();
      GenerationResult res;
      res.finish = FinishReason(rd.get<uint8_t>());
      res.tokens = rd.get_array<int32_t>();
      res.logprobs = rd.get_array<float>();
      res.top_logprobs.resize(rd.get<uint32_t>());
      for (auto& step : res.top_logprobs) {
        step.resize(rd.get<uint32_t>());
        for (TokenLogprob& t : step) t.id = rd.get<int32_t>(), t.logprob = rd.get<float>();
      }
      res.finished = true;
      if (r >= reqs.size()) FH_FAIL(from, ": a result for request ", r, " of ", reqs.size());
      R.delivered[w] += int64_t(res.tokens.size());
      if (go.on_result) go.on_result(size_t(r), res);
    } else if (m.tag == kDone) {
      const bool stopped = rd.get<uint8_t>() != 0;
      const int signal = rd.get<int32_t>();
      R.reports[w] = json::parse(rd.get_string());
      R.done[w] = true;
      if (stopped) begin_stop(signal);
    } else if (m.tag == kFailed) {
      fail(c.describe(m.source) + " failed: " + rd.get_string(), false);
    } else {
      FH_FAIL(from, " has tag ", m.tag, ", which rank 0 does not take");
    }
  };
  auto last_beat = start;
  auto service = [&] {
    for (dist::Message m; c.poll(dist::kAnySource, dist::kAnyTag, &m);) handle(m);
    if (go.stop && go.stop->load()) begin_stop(own_signal());
    for (int w = 1; w < n; ++w)
      if (!R.done[size_t(w)] && since(R.heard[size_t(w)]) > timeout_s_)
        fail(c.describe(w) + " sent nothing for " + seconds(since(R.heard[size_t(w)])) + " (--rank-timeout " +
                 seconds(timeout_s_) + "): it hangs or was stopped; ending the job",
             true);
    if (since(last_beat) >= kBeatEvery) {
      last_beat = Clock::now();
      for (int w = 1; w < n; ++w) c.send(w, kBeat, {});
    }
  };

  GenerateOptions mine = go;
  mine.stop = &stop;
  auto own_step = Clock::now();
  mine.on_progress = [&](int64_t done, int64_t) {
    R.longest_step_s = std::max(R.longest_step_s, since(own_step));
    own_step = Clock::now();
    own_now = own_before + done;
    service();
    report_progress();
  };
  // The job's stats: rank 0's and every worker's report, or what a lost worker is known to have
  // generated (its last progress beat or the results it sent, whichever is more).
  auto job_stats = [&] {
    GenerateStats job = R.own;
    for (int w = 1; w < n; ++w) {
      const json& j = R.reports[size_t(w)];
      if (j.is_null()) {
        job.generated_tokens += R.lost_tokens(w);
        continue;
      }
      job.generated_tokens += j.value("generated_tokens", int64_t(0));
      job.decode_tokens += j.value("decode_tokens", int64_t(0));
      job.prompt_tokens += j.value("prompt_tokens", int64_t(0));
      job.padded_prompt_tokens += j.value("padded_prompt_tokens", int64_t(0));
      job.batches += j.value("batches", int64_t(0));
      job.prefill_seconds += j.value("prefill_seconds", 0.0);
      job.decode_seconds += j.value("decode_seconds", 0.0);
      job.peak_kv_bytes = std::max(job.peak_kv_bytes, j.value("peak_kv_bytes", size_t(0)));
    }
    job.interrupted = stop.load();
    return job;
  };
  size_t first = 0;
  if (go.on_result) mine.on_result = [&](size_t r, const GenerationResult& res) { go.on_result(first + r, res); };
  if (go.ends_at) mine.ends_at = [&](size_t r, const GenerationResult& res) { return go.ends_at(first + r, res); };
  GenerateStats bs;  // rank 0's batch running (generate() fills it when a step throws too)
  try {
    for (size_t b = 0; b < batches && !stop; b += size_t(n)) {
      first = b * batch;
      const size_t count = std::min(batch, reqs.size() - first);
      const std::vector<GenerationRequest> part(reqs.begin() + ptrdiff_t(first),
                                                reqs.begin() + ptrdiff_t(first + count));
      bs = GenerateStats{};
      flexh2o::generate(runner, part, mine, &bs);
      add(R.own, bs);
      bs = GenerateStats{};
      own_before = own_now = R.own.generated_tokens;
      service();
    }
    R.own_requests = R.requests[0];
    // Every worker's report, or after a stop those that come within the grace.
    std::optional<Clock::time_point> stopped_at;
    for (;;) {
      service();
      if (!R.failure.empty()) break;
      if (std::all_of(R.done.begin() + 1, R.done.end(), [](bool d) { return d; })) break;
      if (R.stopping) {
        if (!stopped_at) stopped_at = Clock::now();
        const double grace = dist::stop_grace_s(R.longest_step_s, timeout_s_);
        if (since(*stopped_at) > grace) {
          for (int w = 1; w < n; ++w)
            if (!R.done[size_t(w)])
              say("flexh2o: ", c.describe(w), " did not end its step within ", seconds(grace), " of the stop (signal ",
                  R.signal, "): it is gone or hangs");
          R.silent = true;
          break;
        }
      }
      dist::Message m;
      if (c.recv(dist::kAnySource, dist::kAnyTag, 0.02, &m).ok()) handle(m);
    }
  } catch (...) {  // a failure here (the output's disk filled): the report says how far the job got
    add(R.own, bs);
    R.own_requests = R.requests[0];
    R.wall_s = since(start);
    *st = job_stats();
    throw;
  }
  R.wall_s = since(start);
  const GenerateStats job = job_stats();
  *st = job;
  if (!R.failure.empty()) {
    for (int w = 1; w < n; ++w) c.send(w, kQuit, dist::Writer().put_string(R.failure).take());
  } else {
    if (R.stopping)
      say("flexh2o: ", c.describe(0), ": the job was stopped by signal ", R.signal, " at a token step");
    for (int w = 1; w < n; ++w) c.send(w, kBye, {});
  }
  (void)c.flush(R.silent ? 1 : 5);
  ended_ = true;
  say("flexh2o: data parallel over ", n, " ranks: ", job.generated_tokens, " tokens in ", R.wall_s, " s (",
      (R.wall_s > 0 ? double(job.generated_tokens) / R.wall_s : 0.0), " tok/s)");
}

void DataParallel::add_to_report(json& report) const {
  const Root& R = *root_;
  json ranks = json::array();
  json own = report;
  own.erase("ranks");
  own["rank"] = 0;
  own["host"] = comm_->host();
  own["requests"] = R.own_requests;
  own["generated_tokens"] = R.own.generated_tokens;
  own["prompt_tokens"] = R.own.prompt_tokens;
  own["padded_prompt_tokens"] = R.own.padded_prompt_tokens;
  own["batches"] = R.own.batches;
  own["prefill_seconds"] = R.own.prefill_seconds;
  own["decode_seconds"] = R.own.decode_seconds;
  const double own_s = R.own.prefill_seconds + R.own.decode_seconds;
  own["total_seconds"] = own_s;
  own["prefill_tokens_per_s"] = R.own.prefill_seconds > 0 ? R.own.prompt_tokens / R.own.prefill_seconds : 0.0;
  own["decode_tokens"] = R.own.decode_tokens;
  own["decode_tokens_per_s"] = R.own.decode_seconds > 0 ? R.own.decode_tokens / R.own.decode_seconds : 0.0;
  own["tokens_per_s"] = own_s > 0 ? R.own.generated_tokens / own_s : 0.0;
  for (const char* k : {"failed_requests", "finished_requests", "resumed_requests", "interrupted", "kept_tokens"})
    own.erase(k);
  ranks.push_back(std::move(own));
  for (int w = 1; w < comm_->size(); ++w) {
    json j = R.reports[size_t(w)].is_null()
                 ? json{{"rank", w}, {"finished", false}, {"generated_tokens", R.lost_tokens(w)}}
                 : R.reports[size_t(w)];
    ranks.push_back(std::move(j));
  }
  for (json& j : ranks) {
    j.erase("model");
    j.erase("model_source");
  }
  // The top level is the job: every rank's tokens over the wall time; per-rank figures (device,
  // threads, rates, memory, offloading) are in "ranks".
  for (const char* k : {"device_name", "threads", "prefill_tokens_per_s", "decode_tokens_per_s", "peak_kv_bytes",
                        "peak_rss_bytes", "offload", "cpu_isa"})
    report.erase(k);
  report["data_parallel_ranks"] = comm_->size();
  report["wall_seconds"] = R.wall_s;
  report["total_seconds"] = R.wall_s;
  report["tokens_per_s"] = R.wall_s > 0 ? double(report["generated_tokens"].get<int64_t>()) / R.wall_s : 0.0;
  report["ranks"] = std::move(ranks);
}

const std::string& DataParallel::failure() const { return root_->failure; }

int DataParallel::finish(int code) {
  const Root& R = *root_;
  if (R.silent) {
    say("flexh2o: ending every rank of the job (a silent rank cannot finish MPI)");
    comm_->abort(1);
  }
  if (!R.failure.empty()) return 1;
  if (R.stopping && R.signal > 0) return 128 + R.signal;
  return code;
}

}  // namespace flexh2o::cli
