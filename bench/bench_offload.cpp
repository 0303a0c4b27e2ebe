// Offloading benchmarks on the CPU device (the GPU stand-in), each ratio against a baseline
// measured in the same run:
//  pipeline: OPT dummy with 50% of the weights on disk and the KV cache on the host. Wall time
//            vs a compute-only run (all weights resident) and an I/O-only pass (reading the same
//            disk-homed weights through the NVMe tier for the same number of token steps);
//            overlap efficiency = max(compute-only, I/O-only) / wall. Then the same with the KV
//            cache on disk (tokens/s, the engine's overlap efficiency), and the KV bytes per link
//            with an f16 and an f32 cache.
//  h2o:      full cache vs H2O (heavy 10% + recent 10% of the prompt) at the same block size, KV
//            on the host and on disk: tokens/s and KV bytes moved; with the KV on disk (weights
//            resident), the rate the disk queue reads the KV at against a sequential read of the
//            same disk in the same run; and the largest block that fits a fixed --cpu-mem with
//            each (from the engine's own memory accounting).
//  compress: OPT-1.3B dummy with every weight on disk (KV on the host), with and without
//            --compress-weight (and with --compress-cache too): bytes per link and tok/s, each
//            ratio against the uncompressed run of the same workload in the same run.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "policies/kv_policy.h"

namespace {
using namespace flexh2o;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double secs(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<GenerationRequest> workload(const ModelConfig& c, int64_t n, int64_t prompt, int64_t gen) {
  std::vector<GenerationRequest> reqs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto& r = reqs[size_t(i)];
    r.prompt_ids.resize(size_t(prompt));
    for (int64_t t = 0; t < prompt; ++t) r.prompt_ids[size_t(t)] = int32_t((i * 131 + t * 7919) % c.vocab_size);
    r.max_new_tokens = gen;
    r.sampling.temperature = 0;
  }
  return reqs;
}

struct RunResult {
  double seconds = 0, tokens_per_s = 0;
  OffloadReport report;
};

RunResult run(const Model& m, CpuDevice& dev, OffloadOptions o, const std::vector<GenerationRequest>& reqs,
              const std::string& trace_path = "") {
  o.trace = !trace_path.empty();
  OffloadEngine e(m, dev, o);
  GenerateOptions go;
  go.ignore_eos = true;
  GenerateStats st;
  auto t0 = Clock::now();
  generate(e, reqs, go, &st);
  RunResult r;
  r.seconds = secs(t0);
  r.tokens_per_s = double(st.generated_tokens) / r.seconds;
  r.report = e.report();
  if (o.trace) {
    std::ofstream f(trace_path);
    e.write_trace(f);
  }
  return r;
}

// Reads every disk-homed weight once per token step through a DiskStore, as the engine's disk
// queue does: whole tensors, except the token table, of which a step reads only its rows
// (block x prompt rows at the prefill, block rows per decode step; 4 KiB apart here).
double io_only(const Model& m, const WeightPlacement& wp, const fs::path& dir, int steps, int64_t block,
               int64_t prompt) {
  std::string why;
  auto io = make_io_backend(IoBackendChoice::kAuto, &why);
  auto store = DiskStore::open(dir / "io-only", "io-only", *io);
  size_t max_bytes = 0;
  struct File { std::string name; TensorView v; bool rows; };
  std::vector<File> files;
  for (const auto& u : wp.units)
    for (const auto& t : u.tensors)
      if (t.tier == Tier::kDisk) {
        std::string name = "t" + std::to_string(files.size());
        store->put(name, t.source).throw_if_error();
        files.push_back({name, t.source, &u == &wp.units.front() && t.source.data == m.weights().embed.data});
        max_bytes = std::max(max_bytes, t.bytes);
      }
  std::vector<std::byte> buf(max_bytes + 4096);
  auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(buf.data()) + 4095) / 4096 * 4096);
  const int64_t V = m.config().vocab_size;
  auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s)
    for (const auto& f : files) {
      if (!f.rows) {
        store->read(f.name, 0, f.v.nbytes(), aligned).throw_if_error();
        continue;
      }
      const size_t row = f.v.nbytes() / size_t(V);
      const int64_t n = block * (s == 0 ? prompt : 1);
      for (int64_t i = 0; i < n; ++i)
        store->read(f.name, uint64_t((i * 7919) % V) * row, row, aligned + size_t(i) * row).throw_if_error();
    }
  return secs(t0);
}

// GB/s of one large sequential read through the NVMe tier (1 MiB requests, one submission).
double sequential_read_gbps(const fs::path& dir) {
  auto io = make_io_backend(IoBackendChoice::kAuto, nullptr);
  auto store = DiskStore::open(dir / "seq", "seq", *io);
  const size_t bytes = size_t(256) << 20, chunk = size_t(1) << 20;
  store->create("seq", bytes).throw_if_error();
  std::vector<std::byte> buf(bytes + 4096);
  auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(buf.data()) + 4095) / 4096 * 4096);
  std::vector<StoreRange> ranges;
  for (size_t off = 0; off < bytes; off += chunk) ranges.push_back({off, chunk, aligned + off});
  store->write_ranges("seq", ranges).throw_if_error();
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    store->read_ranges("seq", ranges).throw_if_error();
    best = std::max(best, double(bytes) / secs(t0) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "bench_offload.json", configs = FLEXH2O_SOURCE_CONFIGS, dir = "bench_offload_store";
  std::string pipeline_model = "opt-1.3b", h2o_model = "opt-125m";
  int64_t cpu_mem_mib = 256;
  bool run_pipeline = true, run_h2o = true, run_compress = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--json") json_path = argv[i + 1];
    else if (a == "--offload-dir") dir = argv[i + 1];
    else if (a == "--pipeline-model") pipeline_model = argv[i + 1];
    else if (a == "--h2o-model") h2o_model = argv[i + 1];
    else if (a == "--cpu-mem-mib") cpu_mem_mib = std::stoll(argv[i + 1]);
    else if (a == "--only") {
      const std::string only = argv[i + 1];
      run_pipeline = only == "pipeline", run_h2o = only == "h2o", run_compress = only == "compress";
    }
  }
  const int threads = int(std::thread::hardware_concurrency());
  CpuDevice dev(threads);
  nlohmann::json out{{"threads", threads}};
  std::printf("machine: %d threads; offload dir %s\n\n", threads, dir.c_str());

  if (run_pipeline) {  // ---- pipeline ----
    ModelConfig c = ModelConfig::from_file(configs + "/models/" + pipeline_model + ".json");
    c.name = pipeline_model;
    Model m = Model::dummy(c, 3);
    auto reqs = workload(c, 8, 32, 6);
    OffloadOptions o;
    o.policy.w_gpu_percent = 50;
    o.policy.w_cpu_percent = 0;  // the other 50% on disk
    o.policy.cache_gpu_percent = 0;
    o.policy.cache_cpu_percent = 100;
    o.policy.gpu_batch_size = 4;
    o.policy.num_gpu_batches = 2;
    o.offload_dir = fs::path(dir) / "pipeline";
    { OffloadEngine warm(m, dev, o); }  // write the store once, outside the timing
    RunResult full = run(m, dev, o, reqs, "bench_offload_trace.json");
    OffloadOptions resident = o;
    resident.policy.w_gpu_percent = 100;
    RunResult compute = run(m, dev, resident, reqs);
    const int steps = int(reqs[0].max_new_tokens);
    const double io = io_only(m, place_weights(m, o.policy), dir, steps, 8, 32);
    const double bound = std::max(compute.seconds, io);
    std::printf("pipeline %s, 50%% weights on disk, KV on host, 4x2 block, 32+6 tokens:\n", pipeline_model.c_str());
    std::printf("  wall %.2f s | compute-only %.2f s | I/O-only %.2f s | overlap efficiency %.2f (target 0.85)\n",
                full.seconds, compute.seconds, io, bound / full.seconds);
    std::printf("  engine's own: %.2f over the run, %.2f per token step (compute busy %.2f s, disk->host busy %.2f s, "
                "schedule wall %.2f s); %s\n",
                full.report.overlap_efficiency, full.report.step_overlap_efficiency, full.report.busy[0],
                full.report.busy[size_t(Queue::kDiskRead)], full.report.wall, full.report.io_note.c_str());
    std::printf("  schedule trace: bench_offload_trace.json (Perfetto / chrome://tracing)\n\n");
    out["pipeline"] = {{"model", pipeline_model}, {"wall_s", full.seconds}, {"compute_only_s", compute.seconds},
                       {"io_only_s", io}, {"overlap_efficiency", bound / full.seconds},
                       {"engine_overlap_efficiency", full.report.overlap_efficiency},
                       {"engine_step_overlap_efficiency", full.report.step_overlap_efficiency},
                       {"tokens_per_s", full.tokens_per_s},
                       {"disk_to_host_bytes", full.report.bytes[size_t(Link::kDiskToHost)]}};
    // The KV cache on disk too, then the KV bytes per link with an f16 and an f32 cache.
    OffloadOptions kv_disk = o;
    kv_disk.policy.cache_cpu_percent = 0;
    RunResult d = run(m, dev, kv_disk, reqs);
    std::printf("  KV on disk too: %.2f tok/s (KV on host %.2f); engine's overlap efficiency %.2f, per step %.2f\n",
                d.tokens_per_s, full.tokens_per_s, d.report.overlap_efficiency, d.report.step_overlap_efficiency);
    out["pipeline"]["kv_disk"] = {{"tokens_per_s", d.tokens_per_s},
                                  {"engine_overlap_efficiency", d.report.overlap_efficiency},
                                  {"engine_step_overlap_efficiency", d.report.step_overlap_efficiency}};
    nlohmann::json per_dtype;
    for (DType dt : {DType::F16, DType::F32}) {
      OffloadOptions od = kv_disk;
      od.kv_dtype = dt;
      RunResult r = run(m, dev, od, reqs);
      std::printf("  KV %s: %llu KV bytes moved; per link disk->host %llu host->device %llu device->host %llu "
                  "host->disk %llu\n",
                  std::string(dtype_name(dt)).c_str(), (unsigned long long)r.report.kv_bytes,
                  (unsigned long long)r.report.bytes[0], (unsigned long long)r.report.bytes[1],
                  (unsigned long long)r.report.bytes[2], (unsigned long long)r.report.bytes[3]);
      per_dtype[std::string(dtype_name(dt))] = {{"kv_bytes", r.report.kv_bytes}, {"links", r.report.bytes}};
    }
    out["pipeline"]["kv_bytes_by_dtype"] = per_dtype;
    std::printf("\n");
  }

  if (run_h2o) {  // ---- h2o vs full ----
    ModelConfig c = ModelConfig::from_file(configs + "/models/" + h2o_model + ".json");
    c.name = h2o_model;
    Model m = Model::dummy(c, 4);
    KvPolicyConfig kc;
    kc.kind = KvPolicyKind::kH2o;
    kc.heavy_ratio = 0.1;
    kc.recent_ratio = 0.1;
    auto h2o = make_policy(kc);
    nlohmann::json rows = nlohmann::json::array();
    const double seq = sequential_read_gbps(dir);
    std::printf("h2o %s, block 4x2, prompt 512 (sequential disk read in this run: %.2f GB/s):\n", h2o_model.c_str(), seq);
    std::printf("  %-6s %-5s %-6s %10s %16s %22s\n", "gen", "kv", "policy", "tok/s", "KV bytes moved",
                "disk KV read GB/s (x seq)");
    for (int64_t gen : {32, 128}) {
      auto reqs = workload(c, 8, 512, gen);
      for (bool disk : {false, true}) {
        for (const KvPolicy* p : std::vector<const KvPolicy*>{nullptr, h2o.get()}) {
          OffloadOptions o;
          o.policy.cache_gpu_percent = 0;
          o.policy.cache_cpu_percent = disk ? 0 : 100;
          o.policy.gpu_batch_size = 4;
          o.policy.num_gpu_batches = 2;
          o.offload_dir = fs::path(dir) / "h2o";
          o.kv_policy = p;
          RunResult r = run(m, dev, o, reqs);
          // Weights are resident: the disk read queue reads only KV rows.
          const double busy = r.report.busy[size_t(Queue::kDiskRead)];
          const double kv_read = disk && busy > 0 ? double(r.report.bytes[size_t(Link::kDiskToHost)]) / busy / 1e9 : 0;
          std::printf("  %-6lld %-5s %-6s %10.2f %16llu", (long long)gen, disk ? "disk" : "host", p ? "h2o" : "full",
                      r.tokens_per_s, (unsigned long long)r.report.kv_bytes);
          if (disk) std::printf(" %14.2f (%.2f)", kv_read, kv_read / seq);
          std::printf("\n");
          rows.push_back({{"gen", gen}, {"kv", disk ? "disk" : "host"}, {"policy", p ? "h2o-20%" : "full"},
                          {"tokens_per_s", r.tokens_per_s}, {"kv_bytes_moved", r.report.kv_bytes},
                          {"disk_kv_read_gbps", kv_read}, {"sequential_read_gbps", seq}});
        }
      }
    }
    // Largest block (gpu_batch_size x 1) whose host memory fits --cpu-mem, prompt 512 + 128.
    const uint64_t cap = uint64_t(cpu_mem_mib) << 20;
    nlohmann::json fits;
    for (const KvPolicy* p : std::vector<const KvPolicy*>{nullptr, h2o.get()}) {
      int64_t best = 0;
      for (int64_t gbs = 1; gbs <= 4096; gbs *= 2) {
        OffloadOptions o;
        o.policy.cache_gpu_percent = 0;
        o.policy.cache_cpu_percent = 100;
        o.policy.gpu_batch_size = gbs;
        o.host_mem = cap;
        o.kv_policy = p;
        try {
          OffloadEngine e(m, dev, o);
          e.begin_batch(gbs, 512 + 128);
          std::vector<int32_t> ids(size_t(gbs * 512), 5), pos(ids.size());
          for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i % 512);
          std::vector<float> logits;
          e.step(ids.data(), pos.data(), 512, nullptr, logits);  // allocation happens at the prefill
          best = gbs;
        } catch (const Error&) {
          break;
        }
      }
      std::printf("  largest block with KV on host under --cpu-mem %lld MiB (512+128): %s %lld\n",
                  (long long)cpu_mem_mib, p ? "h2o" : "full", (long long)best);
      fits[p ? "h2o-20%" : "full"] = best;
    }
    out["h2o"] = {{"model", h2o_model}, {"rows", rows}, {"largest_block_cpu_mem_mib", cpu_mem_mib},
                  {"largest_block", fits}};
  }
  if (run_compress) {  // ---- 4-bit compression, weights on disk ----
    ModelConfig c = ModelConfig::from_file(configs + "/models/" + pipeline_model + ".json");
    c.name = pipeline_model;
    Model m = Model::dummy(c, 3);
    auto reqs = workload(c, 8, 32, 6);
    std::printf("compress %s, every weight on disk, KV on host, 4x2 block, 32+6 tokens:\n", pipeline_model.c_str());
    std::printf("  %-12s %10s %14s %14s %14s %14s %8s %8s\n", "run", "tok/s", "disk->host", "host->device",
                "device->host", "host->disk", "x bytes", "x tok/s");
    nlohmann::json rows = nlohmann::json::array();
    RunResult base;
    for (int mode = 0; mode < 3; ++mode) {
      OffloadOptions o;
      o.policy.w_gpu_percent = 0;
      o.policy.w_cpu_percent = 0;
      o.policy.cache_gpu_percent = 0;
      o.policy.cache_cpu_percent = 100;
      o.policy.gpu_batch_size = 4;
      o.policy.num_gpu_batches = 2;
      o.policy.compress_weight = mode >= 1;
      o.policy.compress_cache = mode == 2;
      o.offload_dir = fs::path(dir) / (mode ? "compress-w4" : "compress-f16");
      { OffloadEngine warm(m, dev, o); }  // write the store once, outside the timing
      RunResult r = run(m, dev, o, reqs);
      if (mode == 0) base = r;
      const char* name = mode == 0 ? "f16" : mode == 1 ? "W4" : "W4+KV4";
      const double xb = double(r.report.bytes[0]) / double(base.report.bytes[0]);
      const double xt = r.tokens_per_s / base.tokens_per_s;
      std::printf("  %-12s %10.2f %14llu %14llu %14llu %14llu %8.3f %8.2f\n", name, r.tokens_per_s,
                  (unsigned long long)r.report.bytes[0], (unsigned long long)r.report.bytes[1],
                  (unsigned long long)r.report.bytes[2], (unsigned long long)r.report.bytes[3], xb, xt);
      rows.push_back({{"run", name}, {"tokens_per_s", r.tokens_per_s}, {"links", r.report.bytes},
                      {"kv_bytes", r.report.kv_bytes}, {"disk_to_host_vs_f16", xb}, {"tokens_per_s_vs_f16", xt},
                      {"disk_read_busy_s", r.report.busy[size_t(Queue::kDiskRead)]},
                      {"compute_busy_s", r.report.busy[0]}});
    }
    std::printf("  (x bytes: disk->host bytes over the f16 run's; x tok/s: over the f16 run's)\n");
    out["compress"] = {{"model", pipeline_model}, {"rows", rows}};
  }
  std::ofstream(json_path) << out.dump(2) << "\n";
  std::printf("\nwrote %s\n", json_path.c_str());
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
