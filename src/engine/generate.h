// Batch generation: requests are cut into batches, left-padded, prefilled together, then
// decoded step by step until every sequence stops (EOS or its max_new_tokens). Results come
// back in request order. Blocking; progress is reported through a callback, and a stop flag
// ends the run early, within the step under way (no signals here: the caller sets the flag).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/forward.h"
#include "engine/runner.h"
#include "engine/sampler.h"

namespace flexh2o {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;  // BOS already included where the model expects it
  int64_t max_new_tokens = 32;
  SamplingParams sampling;
  // -1: no log-probabilities; 0: each generated token's (GenerationResult::logprobs); N in
  // [1, kMaxTopLogprobs]: also the N most likely tokens at each step (top_logprobs).
  int top_logprobs = -1;
};

// kStopped: GenerateOptions::ends_at ended the sequence (a stop string); named "stop".
enum class FinishReason { kEos, kLength, kStopped };
const char* finish_reason_name(FinishReason r);

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids only
  // With GenerationRequest::top_logprobs >= 0, one per token (token_logprob(): the model's own
  // distribution, before penalties and temperature); with N > 0 also N alternatives per token.
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  FinishReason finish = FinishReason::kLength;
  bool finished = false;        // false only for requests an interrupted run did not complete
};

struct GenerateOptions {
  int64_t batch_size = 8;              // sequences prefilled/decoded together (in-memory Forward)
  std::vector<int32_t> eos_ids;        // the tokens that end a sequence; none = never stop early
  bool ignore_eos = false;             // generate exactly max_new_tokens
  int32_t pad_id = 0;                  // id placed in left padding (never attended)
  // Called after each decode step: (tokens generated so far, total to generate at most).
  std::function<void(int64_t, int64_t)> on_progress;
  // Called after every token a sequence samples that is not EOS (the one that reaches its length
  // too), with the request index and its result so far (the tokens generated, and with
  // top_logprobs >= 0 their log-probabilities); true ends the sequence there
  // (FinishReason::kStopped, ahead of kLength, as vLLM checks stop strings first), so stop
  // strings cost no steps past them. Null: never.
  std::function<bool(size_t, const GenerationResult&)> ends_at;
  // Called once per finished request index with its result (streaming output).
  std::function<void(size_t, const GenerationResult&)> on_result;
  // Polled before each batch and after each token step, and by a StepRunner's step under way
  // (StepRunner::stop_steps_on(): between layers or schedule units); once true, generate()
  // returns without another step: finished requests are complete (on_result was called), the
  // others have finished == false and GenerateStats::interrupted is set. Null: never stops early.
  const std::atomic<bool>* stop = nullptr;
  // Continuous batching (generate(StepRunner&) only): a slot whose sequence ends takes the next
  // request, in a refill step once a quarter of the batch's slots are free, instead of idling
  // until its batch ends. Results are a sequence's own as in static batches; where the runner
  // cannot rewind (StepRunner::rewinds(): a KV policy, a window cap, pipeline stages), the first
  // batch runs to its end and the rest in static batches.
  bool continuous = false;
  // Continuous batching: called while slots are free, for requests that arrived after the call
  // began (a server's queue): at most `max_count`, each with a prompt of at most `max_prompt`
  // tokens and prompt + max_new_tokens within `max_total` (what the running batch was sized
  // for; the caller keeps the others for a later call). They run as if appended to `requests`
  // (the indices ends_at and on_result get continue theirs) and their results follow in the
  // returned vector; the call returns once nothing runs and this brings nothing. Null: none.
  std::function<std::vector<GenerationRequest>(size_t max_count, int64_t max_prompt, int64_t max_total)> more;
  // Continuous batching: the least prompt rows and slots a sequence the batch is sized for (a
  // server's bounds), so that requests from `more` up to them fit.
  int64_t min_rows = 0, min_capacity = 0;
};

struct GenerateStats {
  double prefill_seconds = 0, decode_seconds = 0;
  // Spent in GenerateOptions::on_result and on_progress (writing and syncing an output file,
  // drawing progress): outside both of the above, as FlexGen times only the model's steps.
  double output_seconds = 0;
  int64_t prompt_tokens = 0, padded_prompt_tokens = 0, generated_tokens = 0;
  int64_t batches = 0, decode_steps = 0;
  // Of generated_tokens, those drawn from the logits of steps timed as decode (not a batch's
  // first step nor a refill's, whose logits give each new sequence its first token): what
  // decode_seconds produced, FlexGen's decode throughput's numerator.
  int64_t decode_tokens = 0;
  size_t peak_kv_bytes = 0;
  // Continuous batching: whether it ran (the runner could rewind), refill steps, requests they started.
  bool continuous = false;
  int64_t refills = 0, refilled_sequences = 0;
  bool interrupted = false;  // opts.stop ended the run before every request finished
};

// Checks a request against the model (non-empty prompt, ids in vocab, prompt within
// max_position_embeddings, sampling params); throws flexh2o::Error describing the problem.
void validate_request(const GenerationRequest& r, const ModelConfig& c);

// The most tokens a sequence (prompt and generated) reaches: each token but the last is fed at
// its position, and the positions are [0, max_positions), so the last token drawn is number
// max_positions + 1 (as in transformers, whose OPT fails one token later). Generation ends
// there with finish kLength; plan and bench refuse workloads longer than this.
inline int64_t max_sequence_tokens(const ModelConfig& c) { return c.max_positions + 1; }

// Throws, before any work, when a batch that generate() would form of `requests` (in this
// order, max_batch() at a time; under opts.continuous the one batch sized for them all, and
// where the runner cannot rewind (StepRunner::rewinds()) the static batches after it) would not
// fit the runner's memory budgets (StepRunner::check_batch): a run is refused whole rather than
// at the batch that does not fit, after the results of those before it. generate() calls it
// first; a caller with something to lose when a run starts (an output it replaces) calls it
// before that.
void check_batches(const StepRunner& runner, const std::vector<GenerationRequest>& requests,
                   const GenerateOptions& opts);

// The order to run requests in so that a batch's prompts are alike in length: each batch is
// left-padded to its longest prompt, and the padding is computed like tokens. Within each
// window of `window_batches` * `batch` requests (taken in request order), requests sorted by
// prompt length, then max_new_tokens, stably; window_batches <= 1: request order. A permutation
// of [0, requests.size()): position j runs request order[j]. Results do not depend on it (a
// sequence's result never depends on its batch); only padding and when each result is ready do.
std::vector<size_t> length_sorted_order(const std::vector<GenerationRequest>& requests, int64_t batch,
                                        int64_t window_batches);
// The window the front ends use unless told otherwise (`generate --sort-window`).
constexpr int64_t kDefaultSortWindow = 8;

// Cuts requests into batches of runner.max_batch(); results in request order. *stats is set
// also when a step throws: the steps and tokens before the failure.
std::vector<GenerationResult> generate(StepRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats = nullptr);
// generate() running request order[j] as its j-th (a permutation, e.g. length_sorted_order's);
// results, and the request index opts.ends_at and opts.on_result get, are in request order
// (requests from opts.more after them, in the order they came).
std::vector<GenerationResult> generate(StepRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const std::vector<size_t>& order, const GenerateOptions& opts,
                                       GenerateStats* stats = nullptr);
// A runner that holds several batches ("groups") at once and works on their steps while the
// caller samples: a pipeline runs group g's step on later stages while the driver samples
// another group's logits. Steps complete in the order submitted.
class GroupRunner {
 public:
  virtual ~GroupRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual int64_t max_batch() const = 0;  // sequences of one group's batch
  virtual int groups() const = 0;
  // Starts group g's batch of B sequences with room for `capacity` tokens each (its previous
  // batch must have no step in flight).
  virtual void begin_batch(int g, int64_t B, int64_t capacity) = 0;
  // Queues a token step of group g (inputs as StepRunner::step, copied); returns without waiting.
  virtual void submit(int g, const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows) = 0;
  // Blocks until the oldest queued step is done: its group, and logits [B, vocab] in `logits`.
  virtual int collect(std::vector<float>& logits) = 0;
};

// As generate() above, with up to runner.groups() batches in flight: each group takes the next
// batch of requests when its batch ends. Every batch holds the same requests as generate()'s
// batches (request order, runner.max_batch() at a time), so results are the same. *stats is set
// also when a step throws.
std::vector<GenerationResult> generate(GroupRunner& runner, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats = nullptr);
// In-memory convenience: batches of opts.batch_size on `fwd`.
std::vector<GenerationResult> generate(Forward& fwd, const std::vector<GenerationRequest>& requests,
                                       const GenerateOptions& opts, GenerateStats* stats = nullptr);

}  // namespace flexh2o
