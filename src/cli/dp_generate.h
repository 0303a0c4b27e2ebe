// Data-parallel `generate` under mpirun: rank 0 owns the files and hands each rank a disjoint
// share of the engine requests (batch b -> rank b % N, so results keep arriving in input order);
// every rank runs its share on its own device with its own placement; results come back to rank
// 0, which writes them as they arrive. Heartbeats after each token step bound every wait by
// --rank-timeout: a rank that dies or hangs ends the job with a message on every rank. A signal
// on any rank stops every rank at its next token step, and the job ends in order.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/run_setup.h"
#include "dist/comm.h"

namespace flexh2o::cli {

// What a rank of an mpirun job (data or pipeline parallel) takes of its host: CPU threads,
// `requested` (--threads) when > 0, else the host's cores shared by its ranks, or fewer: the
// CPUs the launcher bound it to (mpirun binds a rank to a core up to 2 ranks); and on --device
// cuda its GPU, its local rank modulo the host's GPUs (0 otherwise).
int rank_threads(const dist::Comm& comm, int requested);
// rank_threads() from its facts: `usable` CPUs in this process's affinity mask (0: unknown),
// `cores` on the host, `local_ranks` ranks on the host.
int rank_threads_of(int requested, int usable, int cores, int local_ranks);
int rank_cuda_index(const dist::Comm& comm, const std::string& device);

// --rank-timeout SECONDS on `generate`.
void add_data_parallel_flags(CLI::App& generate, double& rank_timeout_s);

// The tag of rank 0's pipeline layout (pipeline_run.cpp; dist/pipeline.cpp's protocol uses 20).
// A data-parallel worker that receives it, or a stage that receives anything else first, was
// started with other --pipeline-stages than rank 0.
inline constexpr int kPipelineLayoutTag = 21;

// What every rank of an mpirun job must share for its tokens to be the job's (JSON text): the
// model's shape and dtype, the KV policy, the cache dtype and the compression flags. Placements
// may differ (--policy auto plans each rank's machine). Rank 0 sends its own with the job.
std::string job_terms(const ModelConfig& c, const GenerateArgs& a);
// Throws naming `rank` and each term that differs when `mine` is not rank 0's `root` (two boxes
// with another checkpoint at the same path, or other flags on one rank).
void check_job_terms(const std::string& root, const std::string& mine, const std::string& rank);

// A request's stop strings, found in its text with or without special tokens (a Batch body's
// skip_special_tokens), as rank 0 finds them.
struct StopRule {
  std::vector<std::string> strings;
  bool skip_special = false;
};

// One rank's part of the job. Made by run_generate when main() found mpirun (Env::mpi), on the
// thread that runs the command; MPI lives as long as this object. Not thread-safe.
class DataParallel {
 public:
  // Joins the job (MPI starts here); throws Error when MPI cannot start. Keeps env.stop_signal
  // (which must outlive this object) and a copy of `a` (its --rank-timeout, whether --output is
  // set, the flags of job_terms).
  DataParallel(const Env& env, const GenerateArgs& a);
  // On rank 0, when the job did not end normally (an error), tells every worker to stop.
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  bool is_root() const { return comm_->rank() == 0; }
  int size() const { return comm_->size(); }

  // A worker's whole run (ranks > 0): loads the model, takes its share from rank 0, sends back
  // results, progress and its report. A signal on any rank stops it at its next token step; it
  // still sends what finished and its report. Returns 0, or 128 + the job's signal after a stop
  // (kInterrupted when the signal is unknown); throws Error when rank 0 ends the job after an
  // error, and ends the job (Comm::abort) when rank 0 is silent for the timeout.
  int run_worker(const GenerateArgs& a, const Env& env);

  // CPU threads of this rank: `requested` (--threads) when > 0, else this host's cores shared
  // by the ranks on it.
  int threads(int requested) const;
  // The GPU of this rank on --device cuda: its local rank modulo the GPUs of its host.
  int cuda_index(const std::string& device) const;
  // How many requests one rank plans for (--policy auto): its share of `total`.
  int64_t plan_requests(size_t total) const;

  // Rank 0, in place of generate(): runs the batches of rank 0 here and the others on the
  // workers. Every callback of `go` sees request indices into `reqs` and runs on this thread;
  // on_progress counts every rank's tokens. `stops(r)`: request r's stop rule (ends_at on the
  // workers, as rank 0's); `prompt_len` / `gen_len` as given to make_run_setup. `st` gets the job's
  // sums (tokens, batches; prefill/decode seconds summed over ranks); interrupted when a
  // signal, a failed rank or a silent one ended the job early (finished results were delivered).
  // A signal on any rank (env.stop here, a worker's stopped report) stops every rank at its
  // next token step; rank 0 then waits for the workers' last results and reports for
  // max(0.5 s, twice the longest step seen), so the job ends in order.
  void generate(StepRunner& runner, const std::vector<GenerationRequest>& reqs, const GenerateOptions& go,
                const std::function<StopRule(size_t)>& stops, int64_t prompt_len, int64_t gen_len,
                GenerateStats* st);
  // Rank 0: the job's totals, wall time and tokens/s at the top of `report` (rank 0's run
  // report) and a "ranks" array of every rank's figures.
  void add_to_report(nlohmann::json& report) const;
  // Rank 0: the error a worker failed with (the job then stopped), empty if none did.
  const std::string& failure() const;
  // Rank 0 at the end: 1 after a rank failed, 128 + the signal after a stop, else `code`. A
  // silent rank (or one that did not end its step after a stop) cannot finish MPI, so then
  // every rank is ended here (Comm::abort) once the results are written.
  int finish(int code);

 private:
  struct Root;
  int own_signal() const { return stop_signal_ ? stop_signal_->load() : 0; }  // that set Env::stop, 0 if none
  std::unique_ptr<dist::Comm> comm_;
  double timeout_s_;
  const std::atomic<int>* stop_signal_;  // Env::stop_signal: the signal that set Env::stop
  bool has_output_;                      // --output is set (the stop message points to it)
  GenerateArgs args_;                    // rank 0: the flags of job_terms, sent with the setup
  std::unique_ptr<Root> root_;  // rank 0's bookkeeping
  bool ended_ = false;          // rank 0 said goodbye (or a failure was handled)
};

}  // namespace flexh2o::cli
