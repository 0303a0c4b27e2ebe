// Batch generation driver: left padding, prefill, decode loop, stopping, stats.
#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <utility>

#include <tbb/parallel_for.h>

#include "core/error.h"
#include "engine/batch_run.h"

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
  check_token_ids(r.prompt_ids, c, "prompt");
  if (int64_t(r.prompt_ids.size()) > c.max_positions)
    FH_FAIL("prompt is too long: ", r.prompt_ids.size(), " tokens, longer than the model's max_position_embeddings (",
            c.max_positions, ")");
  if (r.max_new_tokens < 0) FH_FAIL("max_new_tokens must be >= 0, got ", r.max_new_tokens);
  if (r.top_logprobs < -1 || r.top_logprobs > kMaxTopLogprobs)
    FH_FAIL("logprobs must be in [0, ", kMaxTopLogprobs, "] (or absent), got ", r.top_logprobs);
  validate(r.sampling, c.vocab_size);
}

namespace {
using namespace detail;

std::vector<GenerationResult> start(const ModelConfig& c, int64_t batch, const std::vector<GenerationRequest>& requests,
                                    int64_t& total) {
  FH_CHECK(batch > 0, "batch size must be positive, got ", batch);
  for (const auto& r : requests) validate_request(r, c);
  for (const auto& r : requests) total += r.max_new_tokens;
  return std::vector<GenerationResult>(requests.size());
}

// The stats say how far the run got even when a step throws (a full disk mid-run): set on the
// way out, however it goes.
struct PublishStats {
  const GenerateStats& from;
  GenerateStats* to;
  ~PublishStats() {
    if (to) *to = from;
  }
};

}  // namespace

void check_batches(const StepRunner& runner, const std::vector<GenerationRequest>& requests,
                   const GenerateOptions& opts) {
  if (!opts.continuous) return check_static_batches(runner, requests, 0);
  if (requests.empty()) return;
  // One batch sized for every request; where the runner cannot rewind, it runs as a static batch
  // (as wide as its own prompts) and the rest as static batches (generate_continuous()).
  const auto [rows, cap] = continuous_extent(runner.config(), requests, 0, opts.min_rows, opts.min_capacity);
  const size_t first = std::min(requests.size(), size_t(runner.max_batch()));
  const BatchExtent x = check_members(runner, requests, iota_from(0, first), rows, cap);
  if (!runner.rewinds(x.capacity)) check_static_batches(runner, requests, first);
}

std::vector<size_t> length_sorted_order(const std::vector<GenerationRequest>& requests, int64_t batch,
                                        int64_t window_batches) {
  FH_CHECK(batch > 0, "batch size must be positive, got ", batch);
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t(0));
  if (window_batches <= 1) return order;
  const size_t window = size_t(batch) * size_t(window_batches);
  for (size_t first = 0; first < order.size(); first += window) {
    const auto end = order.begin() + std::ptrdiff_t(std::min(order.size(), first + window));
    std::stable_sort(order.begin() + std::ptrdiff_t(first), end, [&](size_t a, size_t b) {
      const GenerationRequest &x = requests[a], &y = requests[b];
      if (x.prompt_ids.size() != y.prompt_ids.size()) return x.prompt_ids.size() < y.prompt_ids.size();
      return x.max_new_tokens < y.max_new_tokens;
    });
  }
  return order;
}

std::vector<GenerationResult> generate(Forward& fwd, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats) {
  FH_CHECK(opts.batch_size > 0, "batch size must be positive, got ", opts.batch_size);
  InMemoryRunner runner(fwd, opts.batch_size);
  return generate(runner, requests, opts, stats);
}

std::vector<GenerationResult> generate(StepRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats) {
  const int64_t batch = runner.max_batch();
  int64_t total = 0, done = 0;
  std::vector<GenerationResult> out = start(runner.config(), batch, requests, total);
  check_batches(runner, requests, opts);
  GenerateStats st;
  PublishStats publish{st, stats};
  StepStopScope stop_steps(runner, opts.stop);  // a stop ends a long step (a prefill) midway
  if (opts.continuous) return generate_continuous(runner, requests, opts, st, total);
  for (size_t first = 0; first < requests.size() && !st.interrupted; first += size_t(batch)) {
    if (stop_requested(opts)) {
      st.interrupted = true;
      break;
    }
    const size_t count = std::min(requests.size() - first, size_t(batch));
    BatchRun<std::vector<GenerationRequest>, std::vector<GenerationResult>> b(
        runner.config(), requests, iota_from(first, count), opts, out, st, done, total);
    ++st.batches;  // started: an interrupted or failed batch ran too (in part)
    run_batch(runner, b, st, opts, first + count >= requests.size());
  }
  return out;
}

std::vector<GenerationResult> generate(StepRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const std::vector<size_t>& order, const GenerateOptions& opts,
                                       GenerateStats* stats) {
  FH_CHECK(order.size() == requests.size(), "an order of ", order.size(), " for ", requests.size(), " requests");
  std::vector<GenerationRequest> run;
  run.reserve(requests.size());
  std::vector<bool> seen(requests.size(), false);
  for (size_t r : order) {
    FH_CHECK(r < requests.size() && !seen[r], "the order is not a permutation of the requests");
    seen[r] = true;
    run.push_back(requests[r]);
  }
  // Requests from opts.more keep their indices (they follow the given ones).
  auto index = [&](size_t j) { return j < order.size() ? order[j] : j; };
  GenerateOptions o = opts;
  if (opts.ends_at) o.ends_at = [&](size_t j, const GenerationResult& res) { return opts.ends_at(index(j), res); };
  if (opts.on_result) o.on_result = [&](size_t j, const GenerationResult& res) { opts.on_result(index(j), res); };
  std::vector<GenerationResult> got = generate(runner, run, o, stats);
  std::vector<GenerationResult> out(got.size());
  for (size_t j = 0; j < got.size(); ++j) out[index(j)] = std::move(got[j]);
  return out;
}

std::vector<GenerationResult> generate(GroupRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats) {
  const int64_t batch = runner.max_batch();
  int64_t total = 0, done = 0;
  std::vector<GenerationResult> out = start(runner.config(), batch, requests, total);
  FH_CHECK(runner.groups() >= 1, "a group runner needs at least one group");
  GenerateStats st;
  PublishStats publish{st, stats};
  using Run = BatchRun<std::vector<GenerationRequest>, std::vector<GenerationResult>>;
  std::vector<std::unique_ptr<Run>> slot(size_t(runner.groups()));
  size_t next = 0;
  int in_flight = 0;
  auto submit = [&](int g) {
    Run& b = *slot[size_t(g)];
    runner.submit(g, b.ids(), b.positions(), b.T(), b.real_rows());
    ++in_flight;
  };
  // Group g takes the next batch of requests; false when none is left.
  auto take = [&](int g) {
    if (next >= requests.size() || stop_requested(opts)) return false;
    const size_t count = std::min(requests.size() - next, size_t(batch));
    slot[size_t(g)] =
        std::make_unique<Run>(runner.config(), requests, iota_from(next, count), opts, out, st, done, total);
    next += count;
    ++st.batches;
    runner.begin_batch(g, slot[size_t(g)]->batch(), slot[size_t(g)]->capacity());
    submit(g);
    return true;
  };
  for (int g = 0; g < runner.groups(); ++g)
    if (!take(g)) break;
  std::vector<float> logits;
  while (in_flight > 0) {
    detail::StepTimer t(st);
    const int g = runner.collect(logits);
    --in_flight;
    Run& b = *slot[size_t(g)];
    const bool prefill = b.prefill();
    (prefill ? st.prefill_seconds : st.decode_seconds) += t.seconds();
    t.start();
    const bool more = b.consume(logits);
    if (stop_requested(opts)) {  // in-flight steps are still collected (their tokens kept)
      st.interrupted = st.interrupted || more || next < requests.size();
    } else if (more) {
      submit(g);
    } else {
      take(g);
    }
    st.decode_seconds += t.seconds();
  }
  if (stop_requested(opts) && next < requests.size()) st.interrupted = true;
  return out;
}

}  // namespace flexh2o
