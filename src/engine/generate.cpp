// Batch generation driver: left padding, prefill, decode loop, stopping, stats.
#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace flexh2o {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopped: return "stop";
    case FinishReason::kLength: break;
  }
  return "length";
}

void validate_request(const GenerationRequest& r, const ModelConfig& c) {
  if (r.prompt_ids.empty()) FH_FAIL("empty prompt: give at least one token");
  for (int32_t id : r.prompt_ids)
    if (id < 0 || id >= c.vocab_size) FH_FAIL("prompt token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")");
  if (int64_t(r.prompt_ids.size()) > c.max_positions)
    FH_FAIL("prompt is ", r.prompt_ids.size(), " tokens, longer than the model's max_position_embeddings (",
            c.max_positions, ")");
  if (r.max_new_tokens < 0) FH_FAIL("max_new_tokens must be >= 0, got ", r.max_new_tokens);
  validate(r.sampling);
}

namespace {

using Clock = std::chrono::steady_clock;
bool stop_requested(const GenerateOptions& o) { return o.stop && o.stop->load(std::memory_order_relaxed); }
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void run_batch(StepRunner& run, const std::vector<GenerationRequest>& reqs, size_t first, size_t count,
               const GenerateOptions& opts, std::vector<GenerationResult>& out, GenerateStats& st,
               int64_t& done_tokens, int64_t total_tokens, bool last_batch) {
  const ModelConfig& c = run.config();
  const int64_t B = int64_t(count);
  int64_t S = 0, max_new = 0;
  for (size_t b = 0; b < count; ++b) {
    const GenerationRequest& r = reqs[first + b];
    S = std::max<int64_t>(S, int64_t(r.prompt_ids.size()));
    // A sequence cannot grow past the model's positions.
    int64_t room = c.max_positions - int64_t(r.prompt_ids.size());
    max_new = std::max<int64_t>(max_new, std::min(r.max_new_tokens, room));
  }
  run.begin_batch(B, S + std::max<int64_t>(max_new, 1));
  std::vector<int32_t> ids(size_t(B * S), opts.pad_id), pos(size_t(B * S), 0);
  std::vector<int64_t> len(static_cast<size_t>(B));
  std::vector<int32_t> real_rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = reqs[first + size_t(b)].prompt_ids;
    const int64_t pad = S - int64_t(p.size());
    real_rows[size_t(b)] = int32_t(p.size());
    for (int64_t t = 0; t < int64_t(p.size()); ++t) {
      ids[size_t(b * S + pad + t)] = p[size_t(t)];
      pos[size_t(b * S + pad + t)] = int32_t(t);
    }
    len[size_t(b)] = int64_t(p.size());
    st.prompt_tokens += int64_t(p.size());
  }
  st.padded_prompt_tokens += B * S;
  std::vector<Sampler> samplers;
  std::vector<bool> finished(size_t(B), false);
  for (int64_t b = 0; b < B; ++b) {
    samplers.emplace_back(reqs[first + size_t(b)].sampling);
    const GenerationRequest& r = reqs[first + size_t(b)];
    if (r.max_new_tokens == 0 || len[size_t(b)] >= c.max_positions) {
      finished[size_t(b)] = true;
      out[first + size_t(b)].finished = true;
      if (opts.on_result) opts.on_result(first + size_t(b), out[first + size_t(b)]);
    }
  }
  std::vector<float> logits;
  // Steps this batch runs without EOS: the prefill, then one per further token.
  const int64_t steps = std::max<int64_t>(max_new, 1);
  int64_t step_no = 0;
  auto hint = [&] { run.expect_more_steps(++step_no < steps || !last_batch); };
  auto t0 = Clock::now();
  hint();
  run.step(ids.data(), pos.data(), S, real_rows.data(), logits);
  st.prefill_seconds += seconds_since(t0);
  st.peak_kv_bytes = std::max(st.peak_kv_bytes, run.kv_bytes());

  t0 = Clock::now();
  std::vector<int32_t> next(size_t(B), opts.pad_id), next_pos(size_t(B), 0);
  while (true) {
    bool any = false;
    for (int64_t b = 0; b < B; ++b) {
      const size_t bi = size_t(b);
      if (finished[bi]) continue;
      const GenerationRequest& r = reqs[first + bi];
      GenerationResult& res = out[first + bi];
      const int32_t tok = samplers[bi].sample(logits.data() + b * c.vocab_size, c.vocab_size);
      res.tokens.push_back(tok);
      ++st.generated_tokens;
      ++done_tokens;
      const bool eos = !opts.ignore_eos && opts.eos_id && tok == *opts.eos_id;
      const int64_t total_len = len[bi] + int64_t(res.tokens.size());
      const bool length = int64_t(res.tokens.size()) >= r.max_new_tokens || total_len >= c.max_positions;
      const bool stopped = !eos && !length && opts.ends_at && opts.ends_at(first + bi, res.tokens);
      if (eos || length || stopped) {
        finished[bi] = true;
        res.finish = eos ? FinishReason::kEos : stopped ? FinishReason::kStopped : FinishReason::kLength;
        res.finished = true;
        if (opts.on_result) opts.on_result(first + bi, res);
        continue;
      }
      any = true;
      next[bi] = tok;
      next_pos[bi] = int32_t(total_len - 1);
    }
    if (opts.on_progress) opts.on_progress(done_tokens, total_tokens);
    if (!any) break;
    if (stop_requested(opts)) {  // every token sampled so far is kept; unfinished ones are dropped
      st.interrupted = true;
      break;
    }
    // Finished sequences ride along with a harmless token; their output is ignored.
    hint();
    run.step(next.data(), next_pos.data(), 1, nullptr, logits);
    ++st.decode_steps;
  }
  st.decode_seconds += seconds_since(t0);
}

}  // namespace

std::vector<GenerationResult> generate(Forward& fwd, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats) {
  FH_CHECK(opts.batch_size > 0, "batch size must be positive, got ", opts.batch_size);
  InMemoryRunner runner(fwd, opts.batch_size);
  return generate(runner, requests, opts, stats);
}

std::vector<GenerationResult> generate(StepRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats) {
  const int64_t batch = runner.max_batch();
  FH_CHECK(batch > 0, "batch size must be positive, got ", batch);
  const ModelConfig& c = runner.config();
  for (const auto& r : requests) validate_request(r, c);
  std::vector<GenerationResult> out(requests.size());
  GenerateStats st;
  int64_t total = 0, done = 0;
  for (const auto& r : requests) total += r.max_new_tokens;
  for (size_t first = 0; first < requests.size() && !st.interrupted; first += size_t(batch)) {
    if (stop_requested(opts)) {
      st.interrupted = true;
      break;
    }
    size_t count = std::min(requests.size() - first, size_t(batch));
    run_batch(runner, requests, first, count, opts, out, st, done, total, first + count >= requests.size());
    ++st.batches;  // an interrupted batch ran too (its prefill at least)
  }
  if (stats) *stats = st;
  return out;
}

}  // namespace flexh2o
