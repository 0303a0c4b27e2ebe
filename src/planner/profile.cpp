// The hardware profiler: small timed probes of every resource the cost model uses.
#include "planner/profile.h"

#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "offload/aligned_buffer.h"
#include "offload/disk_store.h"
#include "offload/io_backend.h"

namespace flexh2o {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of f, repeated until min_seconds have passed (after one warm-up call).
template <typename F>
double time_per_call(double min_seconds, F&& f) {
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

}  // namespace

HardwareProfile measure_profile(CpuDevice& dev, const ProfileOptions& o) {
  HardwareProfile h;
  h.name = "measured";
  h.source = "measured by `flexh2o profile` on this machine's CPU device (device and host tiers share RAM; "
             "host<->device = memcpy between buffers; disk through DiskStore)";
  struct sysinfo si {};
  if (sysinfo(&si) == 0) {
    const double avail = double(si.freeram + si.bufferram) * double(si.mem_unit);
    h.device_memory = h.host_memory = avail;
  }
  const std::filesystem::path dir =
      o.offload_dir.empty() ? std::filesystem::temp_directory_path() / ("flexh2o-profile-" + std::to_string(::getpid()))
                            : o.offload_dir / "flexh2o-profile";
  std::filesystem::create_directories(dir);
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
      const double tw = time_per_call(o.min_seconds, [&] { store->write("probe", 0, o.disk_bytes, buf.data()).throw_if_error(); });
      const double tr = time_per_call(o.min_seconds, [&] { store->read("probe", 0, o.disk_bytes, buf.data()).throw_if_error(); });
      h.host_to_disk = double(o.disk_bytes) / tw;
      h.disk_to_host = double(o.disk_bytes) / tr;
      const size_t chunks = o.disk_bytes / o.kv_chunk_bytes;
      std::vector<float> small(o.kv_chunk_bytes / sizeof(float), 1.f);
      auto pass = [&](bool write) {
        for (size_t i = 0; i < chunks; ++i) {
          const uint64_t off = uint64_t(i) * o.kv_chunk_bytes;
          Status s = write ? store->write("probe", off, o.kv_chunk_bytes, small.data())
                           : store->read("probe", off, o.kv_chunk_bytes, small.data());
          s.throw_if_error();
        }
      };
      h.host_to_disk_cache = double(chunks * o.kv_chunk_bytes) / time_per_call(o.min_seconds, [&] { pass(true); });
      h.disk_to_host_cache = double(chunks * o.kv_chunk_bytes) / time_per_call(o.min_seconds, [&] { pass(false); });
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
    const double tp = rate(512), td = rate(16), t1 = rate(1);
    h.device_gemm_prefill = h.host_gemm = 2.0 * 512 * double(N * K) / tp;
    h.device_gemm_decode = 2.0 * 16 * double(N * K) / td;
    h.device_weight_read = double(N * K) * 2 / t1;
  }
  // Attention (seq_keys layout), prefill and decode; host attention is the same kernel here.
  {
    const int64_t H = 8, hd = 64;
    auto run = [&](int64_t B, int64_t tq, int64_t len) {
      const int64_t cap = len;
      std::vector<float> q(size_t(B * tq * H * hd), 0.01f), kv(size_t(B * H * cap * hd), 0.02f), out(q.size());
      std::vector<int32_t> keys(static_cast<size_t>(B), static_cast<int32_t>(len));
      cpu::AttentionArgs a;
      a.q = q.data();
      a.q_stride = H * hd;
      a.k = a.v = kv.data();
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
  return h;
}

}  // namespace flexh2o
