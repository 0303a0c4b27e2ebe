// Data-parallel `generate` under mpirun: rank 0 owns the files and hands each rank a disjoint
// share of the engine requests (batch b -> rank b % N, so results keep arriving in input order);
// every rank runs its share on its own device with its own placement; results come back to rank
// 0, which writes them as they arrive. Heartbeats after each token step bound every wait by
// --rank-timeout: a rank that dies or hangs ends the job with a message on every rank.
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
// `requested` (--threads) when > 0, else the host's cores shared by its ranks; and on --device
// cuda its GPU, its local rank modulo the host's GPUs (0 otherwise).
int rank_threads(const dist::Comm& comm, int requested);
int rank_cuda_index(const dist::Comm& comm, const std::string& device);

// --rank-timeout SECONDS on `generate`.
void add_data_parallel_flags(CLI::App& generate, double& rank_timeout_s);

// One rank's part of the job. Made by run_generate when main() found mpirun (Env::mpi), on the
// thread that runs the command; MPI lives as long as this object. Not thread-safe.
class DataParallel {
 public:
  // Joins the job (MPI starts here); throws Error when MPI cannot start.
  DataParallel(const Env& env, double rank_timeout_s);
  // On rank 0, when the job did not end normally (an error), tells every worker to stop.
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  bool is_root() const { return comm_->rank() == 0; }
  int size() const { return comm_->size(); }

  // A worker's whole run (ranks > 0): loads the model, takes its share from rank 0, sends back
  // results, progress and its report. Returns 0, or kInterrupted after a signal; throws Error
  // when rank 0 ends the job or goes silent for the timeout.
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
  // on_progress counts every rank's tokens. `stops(r)`: request r's stop strings (ends_at on
  // the workers); `prompt_len` / `gen_len` as given to make_run_setup. `st` gets the job's
  // sums (tokens, batches; prefill/decode seconds summed over ranks); interrupted when a
  // signal, a failed rank or a silent one ended the job early (finished results were delivered).
  void generate(StepRunner& runner, const std::vector<GenerationRequest>& reqs, const GenerateOptions& go,
                const std::function<std::vector<std::string>(size_t)>& stops, int64_t prompt_len, int64_t gen_len,
                GenerateStats* st);
  // Rank 0: the job's totals, wall time and tokens/s at the top of `report` (rank 0's run
  // report) and a "ranks" array of every rank's figures.
  void add_to_report(nlohmann::json& report) const;
  // Rank 0 at the end: `code`, or 1 after a rank failed or went silent; a silent rank cannot
  // finish MPI, so then every rank is ended here (Comm::abort) once the results are written.
  int finish(int code);

 private:
  struct Root;
  std::unique_ptr<dist::Comm> comm_;
  double timeout_s_;
  std::unique_ptr<Root> root_;  // rank 0's bookkeeping
  bool ended_ = false;          // rank 0 said goodbye (or a failure was handled)
};

}  // namespace flexh2o::cli
