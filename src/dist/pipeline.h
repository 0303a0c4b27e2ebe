// Pipeline parallelism over ranks: stage s runs layers [bounds[s], bounds[s+1]) of the model on
// rank stage_rank(s) = (s + 1) % S with its own OffloadEngine (its own placement, offloading and
// KV policy on its layers). The driver (sampling, files) runs on rank 0, which holds the LAST
// stage, so logits never travel: rank 0 sends token ids (+ positions) to the first stage, each
// stage sends its hidden rows to the next, and the last stage's logits are sampled where they
// are made. Up to G groups (FlexGen's inner iterations) are in flight, so while rank 0 samples
// one group the other stages work on the next ones. Every wait is bounded (Channel timeouts).
// A stop (Ctrl-C, SIGTERM) on any rank ends the job in order: a stage passes it on to the
// driver, whose generation stops at its next token step; every stage then ends knowing the signal.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "dist/channel.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"

namespace flexh2o::dist {

// Rank of stage s of `stages`, and the stage of a rank.
int stage_rank(int stage, int stages);
int rank_stage(int rank, int stages);

struct PipelineOptions {
  double timeout_s = 300;  // longest wait for any message (a stage's step must take less)
  // This rank's stop flag and the signal that set it (0 until then); either may be null. The
  // Channel's own waits must not watch the flag: the job still has to end in order after it.
  const std::atomic<bool>* stop = nullptr;
  const std::atomic<int>* signal = nullptr;
  // The driver calls this once, on its thread, when it first sees a stop (its own or a
  // stage's), with the signal: to say so at once (mpirun may kill the job before it ends).
  std::function<void(int signal)> on_stop;
};

// What one stage did, as measured on its rank.
struct StageStats {
  int stage = 0, rank = 0;
  std::string host;
  int64_t first_layer = 0, end_layer = 0;
  int64_t steps = 0;
  double busy_s = 0;  // inside its engine's steps
  double wall_s = 0;  // from its first message to the end of the job
  uint64_t bytes_in = 0, bytes_out = 0;  // stage-to-stage messages (hidden rows and step inputs)
  uint64_t peak_kv_bytes = 0;  // its layers' KV held at once, every group's batch as of its last step
  std::vector<uint64_t> group_kv;  // [group] its KV after its last step (not sent)
  void note_kv(int group, uint64_t bytes);  // after a step of that group
};

struct PipelineReport {
  std::vector<StageStats> stages;  // by stage
  // Measured bubble: the fraction of the stages' time not inside a step, 1 - sum(busy) / sum(wall).
  double bubble() const;
  uint64_t bytes_between_stages() const;  // sum of bytes_out
  // The job's KV: the stages' peaks added (each stage holds its own layers' cache at once).
  uint64_t peak_kv_bytes() const;
};

// Rank 0: the last stage, and a GroupRunner the generation driver runs. `last` must be the
// engine of the last stage (Model::stage() of the last layers), with set_groups() done; `ch`
// and `last` must outlive the driver. Not thread-safe.
class PipelineDriver final : public GroupRunner {
 public:
  PipelineDriver(Channel& ch, OffloadEngine& last, int stages, int64_t first_layer, const PipelineOptions& o);
  ~PipelineDriver() override;

  const ModelConfig& config() const override { return last_.config(); }
  int64_t max_batch() const override { return last_.max_batch(); }
  int groups() const override { return last_.groups(); }
  void begin_batch(int g, int64_t B, int64_t capacity) override;
  void submit(int g, const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows) override;
  // Throws Error naming the stage when a stage failed (its message), or when a wait timed out
  // (after a stop, one that lasts over twice the longest decode-step wait before it, at
  // least 0.5 s): then
  // broken() is true and no stage can be reached in order.
  int collect(std::vector<float>& logits) override;

  // The flag for GenerateOptions::stop: set (at begin_batch and collect) once this rank's stop
  // flag is, or a stage asked to stop. Lives as long as the driver.
  const std::atomic<bool>& stop() const { return stop_; }
  // The signal that stopped the job: this rank's, else the first stage's that asked; 0 if none.
  int stop_signal() const { return stop_signal_; }

  // Ends every stage (they return from serve_stage) and gathers their figures, waiting at most
  // the timeout. `failed`: the job ends after an error; `signal`: it was stopped by that signal
  // before it finished (0: it was not). Stages are told both. Once; not when broken().
  PipelineReport finish(bool failed, int signal = 0);
  bool broken() const { return broken_; }

 private:
  struct Pending {
    int g = 0;
    int64_t T = 0, B = 0;
    std::vector<int32_t> ids, pos, real_rows;
  };
  Status wait(Message* m, bool decode);
  void refresh_stop();
  void note_stop(int signal);
  Channel& ch_;
  OffloadEngine& last_;
  int stages_;
  PipelineOptions opts_;
  StageStats own_;
  std::deque<Pending> pending_;
  std::vector<int64_t> batch_of_;  // [group] B of its current batch
  std::vector<std::byte> no_hidden_;
  bool broken_ = false, finished_ = false;
  std::atomic<bool> stop_{false};
  int stop_signal_ = 0;
  double longest_wait_s_ = 0;  // for a step, before any stop
  double t0_ = 0;
};

// Rank 0 without a driver (its own stage failed to start): ends every stage in order, waiting
// at most the timeout for the end to come back; returns their figures. Throws Error when it
// does not come back.
PipelineReport end_stages(Channel& ch, int stages, bool failed, const PipelineOptions& o, int signal = 0);

// Ranks 1..S-1: serves stage rank_stage(ch.rank()) on `engine` (Model::stage() of its layers,
// with set_groups() done) until the driver ends the job. A failure of its own step is sent on
// to the driver, and the stage keeps serving until the end (so the job ends in order). So is
// its stop flag, seen within 50 ms even while it waits: the stage asks the driver to stop and
// serves the steps still in flight.
struct ServeResult {
  bool job_failed = false;  // the job ended after an error (this stage's or another's)
  std::string error;        // this stage's own failure, if any
  int stop_signal = 0;      // the job was stopped by this signal before it finished (0: it was not)
};
// Throws Error when a wait times out: the job cannot end in order then.
ServeResult serve_stage(Channel& ch, OffloadEngine& engine, int stages, int64_t first_layer,
                        const PipelineOptions& o);

}  // namespace flexh2o::dist
