// generate --pipeline-stages: the layout message rank 0 sends, a stage rank's whole job, and
// rank 0's own stage with the driver. The protocol itself is dist/pipeline.h's.
#include "cli/pipeline_run.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "cli/dp_generate.h"
#include "cli/kv_flags.h"
#include "cli/offload_flags.h"
#include "core/error.h"
#include "gpu/cuda_device.h"
#include "planner/pipeline.h"

namespace flexh2o::cli {

namespace {

// A stage's own offloading: its own subdirectory of --offload-dir (ranks on one host may share
// the directory; every stage's store holds other layers).
OffloadArgs stage_offload(const OffloadArgs& off, int stage, int stages) {
  OffloadArgs o = off;
  if (o.offload_dir.empty()) return o;
  const std::filesystem::path dir =
      std::filesystem::path(o.offload_dir) / ("stage-" + std::to_string(stage) + "-of-" + std::to_string(stages));
  std::filesystem::create_directories(dir);
  o.offload_dir = dir.string();
  return o;
}

dist::PipelineOptions pipeline_options(double timeout_s, const Env& env) {
  dist::PipelineOptions o;
  o.timeout_s = timeout_s;
  o.stop = env.stop;
  o.signal = env.stop_signal;
  return o;
}

// The stage's engine, with the job's groups.
RunSetup stage_setup(const GenerateArgs& a, const Env& env, const Model& stage, Forward& fwd, CpuDevice& cpu,
                     const PipelineLayout& l, int s, const std::string& device, int gpu, std::ostream& log) {
  StageRun run;
  if (!l.policies.empty())
    run.policy = policy_from_json(nlohmann::json::parse(l.policies[size_t(s)]), "the pipeline plan of stage " +
                                                                                    std::to_string(s));
  RunSetup rs = make_run_setup(stage_offload(a.offload, s, l.stages), a.kv, a.batch_size, stage, fwd, cpu, env,
                               l.prompt_len, l.gen_len, l.requests, device, log, gpu, &run);
  rs.offload->set_groups(l.groups);
  return rs;
}

}  // namespace

void add_pipeline_flags(CLI::App* g, PipelineArgs& a) {
  const char* grp = "Pipeline parallelism (under mpirun)";
  g->add_option("--pipeline-stages", a.stages,
                "Split the model's layers over this many ranks (mpirun -np the same): rank 0 runs the last layers, "
                "samples and writes the files; every rank places its own layers with its own policy")
      ->capture_default_str()->check(at_least(1))->group(grp);
  g->add_option("--pipeline-groups", a.groups,
                "Batches in flight through the pipeline (FlexGen's inner iterations), each holding its own KV cache "
                "on every stage (default: one per stage, which keeps every stage busy)")
      ->check(at_least(0))->group(grp);
}

PipelineLayout choose_layout(const GenerateArgs& a, const Env& env, const Model& m, CpuDevice& cpu,
                             const std::string& device, int ranks, int64_t prompt_len, int64_t gen_len,
                             int64_t requests, std::ostream& log) {
  const PipelineArgs& pa = a.pipeline;
  if (pa.stages != ranks)
    FH_FAIL("--pipeline-stages ", pa.stages, " needs as many ranks (mpirun -np ", pa.stages, "), this job has ", ranks);
  PipelineLayout l;
  l.stages = pa.stages;
  l.prompt_len = std::max<int64_t>(prompt_len, 1);
  l.gen_len = std::max<int64_t>(gen_len, 1);
  l.requests = std::max<int64_t>(requests, 1);
  l.groups = pa.groups > 0 ? pa.groups : pa.stages;
  const bool plan = a.offload.policy_file == "auto";
  if (!plan && a.offload.hardware.empty()) {
    l.bounds = even_bounds(m.config().n_layers, pa.stages);
    l.split = "by count (give --hardware PROFILE or --policy auto to balance by the cost model)";
    return l;
  }
  const DeviceKind kind = device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  if (kind == DeviceKind::kCuda && a.offload.hardware.empty())
    FH_FAIL("--pipeline-stages with --policy auto on a GPU: give --hardware PROFILE (configs/hardware)");
  const HardwareProfile hw = auto_profile(a.offload, env.configs_dir, cpu, kind, device, log);
  Workload w;
  w.prompt_len = l.prompt_len;
  w.gen_len = l.gen_len;
  const KvPolicyConfig kv = make_kv_config(a.kv);
  if (kv.kind != KvPolicyKind::kFull) w.kv = kv;
  w.kv_dtype = run_kv_dtype(a.kv, a.offload.compress_cache, m);
  const ModelShape shape = ModelShape::from_model(m, kind == DeviceKind::kCuda ? std::optional<DType>(gpu::compute_dtype(m))
                                                                                 : std::nullopt);
  if (!plan) {
    l.bounds = balance_stages(shape, {hw}, w, pa.stages, engine_options(a.offload, a.batch_size).policy);
    l.split = "balanced by the cost model on " + hw.name;
    return l;
  }
  PipelineOptions o;
  o.stages = pa.stages;
  o.groups = pa.groups;
  // At least as many batches as groups in flight: a group without a batch keeps no stage busy.
  o.search = auto_search(a.offload, (l.requests + l.groups - 1) / l.groups);
  const PipelinePlan pp = plan_pipeline(shape, {hw}, w, o);
  l.bounds = pp.bounds;
  l.groups = int(pp.groups);
  for (const StagePlan& s : pp.stages) {
    Policy p = s.estimate.policy;
    p.pin_weight = flag_bool_or(a.offload.pin_weight, true, "--pin-weight");
    l.policies.push_back(policy_to_json(p).dump());
  }
  l.split = "planned on " + hw.name;
  l.predicted_tokens_per_s = pp.throughput;
  l.predicted_bubble = pp.bubble;
  return l;
}

// The Comm does not watch the stop flag: after Ctrl-C the job still ends in order (the driver
// stops at a token step and ends every stage), so its waits must keep going.
PipelineJob::PipelineJob(const Env&, const GenerateArgs& a)
    : comm_(std::make_unique<dist::Comm>()), timeout_s_(a.rank_timeout), stages_(a.pipeline.stages) {
  if (comm_->size() == stages_) return;
  layout_sent_ = true;  // every rank refuses on its own, without waiting for the others
  if (is_root())
    FH_FAIL("--pipeline-stages ", stages_, " needs as many ranks (mpirun -np ", stages_, "), this job has ",
            comm_->size());
  misfit_ = true;  // serve() ends this rank with an error and no message: one message a job, not one a rank
}

PipelineJob::~PipelineJob() {
  if (!is_root() || layout_sent_) return;
  dist::Writer w;
  w.put<int32_t>(0);  // no layout: rank 0 failed before the job started (its message says why)
  const std::vector<std::byte> msg = w.take();
  for (int r = 1; r < comm_->size(); ++r) comm_->send(r, kPipelineLayoutTag, msg);
  (void)comm_->flush(5);
}

int PipelineJob::threads(int requested) const { return rank_threads(*comm_, requested); }

int PipelineJob::serve(const GenerateArgs& a, const Env& env) {
  dist::Comm& comm = *comm_;
  const int rank = comm.rank();
  if (misfit_) {
    // Rank 0 misfits too when every rank has these flags, and says so. If it sends a layout
    // instead, this rank alone was given another count: the job would wait out --rank-timeout.
    dist::Message m;
    if (comm.recv(0, kPipelineLayoutTag, 2.0, &m).ok()) {
      const int32_t stages = dist::Reader(m.bytes, "the pipeline layout").get<int32_t>();
      say("flexh2o: error: rank ", rank, " was given --pipeline-stages ", stages_, " and rank 0 runs ", stages,
          " stages; give every rank the same flags; ending the job");
      comm.abort(1);
    }
    return 1;
  }
  PipelineLayout l;
  std::string terms;  // rank 0's job_terms
  {
    dist::Message m;
    if (Status st = comm.recv(0, dist::kAnyTag, timeout_s_, &m); !st.ok()) {
      say("flexh2o: error: rank ", rank, " got no pipeline layout from rank 0: ", st.message(), "; ending the job");
      comm.abort(1);
    }
    if (m.tag != kPipelineLayoutTag) {  // rank 0 runs data parallel: it waits for this rank as a worker
      say("flexh2o: error: rank ", rank, " was given --pipeline-stages and rank 0 was not (it runs data parallel); "
          "give every rank the same flags; ending the job");
      comm.abort(1);
    }
    dist::Reader r(m.bytes, "the pipeline layout");
    l.stages = r.get<int32_t>();
    if (l.stages <= 0) {
      say("flexh2o: rank ", rank, ": rank 0 stopped with an error before the job started (see its message)");
      return 1;
    }
    l.groups = r.get<int32_t>();
    l.bounds = r.get_array<int64_t>();
    l.prompt_len = r.get<int64_t>();
    l.gen_len = r.get<int64_t>();
    l.requests = r.get<int64_t>();
    for (uint32_t i = 0, n = r.get<uint32_t>(); i < n; ++i) l.policies.push_back(r.get_string());
    terms = r.get_string();
  }
  const int s = dist::rank_stage(rank, l.stages);
  dist::CommChannel ch(comm);
  dist::ServeResult res;
  try {
    LoadedModel lm = load_model(env, a.model, a.tokenizer);
    check_job_terms(terms, job_terms(lm.model->config(), a), comm.describe(rank));
    const std::string device = select_device(a.device, *lm.model, std::cerr);
    const Model stage = lm.model->stage(l.bounds[size_t(s)], l.bounds[size_t(s) + 1]);
    CpuDevice cpu(threads(a.threads));
    Forward fwd(stage, cpu);
    say("flexh2o: pipeline stage ", s, " of ", l.stages, " (", comm.describe(rank), "): layers ", l.bounds[size_t(s)],
        "-", l.bounds[size_t(s) + 1] - 1);
    RunSetup rs = stage_setup(a, env, stage, fwd, cpu, l, s, device, rank_cuda_index(comm, device), std::cerr);
    rs.offload->set_idle([&ch] { ch.progress(); });
    res = dist::serve_stage(ch, *rs.offload, l.stages, l.bounds[size_t(s)], pipeline_options(timeout_s_, env));
  } catch (const std::exception& e) {  // before serving (its own setup) or a failed wait: the job cannot go on
    say("flexh2o: error: ", e.what(), "; ending the job");
    comm.abort(1);
  }
  if (!res.error.empty()) {
    say("flexh2o: error: pipeline stage ", s, ": ", res.error);
    return 1;
  }
  if (res.job_failed) {
    say("flexh2o: pipeline stage ", s, ": the job ended after an error on another rank (rank 0 says which)");
    return 1;
  }
  if (res.stop_signal > 0) {
    say("flexh2o: pipeline stage ", s, ": the job was stopped by signal ", res.stop_signal,
        " at a token step (rank 0 kept the finished results)");
    return 128 + res.stop_signal;
  }
  return 0;
}

PipelineDriverSetup PipelineJob::start(const GenerateArgs& a, const Env& env, const Model& model, CpuDevice& cpu,
                                       const PipelineLayout& l, const std::string& device, std::ostream& log) {
  dist::Writer w;
  w.put<int32_t>(l.stages).put<int32_t>(l.groups).put_array(std::span<const int64_t>(l.bounds));
  w.put(l.prompt_len).put(l.gen_len).put(l.requests).put<uint32_t>(uint32_t(l.policies.size()));
  for (const std::string& p : l.policies) w.put_string(p);
  w.put_string(job_terms(model.config(), a));
  const std::vector<std::byte> msg = w.take();
  for (int r = 1; r < comm_->size(); ++r) comm_->send(r, kPipelineLayoutTag, msg);
  layout_sent_ = true;
  PipelineDriverSetup d;
  d.layout = l;
  const int s = l.stages - 1;
  d.stage = std::make_unique<Model>(model.stage(l.bounds[size_t(s)], l.bounds[size_t(s) + 1]));
  d.fwd = std::make_unique<Forward>(*d.stage, cpu);
  log << "flexh2o: pipeline of " << l.stages << " stages (layers";
  for (int i = 0; i < l.stages; ++i) log << " " << l.bounds[size_t(i)] << "-" << l.bounds[size_t(i) + 1] - 1;
  log << ", split " << l.split << "), " << l.groups << (l.groups == 1 ? " group" : " groups")
      << " in flight; rank 0 runs stage " << s;
  if (l.predicted_tokens_per_s > 0)
    log << "; predicted " << l.predicted_tokens_per_s << " tok/s, bubble " << l.predicted_bubble;
  log << "\n";
  d.channel = std::make_unique<dist::CommChannel>(*comm_);
  try {
    d.rs = stage_setup(a, env, *d.stage, *d.fwd, cpu, l, s, device, rank_cuda_index(*comm_, device), log);
  } catch (const std::exception& e) {  // the stages already wait for steps: end them in order
    try {
      (void)dist::end_stages(*d.channel, l.stages, true, pipeline_options(timeout_s_, env));
    } catch (const Error&) {  // a stage that cannot be reached ends by its own timeout
    }
    throw;
  }
  d.rs.offload->set_idle([ch = d.channel.get()] { ch->progress(); });
  dist::PipelineOptions po = pipeline_options(timeout_s_, env);
  // Said at once: under mpirun a signal is followed by SIGKILL 1 s later, often before the end.
  po.on_stop = [has_output = !a.output.empty()](int signal) {
    say("flexh2o: signal ", signal, ": the pipeline stops at the next token step",
        (has_output ? "; finished results are in --output (rerun with --resume to finish)" : ""));
  };
  d.driver = std::make_unique<dist::PipelineDriver>(*d.channel, *d.rs.offload, l.stages, l.bounds[size_t(s)], po);
  return d;
}

void PipelineJob::fail(const dist::PipelineDriver& d, const std::exception& e, bool has_output) {
  if (!d.broken()) return;
  say("flexh2o: error: ", e.what(), "; ending every rank of the job",
      (has_output ? " (finished results are in --output: rerun with --resume to finish)" : ""));
  comm_->abort(1);
}

nlohmann::json pipeline_report_json(const PipelineLayout& l, const dist::PipelineReport& r) {
  nlohmann::json stages = nlohmann::json::array();
  for (const dist::StageStats& s : r.stages)
    stages.push_back({{"stage", s.stage},
                      {"rank", s.rank},
                      {"where", s.host},
                      {"layers", {s.first_layer, s.end_layer}},
                      {"steps", s.steps},
                      {"busy_seconds", s.busy_s},
                      {"wall_seconds", s.wall_s},
                      {"bytes_in", s.bytes_in},
                      {"bytes_out", s.bytes_out},
                      {"peak_kv_bytes", s.peak_kv_bytes}});
  nlohmann::json j{{"stages", l.stages},
          {"groups", l.groups},
          {"bounds", l.bounds},
          {"split", l.split},
          {"bubble_fraction", r.bubble()},
          {"bytes_between_stages", r.bytes_between_stages()},
          {"per_stage", stages}};
  if (l.predicted_tokens_per_s > 0) {
    j["predicted_tokens_per_s"] = l.predicted_tokens_per_s;
    j["predicted_bubble_fraction"] = l.predicted_bubble;
  }
  return j;
}

}  // namespace flexh2o::cli
