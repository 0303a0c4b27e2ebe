// The hardware profiler: small timed probes of every resource the cost model uses.
#include "planner/profile.h"

#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <tbb/task_arena.h>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/quant4.h"
#include "engine/executor.h"
#include "engine/kv_evict.h"
#include "engine/layer_compute.h"
#include "engine/schedule.h"
#include "kernels/cpu/ops.h"
#include "model/weights.h"
#include "offload/aligned_buffer.h"
#include "offload/disk_store.h"
#include "offload/io_backend.h"
#include "policies/kv_policy.h"

namespace flexh2o {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kProbeDirPrefix = "flexh2o-profile-";  // then the measuring process's id

// The temporary directory's probe directory of this process. Those of processes that are gone (a
// profile killed mid-probe leaves its 256 MiB of probe files) and untouched for an hour are removed
// first: the hour spares a live profile of another PID namespace (containers sharing /tmp), whose
// pid means nothing here, as a probe takes seconds.
std::filesystem::path temp_probe_dir() {
  std::error_code ec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec)
    FH_FAIL("the temporary directory (TMPDIR, else /tmp) is unusable for the disk probe: ", ec.message(),
            "; set TMPDIR to an existing directory, or give --offload-dir a directory on the disk to measure");
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kProbeDirPrefix, 0) != 0) continue;
    const std::string id = name.substr(std::strlen(kProbeDirPrefix));
    if (id.empty() || id.size() > 9 || id.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(pid_t(std::stol(id)), 0) == 0 || errno != ESRCH) continue;
    const auto touched = std::filesystem::last_write_time(e.path(), ec);
    if (!ec && std::filesystem::file_time_type::clock::now() - touched > std::chrono::hours(1))
      std::filesystem::remove_all(e.path(), ec);
  }
  return tmp / (kProbeDirPrefix + std::to_string(::getpid()));
}

// Seconds of the fastest call of f, repeated until min_seconds have passed and at least 3
// calls were made (after one warm-up call). The fastest, not the mean: the machine may be
// shared, and the engine's validation (bench_planner) also compares best-of-N runs.
template <typename F>
double time_per_call(double min_seconds, F&& f);

// Mean seconds per call (disk probes: the engine's many KV requests see the mean latency,
// queueing and writeback included, not the best case).
template <typename F>
double mean_per_call(double min_seconds, F&& f) {
  f();
  int n = 0;
  const auto t0 = Clock::now();
  double el = 0;
  do {
    f();
    ++n;
    el = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (el < min_seconds);
  return el / n;
}

template <typename F>
double time_per_call(double min_seconds, F&& f) {
  f();
  int n = 0;
  const auto t0 = Clock::now();
  double el = 0, best = 1e300;
  do {
    const auto t1 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t1).count());
    ++n;
    el = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (el < min_seconds || n < 3);
  return best;
}

// The KV-decision probes' model: 16 KV heads of 128, `group` query heads per KV head.
ModelConfig kv_probe_model(int64_t group) {
  return ModelConfig::from_json_text(
      "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 2048, \"num_hidden_layers\": 1, "
      "\"num_attention_heads\": " + std::to_string(16 * group) + ", \"num_key_value_heads\": 16, "
      "\"head_dim\": 128, \"intermediate_size\": 256, \"max_position_embeddings\": 8192, "
      "\"torch_dtype\": \"float16\"}",
      "profile probe model");
}

std::unique_ptr<KvPolicy> kv_probe_policy() {
  KvPolicyConfig kc;
  kc.kind = KvPolicyKind::kH2o;
  kc.heavy_ratio = 0.1;
  kc.recent_ratio = 0.1;
  return make_policy(kc);
}

// What both KV-decision probes share: H2O (10% heavy + 10% recent of `prompt`) over `layers`
// layers of B sequences x 16 KV heads (`group` query heads each), each layer with its own scores
// ([B, heads, cap], uniform) and policy state (capacity cap), and the EvictArgs pointing at them.
// Not copyable: ea points in.
struct KvProbe {
  struct Layer {
    std::vector<float> scores;
    KvPolicyState state;
  };
  const ModelConfig pc;
  const std::unique_ptr<KvPolicy> policy = kv_probe_policy();
  const int64_t B, kvh = pc.n_kv_heads, cap;
  const KvBudget budget;
  const std::vector<KvBudget> budgets;
  std::vector<Layer> ls;
  std::vector<int32_t> before, after, seen, dlo, dhi;
  std::mt19937 rng;
  std::uniform_real_distribution<float> u{0.f, 1.f};
  EvictArgs ea;

  KvProbe(int64_t b, int64_t layers, int64_t prompt, int64_t capacity, uint32_t seed, int64_t group = 1)
      : pc(kv_probe_model(group)), B(b), cap(capacity), budget(policy->budget(prompt)), budgets(size_t(b), budget),
        ls(size_t(layers)), before(size_t(b)), after(size_t(b)), seen(size_t(b)), rng(seed) {
    for (Layer& l : ls) {
      l.scores.resize(size_t(B * pc.n_heads * cap));
      for (float& x : l.scores) x = u(rng);
      l.state.reset(B, kvh, cap);
    }
    ea.policy = policy.get();
    ea.config = &pc;
    ea.len_before = before.data();
    ea.len_after = after.data();
    ea.seen_before = seen.data();
    ea.budgets = budgets.data();
    ea.dirty_lo = &dlo;
    ea.dirty_hi = &dhi;
  }
  KvProbe(const KvProbe&) = delete;
  KvProbe& operator=(const KvProbe&) = delete;

  // Best seconds per (sequence, KV head) row of `decide(layer)` over every layer in an arena of
  // `threads`, each call's rows growing to `n`; `next()` runs between calls.
  template <typename Decide, typename Next>
  double row_seconds(double min_seconds, int threads, int64_t n, Decide&& decide, Next&& next) {
    tbb::task_arena arena(threads);
    const double t = time_per_call(min_seconds, [&] {
      arena.execute([&] {
        for (Layer& l : ls) {
          ea.state = &l.state;
          std::fill(after.begin(), after.end(), int32_t(n));
          decide(l);
        }
      });
      next();
    });
    return t / double(std::ssize(ls) * B * kvh);
  }
};

// Seconds per (sequence, KV head) row of decode decisions in an arena of `threads`, `group` query
// heads per KV head, and the row's slots: 32 sequences over 8 layers, each row holding the
// budget's slots plus the new one, through the engine's own apply_kv_policy (scores summed, one victim chosen per row, the newest row moved
// into its slot). The rows' positions are a prefill's (the recent window whole), which the
// policy's one-pass decode choice relies on. The state and scores are 5 MB in all at 512, 20 MB
// at 2048; the layers share two K/V buffers.
std::pair<double, int64_t> kv_policy_row(double min_seconds, int64_t prompt, int threads, int64_t group = 1) {
  const int64_t kept = kv_probe_policy()->budget(prompt).kept(prompt);
  KvProbe p(32, 8, prompt, kept + 1, 7, group);
  const int64_t heavy = p.budget.heavy, cap = p.cap;
  std::vector<uint16_t> k(size_t(p.B * p.kvh * cap * p.pc.head_dim), f32_to_f16(0.01f)), v(k);
  // As a prefill leaves a row: heavy hitters spread over the older prompt, then the recent
  // window's positions up to the prompt's last, without a gap.
  const int64_t stride = std::max<int64_t>(1, (prompt - kept) / std::max<int64_t>(heavy, 1));
  for (KvProbe::Layer& l : p.ls)
    for (int64_t r = 0; r < p.B * p.kvh; ++r)
      for (int64_t s = 0; s < kept; ++s) {
        l.state.acc[size_t(r * cap + s)] = p.u(p.rng);
        l.state.pos[size_t(r * cap + s)] = int32_t(s < heavy ? s * stride : prompt - (kept - s));
      }
  std::fill(p.before.begin(), p.before.end(), int32_t(kept));
  std::fill(p.seen.begin(), p.seen.end(), int32_t(prompt));
  const double t = p.row_seconds(
      min_seconds, threads, kept + 1,
      [&](KvProbe::Layer& l) {
        p.ea.seg = KvSegment{k.data(), v.data(), DType::F16, 0, p.B, cap, l.scores.data()};
        apply_kv_policy(p.ea);
      },
      [&] {
        for (int32_t& x : p.seen) ++x;
      });
  return {t, cap};
}

// Seconds per (sequence, KV head) row of a prefill's decisions on one thread: 8 sequences over 4
// layers, rows of `prompt` slots cut to the budget by the engine's decide_kv_policy, each row's
// keep list copied out as the engine copies it for the device's gather.
double kv_prefill_row(double min_seconds, int64_t prompt) {
  KvProbe p(8, 4, prompt, prompt, 9);
  std::vector<int32_t> lists(size_t(p.B * p.kvh * prompt));
  p.ea.prefill = true;  // before and seen stay 0: each call decides the whole prompt afresh
  return p.row_seconds(
      min_seconds, 1, prompt,
      [&](KvProbe::Layer& l) {
        p.ea.seg = KvSegment{nullptr, nullptr, DType::F16, 0, p.B, prompt, l.scores.data()};
        decide_kv_policy(p.ea, [&](int64_t b, int64_t h, std::span<const int32_t> keep) {
          std::copy(keep.begin(), keep.end(), lists.begin() + (b * p.kvh + h) * prompt);
        });
      },
      [] {});
}

// The probes within a quarter of `room` bytes (at least 8 MiB): each of the two copy buffers and
// the two disk buffers half of it, the GEMV matrix all of it.
ProfileOptions fit_probes(ProfileOptions o, double room) {
  if (!(room > 0)) return o;
  const size_t budget = std::max(size_t(room / 4), size_t(8) << 20), half = budget / 2;
  o.copy_bytes = std::min(o.copy_bytes, half);
  o.disk_bytes = std::max(std::min(o.disk_bytes, half) / o.kv_chunk_bytes, size_t(16)) * o.kv_chunk_bytes;
  o.max_probe_bytes = o.max_probe_bytes ? std::min(o.max_probe_bytes, budget) : budget;
  return o;
}

}  // namespace

void set_measured_memory(HardwareProfile& h) {
  if (const std::optional<uint64_t> avail = available_host_memory()) h.device_memory = h.host_memory = double(*avail);
}

HardwareProfile measure_profile(CpuDevice& dev, const ProfileOptions& asked) {
  HardwareProfile h;
  h.name = "measured";
  h.source = "measured by `flexh2o profile` on this machine's CPU device (device and host tiers share RAM; "
             "host<->device = memcpy between buffers; disk through DiskStore)";
  set_measured_memory(h);
  const ProfileOptions o = asked.fit_memory ? fit_probes(asked, h.host_memory) : asked;
  bool fitted = o.copy_bytes < asked.copy_bytes || o.disk_bytes < asked.disk_bytes;  // and the GEMV's, below
  h.shared_memory = true;  // the CPU device's tiers are both this RAM
  // FlexGen's alpha: MemAvailable is shared with every other process, and the plan's buffers are
  // not all a run holds (the mapped checkpoint's pages, allocator slack, the tokenizer).
  h.usable_fraction = 0.8;
  const std::filesystem::path dir = o.offload_dir.empty() ? temp_probe_dir() : o.offload_dir / "flexh2o-profile";
  if (std::error_code ec; !std::filesystem::create_directories(dir, ec) && ec)
    FH_FAIL("cannot create the disk probe's directory ", dir.string(), ": ", ec.message(),
            o.offload_dir.empty() ? "" : "; give --offload-dir a writable directory on the disk to measure");
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) == 0) h.disk_memory = double(vfs.f_bavail) * double(vfs.f_frsize);

  // Host <-> device: the engine's copies are memcpy between tier buffers.
  {
    std::vector<std::byte> a(o.copy_bytes, std::byte{1}), b(o.copy_bytes);
    const double t = time_per_call(o.min_seconds, [&] { std::memcpy(b.data(), a.data(), a.size()); });
    h.host_to_device = h.device_to_host = h.device_to_host_cache = double(o.copy_bytes) / t;
  }
  // Disk through the store, sequential (weights) and in KV-sized chunks (KV rows).
  {
    std::string why;
    auto io = make_io_backend(IoBackendChoice::kAuto, &why);
    FH_CHECK(io != nullptr, "no usable I/O backend: ", why);
    {
      auto store = DiskStore::open(dir, "flexh2o-profile", *io);
      AlignedBuffer buf(o.disk_bytes);
      std::memset(buf.data(), 7, buf.size());
      store->create("probe", o.disk_bytes).throw_if_error();
      const double tw = mean_per_call(o.min_seconds, [&] { store->write("probe", 0, o.disk_bytes, buf.data()).throw_if_error(); });
      const double tr = mean_per_call(o.min_seconds, [&] { store->read("probe", 0, o.disk_bytes, buf.data()).throw_if_error(); });
      h.host_to_disk = double(o.disk_bytes) / tw;
      h.disk_to_host = double(o.disk_bytes) / tr;
      // The engine moves disk-homed KV in one submission per (layer, micro-batch): page-aligned
      // ranges, the rows [0, len) of each (sequence, KV head, K|V) row block on a load, the page
      // holding each changed row on a decode store. Probe both sizes in such a batch and split
      // each range's time into a fixed part and a per-byte part.
      const size_t chunks = o.disk_bytes / o.kv_chunk_bytes;
      const size_t page = 4096;
      auto batch = [&](size_t len, bool write) {
        std::vector<StoreRange> ranges;
        for (size_t i = 0; i < chunks; ++i) {
          const size_t off = i * o.kv_chunk_bytes;
          ranges.push_back({off, len, buf.data() + off});
        }
        return mean_per_call(o.min_seconds, [&] {
                 (write ? store->write_ranges("probe", ranges) : store->read_ranges("probe", ranges)).throw_if_error();
               }) /
               double(chunks);
      };
      const double tw_big = batch(o.kv_chunk_bytes, true), tr_big = batch(o.kv_chunk_bytes, false);
      const double tw_small = batch(page, true), tr_small = batch(page, false);
      auto split = [&](double t_small, double t_big, double* latency, double* bw) {
        const double per_byte = std::max(0.0, (t_big - t_small) / double(o.kv_chunk_bytes - page));
        *latency = std::max(0.0, t_small - per_byte * double(page));
        *bw = per_byte > 0 ? 1.0 / per_byte : double(o.kv_chunk_bytes) / t_big;
      };
      split(tw_small, tw_big, &h.disk_write_request, &h.host_to_disk_cache);
      split(tr_small, tr_big, &h.disk_read_request, &h.disk_to_host_cache);
      // Duplex? A batched read and a batched write of KV-sized ranges at once (two files, like
      // the engine's two disk queues) vs one after the other.
      {
        store->create("probe2", o.disk_bytes).throw_if_error();
        AlignedBuffer buf2(o.disk_bytes);
        std::memset(buf2.data(), 9, buf2.size());
        auto ranges_of = [&](std::byte* base) {
          std::vector<StoreRange> r;
          for (size_t i = 0; i < chunks; ++i) r.push_back({i * o.kv_chunk_bytes, o.kv_chunk_bytes, base + i * o.kv_chunk_bytes});
          return r;
        };
        const std::vector<StoreRange> r1 = ranges_of(buf.data()), r2 = ranges_of(buf2.data());
        const double both = mean_per_call(o.min_seconds, [&] {
          std::thread t([&] { store->write_ranges("probe2", r2).throw_if_error(); });
          store->read_ranges("probe", r1).throw_if_error();
          t.join();
        }) / double(chunks);
        h.disk_duplex = both < 0.75 * (tw_big + tr_big);
        store->remove("probe2").throw_if_error();
      }
      store->remove("probe").throw_if_error();
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  // GEMM: f16 weights [N, K] as the presets use, fp32 activations.
  {
    const int64_t K = o.gemm_dim, N = o.gemm_dim;
    std::vector<uint16_t> w(size_t(N * K));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.05f, 0.05f);
    for (auto& x : w) x = f32_to_f16(u(rng));
    const TensorView wv{w.data(), DType::F16, Shape{N, K}};
    auto rate = [&](int64_t M) {
      std::vector<float> x(size_t(M * K), 0.01f), y(size_t(M * N));
      const double t = time_per_call(o.min_seconds, [&] {
        dev.run([&] { cpu::linear(x.data(), M, K, wv, nullptr, y.data(), cpu::Epilogue::kStore); });
      });
      return t;
    };
    const double tp = rate(512), td = rate(16);
    h.device_gemm_prefill = h.host_gemm = 2.0 * 512 * double(N * K) / tp;
    h.device_gemm_decode = 2.0 * 16 * double(N * K) / td;
    // GEMV streaming rate with a matrix the size of a real lm_head, and at least twice the
    // last-level cache (the engine streams the whole model every token step; a cache-resident
    // probe overstates it several times: 19 to 55 GB/s from run to run for 96 MB on a VM that
    // reports a 260 MiB L3). Rows past the first block repeat it (the values do not matter).
    const long llc = o.past_last_cache ? ::sysconf(_SC_LEVEL3_CACHE_SIZE) : 0;
    // Rows of `row_bytes` for a probe matrix, beside `held` bytes of probe data, within max_probe_bytes.
    auto rows_for = [&](int64_t row_bytes, int64_t held) {
      const int64_t past = llc > 0 ? std::min(2 * int64_t(llc), int64_t(1) << 30) / row_bytes + 1 : 0;
      const int64_t rows = std::max(o.weight_read_rows, past);
      if (!o.max_probe_bytes) return rows;
      const int64_t fit = std::max<int64_t>(int64_t(o.max_probe_bytes) - held, 0) / row_bytes;
      fitted = fitted || fit < rows;
      return std::clamp<int64_t>(fit, 1, rows);
    };
    auto tile = [](auto& v, int64_t block) {  // v[block, end) repeats v[0, block)
      for (size_t i = size_t(block); i < v.size(); i += size_t(block))
        std::memcpy(v.data() + i, v.data(), std::min(size_t(block), v.size() - i) * sizeof(v[0]));
    };
    const int64_t NB = rows_for(2 * K, 0), B0 = std::min(NB, o.weight_read_rows);
    std::vector<uint16_t> wb(size_t(NB * K));
    for (int64_t i = 0; i < B0 * K; ++i) wb[size_t(i)] = f32_to_f16(u(rng));
    tile(wb, B0 * K);
    std::vector<float> x1(static_cast<size_t>(K), 0.01f), y1;
    auto gemv = [&](const TensorView& w) {
      y1.resize(size_t(w.shape[0]));
      return time_per_call(o.min_seconds, [&] {
        dev.run([&] { cpu::linear(x1.data(), 1, K, w, nullptr, y1.data(), cpu::Epilogue::kStore); });
      });
    };
    const double t1 = gemv(TensorView{wb.data(), DType::F16, Shape{NB, K}});
    // The CPU's cores both stream the weights and do the arithmetic, so a decode GEMM takes the
    // sum of the two (a GEMV's rate falls with each row it multiplies); the probe's own row of
    // arithmetic is taken out of the streaming rate.
    h.gemm_time_sum = true;
    h.device_weight_read = double(NB * K) * 2 / std::max(t1 - 2.0 * double(NB * K) / h.device_gemm_decode, 0.5 * t1);
    // 4-bit compression: the same GEMV over the block in Q4 records, repeated past the cache in
    // turn. The cost model charges a Q4 GEMV its bytes at weight_read, its arithmetic and
    // q4_bytes / dequant, so the rate is what remains of the measured time after those two
    // (floored: a decode that hides entirely behind the stream still gets a finite, large rate).
    // The host is the same CPU.
    const int64_t qrow = int64_t(q4::tensor_bytes(1, K)), NQ = rows_for(qrow, B0 * qrow);
    std::vector<uint8_t> q0(size_t(B0 * qrow));
    q4::encode_rows_f16(wb.data(), K, B0, K, q0.data(), "profile probe");
    std::vector<uint16_t>().swap(wb);  // freed before the Q4 matrix exists
    std::vector<uint8_t> wq(size_t(NQ * qrow));
    std::memcpy(wq.data(), q0.data(), q0.size());
    tile(wq, B0 * qrow);
    const double tq = gemv(TensorView{wq.data(), DType::Q4, Shape{NQ, K}});
    const double qbytes = double(wq.size());
    const double extra = std::max(tq - qbytes / h.device_weight_read - 2.0 * double(NQ * K) / h.device_gemm_decode, 0.01 * tq);
    h.device_dequant = h.host_dequant = qbytes / extra;
  }
  // Non-GEMM ops: a layernorm over many rows (read + write), bytes/s.
  {
    const int64_t M = 2048, D = 1024;
    std::vector<float> x(size_t(M * D), 0.5f), y(x.size()), g(size_t(D), 1.f), b(size_t(D), 0.f);
    const TensorView gv{g.data(), DType::F32, Shape{D}}, bv{b.data(), DType::F32, Shape{D}};
    const double t = time_per_call(o.min_seconds, [&] { dev.run([&] { cpu::layernorm(x.data(), M, D, gv, bv, 1e-5f, y.data()); }); });
    h.device_elementwise = 2.0 * double(M * D) * sizeof(float) / t;
  }
  // Fixed cost of one compute step: a whole decoder layer of a tiny model (hidden 64) on one
  // row: every kernel's dispatch and the layer's bookkeeping, almost no arithmetic.
  {
    const ModelConfig tc = ModelConfig::from_json_text(
        R"({"model_type": "opt", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "ffn_dim": 256, "max_position_embeddings": 64,
            "word_embed_proj_dim": 64, "do_layer_norm_before": true, "activation_function": "relu",
            "torch_dtype": "float16"})",
        "profile probe model");
    const Model tm = Model::dummy(tc, 1);
    LayerCompute lc;
    const int64_t cap = 32, len = 16;
    std::vector<uint16_t> k(size_t(tc.n_kv_heads * cap * tc.head_dim), f32_to_f16(0.01f)), v(k);
    std::vector<float> hidden(size_t(tc.hidden), 0.1f);
    const int32_t pos = int32_t(len - 1), keys = int32_t(len);
    const StepShape st{1, 1, &pos, &keys};
    const KvSegment seg{k.data(), v.data(), DType::F16, 0, 1, cap};
    h.compute_step_overhead = time_per_call(o.min_seconds, [&] {
      dev.run([&] { lc.layer(tc, tm.weights().layers[0], st, hidden.data(), std::span<const KvSegment>(&seg, 1)); });
    });
  }
  // Fixed cost of a non-compute step: the executor's hand-off between queue threads, measured
  // on a real schedule shape with no-op actions, per step of its critical path.
  {
    ScheduleShape sh;
    sh.kinds = unit_kinds(6, false);
    sh.micro_batches = 2;
    sh.unit_streams.assign(sh.kinds.size(), true);
    sh.unit_disk.assign(sh.kinds.size(), false);
    sh.prefill = false;
    sh.kv_device = false;
    sh.kv_host = true;
    const Schedule sched = build_schedule(sh);
    std::vector<double> fin(sched.steps.size());
    std::array<double, kNumQueues> qfree{};
    double path = 0;
    for (size_t i = 0; i < sched.steps.size(); ++i) {
      const Step& stp = sched.steps[i];
      double start = qfree[size_t(stp.queue)];
      for (int d : stp.deps) start = std::max(start, fin[size_t(d)]);
      fin[i] = start + 1;
      qfree[size_t(stp.queue)] = fin[i];
      path = std::max(path, fin[i]);
    }
    const double t = time_per_call(o.min_seconds, [&] { run_schedule(dev, sched, true, [](const Step&) {}); });
    h.schedule_step_overhead = t / path;
  }
  // Attention (seq_keys layout, f16 KV as the engine's default), prefill and decode; host
  // attention is the same kernel here.
  {
    const int64_t H = 8, hd = 64;
    auto run = [&](int64_t B, int64_t tq, int64_t len) {
      const int64_t cap = len;
      std::vector<float> q(size_t(B * tq * H * hd), 0.01f), out(q.size());
      std::vector<uint16_t> kv(size_t(B * H * cap * hd), f32_to_f16(0.02f));
      std::vector<int32_t> keys(static_cast<size_t>(B), static_cast<int32_t>(len));
      cpu::AttentionArgs a;
      a.q = q.data();
      a.q_stride = H * hd;
      a.k = a.v = kv.data();
      a.kv_dtype = DType::F16;
      a.batch = B;
      a.tq = tq;
      a.n_heads = a.kv_heads = H;
      a.head_dim = hd;
      a.capacity = cap;
      a.seq_keys = keys.data();
      a.scale = 0.125f;
      a.out = out.data();
      a.out_stride = H * hd;
      return time_per_call(o.min_seconds, [&] { dev.run([&] { cpu::attention(a); }); });
    };
    const double tp = run(2, 256, 256);
    h.device_attention_prefill = 4.0 * 2 * double(H * hd) * 256 * 257 / 2 / tp;
    const double td = run(16, 1, 512);
    h.device_attention_decode = h.host_attention = 4.0 * 16 * double(H * hd) * 512 / td;
  }
  // KV-policy decisions: a decode row's time at two sizes gives its time per slot and its fixed
  // part, a prefill row's its own time per slot, on one thread; a row of 8 query heads per KV head
  // what each further head's sum adds to a slot. The engine spreads a segment's sequences over
  // the device's threads; what that gains (memory bandwidth and the spread of
  // sequences bound it) is measured as the one-thread time over the all-thread time.
  {
    const auto [t1, n1] = kv_policy_row(o.min_seconds, 512, 1);
    const auto [t2, n2] = kv_policy_row(o.min_seconds, 2048, 1);
    const double slot = std::max(t2 - t1, 1e-3 * t2) / double(n2 - n1);
    h.host_kv_policy = 1 / slot;
    h.host_kv_policy_row = std::max(0.0, t1 - double(n1) * slot);
    const double tp = kv_prefill_row(o.min_seconds, 512);
    h.host_kv_prefill = 512 / std::max(tp - h.host_kv_policy_row, 1e-3 * tp);
    // Grouped rows beside plain ones, interleaved, the best of three each: their difference is
    // small, and one noisy moment would otherwise make it near zero. A further head costs at
    // least a hundredth of a slot (it reads that head's scores).
    const int64_t group = 8;
    double p1 = 1e300, pg = 1e300;
    for (int i = 0; i < 3; ++i) {
      p1 = std::min(p1, kv_policy_row(o.min_seconds / 3, 512, 1).first);
      pg = std::min(pg, kv_policy_row(o.min_seconds / 3, 512, 1, group).first);
    }
    h.host_kv_group = double(group - 1) / std::max((pg - p1) / double(n1), double(group - 1) * 0.01 * slot);
    const int threads = int(dev.threads());
    const double tn = threads > 1 ? kv_policy_row(o.min_seconds, 512, threads).first : t1;
    h.host_kv_threads = std::clamp(t1 / tn, 1.0, double(threads));
  }
  if (fitted)
    h.source += detail::concat("; probes made smaller to fit the memory at hand (each at most ",
                               o.max_probe_bytes >> 20, " MiB), so rates may be overstated");
  return h;
}

}  // namespace flexh2o
