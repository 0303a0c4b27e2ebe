// `generate --pipeline-stages S` under mpirun: rank 0 reads the requests, chooses the layout
// (each stage's layers, the groups in flight) and sends it to every rank; ranks 1..S-1 serve
// their stage (PipelineJob::serve); rank 0 runs the last stage and the generation driver
// (PipelineJob::start). Every rank loads the model directory itself and places its own layers
// with its own policy (the offloading flags, or --policy auto for its layers on its machine).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "cli/commands.h"
#include "cli/run_setup.h"
#include "dist/comm.h"
#include "dist/comm_channel.h"
#include "dist/pipeline.h"

namespace flexh2o::cli {

void add_pipeline_flags(CLI::App* g, PipelineArgs& a);

// What rank 0 tells every stage before the job starts.
struct PipelineLayout {
  int stages = 1, groups = 1;
  std::vector<int64_t> bounds;                        // [stages + 1] layer boundaries
  int64_t prompt_len = 1, gen_len = 1, requests = 1;  // the workload
  // Per stage, with --policy auto: the policy the pipeline plan chose for it (policy JSON; all
  // share one batch shape). Empty: every stage takes the offloading flags.
  std::vector<std::string> policies;
  std::string split;  // how the bounds were chosen, for logs and the report
  double predicted_tokens_per_s = 0, predicted_bubble = 0;  // the plan's (0: not planned)
};

// The layout rank 0 runs. --policy auto: the planner's pipeline plan (cost-balanced layers, each
// stage's policy, the groups that hide the transfers) on the --hardware profile (or this machine
// measured). A fixed policy with --hardware: layers balanced by the cost model for it. Else the
// layers split by count. Groups: --pipeline-groups, else the plan's, else one per stage. Throws
// Error when the job's shape does not fit (ranks != stages, more stages than layers, no plan).
PipelineLayout choose_layout(const GenerateArgs& a, const Env& env, const Model& m, CpuDevice& cpu,
                             const std::string& device, int ranks, int64_t prompt_len, int64_t gen_len,
                             int64_t requests, std::ostream& log);

// Rank 0's stage (the last layers) on its own engine, and the runner generate() drives.
struct PipelineDriverSetup {
  PipelineLayout layout;
  std::unique_ptr<Model> stage;
  std::unique_ptr<Forward> fwd;
  RunSetup rs;
  std::unique_ptr<dist::CommChannel> channel;
  std::unique_ptr<dist::PipelineDriver> driver;
};

// One rank's part of a pipeline job; MPI lives as long as it. Made on the thread that runs the
// command. Not thread-safe.
class PipelineJob {
 public:
  // Joins the job (MPI starts here). Throws Error when MPI cannot start or when the job's rank
  // count is not a.pipeline.stages.
  PipelineJob(const Env& env, const GenerateArgs& a);
  // Rank 0 that never sent the layout (it failed first): tells every stage so, so none waits.
  ~PipelineJob();
  PipelineJob(const PipelineJob&) = delete;
  PipelineJob& operator=(const PipelineJob&) = delete;

  bool is_root() const { return comm_->rank() == 0; }
  dist::Comm& comm() { return *comm_; }
  // CPU threads: --threads when given, else this host's cores shared by its ranks.
  int threads(int requested) const;

  // Ranks 1..S-1: receives the layout, loads its stage, serves it until rank 0 ends the job.
  // Returns the exit code: 0, 1 after an error (its own, printed here, or another rank's),
  // 128 + the signal when a signal on any rank stopped the job before it finished.
  // Ends the whole job (Comm::abort) when a wait fails (a rank that died or hangs).
  int serve(const GenerateArgs& a, const Env& env);

  // Rank 0: sends `layout` to every rank, then builds its own stage of `model` (which, like
  // `cpu`, must outlive the result).
  PipelineDriverSetup start(const GenerateArgs& a, const Env& env, const Model& model, CpuDevice& cpu,
                            const PipelineLayout& layout, const std::string& device, std::ostream& log);
  // Rank 0 after the driver failed with `e`: when the pipeline is broken (a rank died or hangs),
  // prints the error and ends every rank (Comm::abort); otherwise returns (the caller rethrows).
  void fail(const dist::PipelineDriver& d, const std::exception& e, bool has_output);

 private:
  std::unique_ptr<dist::Comm> comm_;
  double timeout_s_;
  int stages_;
  bool layout_sent_ = false;
  bool misfit_ = false;  // a stage rank of a job with the wrong rank count: rank 0 says why
};

// The report's "pipeline" section: layout, and per stage its rank, host, layers, steps, busy and
// wall seconds, bytes; the measured bubble fraction.
nlohmann::json pipeline_report_json(const PipelineLayout& l, const dist::PipelineReport& r);

}  // namespace flexh2o::cli
