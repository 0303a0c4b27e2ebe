// bench_gpu — measures this GPU's ceilings (device copy GB/s, cuBLAS fp16 GEMM TFLOP/s, pinned
// H2D/D2H GB/s) and times the kernels_cuda ops against them at OPT-6.7B-like shapes (the Q4
// rows: fused GEMV against dequantize + cuBLAS per M, tile sizes, our decode next to FlexGen's
// layout). Each timed kernel run follows an L2 flush; times are CUDA-event medians. Writes
// --json FILE, then prints a short table last. Exits 2 (with the reason) when no GPU is usable. Not a test: no checks.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_probe.h"
#include "core/quant4.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/q4.h"
#include "kernels/cuda/quant.h"
#include "kernels/cuda/resources.h"

using namespace flexh2o;
using namespace flexh2o::gpu;

namespace {

__global__ void fill_kernel(__half* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2half(scale * (float(h & 0xffff) / 32768.f - 1.f));
  }
}

struct Row {
  std::string name, unit;
  double ms, value, ceiling;  // ceiling 0: none
};

class Bench {
 public:
  Bench() : flush_bytes_(size_t(256) << 20) {
    DeviceArena::create(size_t(6) << 30, &arena_).throw_if_error();
    flush_ = alloc<uint8_t>(flush_bytes_);
  }
  template <class T>
  T* alloc(size_t n) {
    T* p = nullptr;
    arena_.allocate_n(n, &p).throw_if_error();
    return p;
  }
  __half* random_half(size_t n, uint32_t seed, float scale = 1.f) {
    __half* p = alloc<__half>(n);
    fill_kernel<<<1024, 256, 0, s_.get()>>>(p, n, seed, scale);
    FH_CUDA_LAUNCH_CHECK("fill", s_.get());
    return p;
  }
  // Median ms of `iters` runs of f, each after an L2 flush (flush=false: back-to-back average).
  double time_ms(const std::function<void()>& f, int iters = 10, bool flush = true) {
    f();  // warm-up
    std::vector<double> t;
    Event a, b;
    if (!flush) {
      a.record(s_.get());
      for (int i = 0; i < iters; ++i) f();
      b.record(s_.get());
      b.synchronize();
      return Event::elapsed_ms(a, b) / iters;
    }
    for (int i = 0; i < iters; ++i) {
      FH_CUDA_CHECK(cudaMemsetAsync(flush_, i, flush_bytes_, s_.get()));
      a.record(s_.get());
      f();
      b.record(s_.get());
      b.synchronize();
      t.push_back(Event::elapsed_ms(a, b));
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  cudaStream_t s() const { return s_.get(); }
  CublasHandle& cublas() { return cublas_; }

 private:
  Stream s_;
  CublasHandle cublas_;
  DeviceArena arena_;
  size_t flush_bytes_;
  uint8_t* flush_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
  const CudaProbe p = probe_cuda();
  if (!p.available) {
    std::fprintf(stderr, "bench_gpu: no usable GPU: %s\n", p.reason.c_str());
    return 2;
  }
  try {
    Bench bn;
    std::vector<Row> rows;
    const cudaStream_t s = bn.s();

    // ---- ceilings
    const size_t copy_bytes = size_t(1) << 30;
    auto* src = bn.alloc<uint8_t>(copy_bytes);
    auto* dst = bn.alloc<uint8_t>(copy_bytes);
    FH_CUDA_CHECK(cudaMemsetAsync(src, 1, copy_bytes, s));
    const double copy_ms = bn.time_ms([&] { FH_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, s)); }, 10, false);
    const double copy_gbs = 2.0 * copy_bytes / copy_ms / 1e6;  // read + write
    rows.push_back({"ceiling d2d copy (read+write)", "GB/s", copy_ms, copy_gbs, 0});

    const int G = 8192;
    __half* ga = bn.random_half(size_t(G) * G, 1);
    __half* gb = bn.random_half(size_t(G) * G, 2);
    __half* gc = bn.alloc<__half>(size_t(G) * G);
    const float one = 1.f, zero = 0.f;
    const double gemm_ms = bn.time_ms([&] {
      bn.cublas().bind(s);
      FH_CUDA_CHECK(cublasGemmEx(bn.cublas().get(), CUBLAS_OP_T, CUBLAS_OP_N, G, G, G, &one, ga, CUDA_R_16F, G, gb,
                                 CUDA_R_16F, G, &zero, gc, CUDA_R_16F, G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }, 10, false);
    const double gemm_tf = 2.0 * G * G * double(G) / gemm_ms / 1e9;
    rows.push_back({"ceiling cuBLAS fp16 GEMM 8192^3", "TFLOP/s", gemm_ms, gemm_tf, 0});

    const size_t pin_bytes = size_t(512) << 20;
    PinnedBuffer pin;
    PinnedBuffer::create(pin_bytes, &pin).throw_if_error();
    std::memset(pin.data(), 1, pin_bytes);
    const double h2d_ms = bn.time_ms([&] { FH_CUDA_CHECK(cudaMemcpyAsync(dst, pin.data(), pin_bytes, cudaMemcpyHostToDevice, s)); }, 5, false);
    const double d2h_ms = bn.time_ms([&] { FH_CUDA_CHECK(cudaMemcpyAsync(pin.data(), src, pin_bytes, cudaMemcpyDeviceToHost, s)); }, 5, false);
    rows.push_back({"ceiling pinned H2D", "GB/s", h2d_ms, pin_bytes / h2d_ms / 1e6, 0});
    rows.push_back({"ceiling pinned D2H", "GB/s", d2h_ms, pin_bytes / d2h_ms / 1e6, 0});

    // ---- decode attention: B=8, 32 heads, head_dim 128, 2048 keys (OPT-6.7B), fp16
    {
      const int64_t B = 8, H = 32, hd = 128, n = 2048;
      AttentionArgs a;
      a.dtype = DType::F16;
      a.batch = B; a.tq = 1; a.n_heads = H; a.kv_heads = H; a.head_dim = hd; a.capacity = n;
      a.q = bn.random_half(size_t(B * H * hd), 3);
      a.k = bn.random_half(size_t(B * H * n * hd), 4);
      a.v = bn.random_half(size_t(B * H * n * hd), 5);
      a.q_stride = a.out_stride = H * hd;
      a.out = bn.alloc<__half>(size_t(B * H * hd));
      std::vector<int32_t> sk(static_cast<size_t>(B), static_cast<int32_t>(n));
      int32_t* dsk = bn.alloc<int32_t>(size_t(B));
      // On s, not the legacy stream: s is non-blocking, and a plain cudaMemcpy from pageable
      // memory may return before its DMA lands, so the kernels could read stale seq_keys.
      FH_CUDA_CHECK(cudaMemcpyAsync(dsk, sk.data(), sk.size() * 4, cudaMemcpyHostToDevice, s));
      a.seq_keys = dsk;
      a.scale = 0.088f;
      a.key_scores = bn.alloc<float>(size_t(B * H * n));
      FH_CUDA_CHECK(cudaMemsetAsync(a.key_scores, 0, size_t(B * H * n) * 4, s));
      const double ms = bn.time_ms([&] { attention(a, s); });
      const double bytes = 2.0 * B * H * n * hd * 2 + 2.0 * B * H * n * 4;  // K+V + scores rw
      rows.push_back({"decode attention B8 H32 d128 n2048 f16", "GB/s", ms, bytes / ms / 1e6, copy_gbs});
      // The same rows on the streamed path (no score row in shared memory; two q.k passes),
      // which every row longer than shared memory holds (~56k keys) takes.
      AttentionArgs st = a;
      st.path = AttentionPath::kStreamed;
      const double sms = bn.time_ms([&] { attention(st, s); });
      rows.push_back({"decode attention B8 H32 d128 n2048 f16 streamed", "GB/s", sms, bytes / sms / 1e6, copy_gbs});
      // prefill: B=1, 512 queries over 512 keys
      AttentionArgs pf = a;
      pf.batch = 1; pf.tq = 512; pf.capacity = 512;
      pf.q = bn.random_half(size_t(512 * H * hd), 6);
      pf.out = bn.alloc<__half>(size_t(512 * H * hd));
      std::vector<int32_t> sk1{512};
      int32_t* dsk1 = bn.alloc<int32_t>(1);
      FH_CUDA_CHECK(cudaMemcpyAsync(dsk1, sk1.data(), 4, cudaMemcpyHostToDevice, s));
      pf.seq_keys = dsk1;
      const double pms = bn.time_ms([&] { attention(pf, s); }, 5);
      const double flops = 4.0 * H * hd * (512.0 * 513 / 2);  // causal QK^T + PV
      rows.push_back({"prefill attention B1 H32 d128 t512 f16", "TFLOP/s", pms, flops / pms / 1e9, gemm_tf});
    }

    // ---- long-context decode: B=1, Llama-3-8B's heads (32 query, 8 KV), 100k keys, fp16
    {
      const int64_t H = 32, kvh = 8, hd = 128, n = 100000;
      AttentionArgs a;
      a.dtype = DType::F16;
      a.batch = 1; a.tq = 1; a.n_heads = H; a.kv_heads = kvh; a.head_dim = hd; a.capacity = n;
      a.q = bn.random_half(size_t(H * hd), 20);
      a.k = bn.random_half(size_t(kvh * n * hd), 21);
      a.v = bn.random_half(size_t(kvh * n * hd), 22);
      a.q_stride = a.out_stride = H * hd;
      a.out = bn.alloc<__half>(size_t(H * hd));
      const int32_t nk = int32_t(n);
      int32_t* dsk = bn.alloc<int32_t>(1);
      FH_CUDA_CHECK(cudaMemcpyAsync(dsk, &nk, 4, cudaMemcpyHostToDevice, s));
      a.seq_keys = dsk;
      a.scale = 0.088f;
      a.key_scores = bn.alloc<float>(size_t(H * n));
      FH_CUDA_CHECK(cudaMemsetAsync(a.key_scores, 0, size_t(H * n) * 4, s));
      const double ms = bn.time_ms([&] { attention(a, s); });
      const double bytes = 2.0 * kvh * n * hd * 2 + 2.0 * H * n * 4;  // K+V + scores rw
      rows.push_back({"decode attention B1 H32/8 d128 n100k f16 (streamed)", "GB/s", ms, bytes / ms / 1e6, copy_gbs});
    }

    // ---- linear at OPT-6.7B MLP shape (K=4096, N=16384), decode and prefill batch
    {
      const int64_t K = 4096, N = 16384;
      __half* w = bn.random_half(size_t(N * K), 7, 0.02f);
      __half* bias = bn.random_half(size_t(N), 8);
      for (int64_t M : {int64_t(8), int64_t(2048)}) {
        __half* x = bn.random_half(size_t(M * K), 9);
        __half* y = bn.alloc<__half>(size_t(M * N));
        const double ms = bn.time_ms([&] { linear(bn.cublas(), DType::F16, x, M, K, w, N, bias, y, Epilogue::kRelu, s); });
        if (M == 8)
          rows.push_back({"linear+bias+relu M8 K4096 N16384 (weights)", "GB/s", ms, 2.0 * N * K / ms / 1e6, copy_gbs / 2});
        else
          rows.push_back({"linear+bias+relu M2048 K4096 N16384", "TFLOP/s", ms, 2.0 * M * N * K / ms / 1e9, gemm_tf});
      }
      // 4-bit weight compression round trip on the same weight (group 64 along N, FlexGen)
      QuantLayout l = QuantLayout::of(Shape{N, K}, 0, 64);
      uint8_t* codes = bn.alloc<uint8_t>(size_t(l.code_bytes()));
      __half* meta = bn.alloc<__half>(size_t(l.meta_elems()));
      __half* back = bn.alloc<__half>(size_t(N * K));
      const double qms = bn.time_ms([&] { quantize_4bit(l, DType::F16, w, codes, meta, s); }, 5);
      const double dms = bn.time_ms([&] { dequantize_4bit(l, codes, meta, DType::F16, back, s); }, 5);
      const double packed = double(l.code_bytes() + 2 * l.meta_elems());
      rows.push_back({"quantize_4bit 16384x4096 f16", "GB/s", qms, (2.0 * N * K + packed) / qms / 1e6, copy_gbs});
      rows.push_back({"dequantize_4bit 16384x4096 f16", "GB/s", dms, (2.0 * N * K + packed) / dms / 1e6, copy_gbs});
      // Q4 records (core/quant4.h) of the same weight: the fused GEMV against dequantize +
      // cuBLAS per M (kQ4FusedMaxRows in kernels/cuda/q4.h is set from these rows: fused wins
      // while "speedup" > 1), and linear_q4's tiled prefill path against the fp16 GEMM.
      {
        uint8_t* wq = bn.alloc<uint8_t>(size_t(q4::tensor_bytes(N, K)));
        q4_encode_rows(DType::F16, w, K, N, K, wq, s);
        __half* deq = bn.alloc<__half>(size_t(N * K));
        const double q4bytes = double(q4::tensor_bytes(N, K));
        // Our row format's decode next to FlexGen's layout above (same weight, same byte count).
        const double decms = bn.time_ms([&] { q4_decode_rows(wq, N, K, DType::F16, deq, K, s); }, 5);
        rows.push_back({"q4_decode_rows 16384x4096 f16 (row format)", "GB/s", decms, (2.0 * N * K + q4bytes) / decms / 1e6,
                        copy_gbs});
        for (int64_t M : {int64_t(1), int64_t(2), int64_t(4), int64_t(8), int64_t(16), int64_t(64)}) {
          __half* x = bn.random_half(size_t(M * K), 12);
          __half* y = bn.alloc<__half>(size_t(M * N));
          const std::string m = "M" + std::to_string(M);
          const double dq = bn.time_ms([&] {
            q4_decode_rows(wq, N, K, DType::F16, deq, K, s);
            linear(bn.cublas(), DType::F16, x, M, K, deq, N, bias, y, Epilogue::kRelu, s);
          });
          rows.push_back({"q4 dequant+cuBLAS " + m + " K4096 N16384", "GB/s", dq, q4bytes / dq / 1e6, copy_gbs});
          if (M > 16) {
            // linear_q4's tiles at a batch-decode M: 64 MiB (the cap) against 8 MiB tiles that
            // stay in L2 between the decode and the GEMM (fewer HBM bytes, more cuBLAS calls).
            for (size_t tile : {size_t(64) << 20, size_t(8) << 20}) {
              void* scratch = bn.alloc<uint8_t>(tile);
              const double tm = bn.time_ms([&] {
                linear_q4(bn.cublas(), DType::F16, x, M, K, wq, N, bias, y, Epilogue::kRelu, scratch, tile, s);
              });
              rows.push_back({"linear_q4 " + m + " tiles of " + std::to_string(tile >> 20) + " MiB", "GB/s", tm,
                              q4bytes / tm / 1e6, copy_gbs});
            }
            continue;
          }
          const double fu = bn.time_ms([&] {
            q4_gemv(DType::F16, x, M, K, wq, N, bias, y, DType::F16, Epilogue::kRelu, s);
          });
          rows.push_back({"q4 fused gemv " + m + " K4096 N16384", "GB/s", fu, q4bytes / fu / 1e6, copy_gbs});
          rows.push_back({"q4 fused speedup over dequant " + m, "x", fu, dq / fu, 0});
        }
        const int64_t M = 2048;
        __half* x = bn.random_half(size_t(M * K), 13);
        __half* y = bn.alloc<__half>(size_t(M * N));
        const size_t tile = size_t(64) << 20;
        void* scratch = bn.alloc<uint8_t>(tile);
        const double pm = bn.time_ms([&] {
          linear_q4(bn.cublas(), DType::F16, x, M, K, wq, N, bias, y, Epilogue::kRelu, scratch, tile, s);
        });
        rows.push_back({"linear_q4 M2048 K4096 N16384 (64 MiB tiles)", "TFLOP/s", pm, 2.0 * M * N * K / pm / 1e9, gemm_tf});
      }
      // layernorm over a 2048 x 4096 activation
      __half* x = bn.random_half(size_t(2048 * K), 10);
      __half* g = bn.random_half(size_t(K), 11);
      const double lms = bn.time_ms([&] { layernorm(DType::F16, x, 2048, K, g, g, 1e-5f, x, s); });
      rows.push_back({"layernorm 2048x4096 f16 (in place)", "GB/s", lms, 2.0 * 2 * 2048 * K / lms / 1e6, copy_gbs});
    }

    // ---- JSON, then the table last
    if (!json_path.empty()) {
      FILE* f = std::fopen(json_path.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "bench_gpu: cannot write %s\n", json_path.c_str());
        return 1;
      }
      std::fprintf(f, "{\n  \"device\": \"%s\", \"cc\": \"%d.%d\", \"memory_bytes\": %zu,\n  \"rows\": [\n",
                   p.device_name.c_str(), p.cc_major, p.cc_minor, p.total_memory);
      for (size_t i = 0; i < rows.size(); ++i)
        std::fprintf(f, "    {\"name\": \"%s\", \"ms\": %.5f, \"value\": %.3f, \"unit\": \"%s\", \"ceiling\": %.3f}%s\n",
                     rows[i].name.c_str(), rows[i].ms, rows[i].value, rows[i].unit.c_str(), rows[i].ceiling,
                     i + 1 < rows.size() ? "," : "");
      std::fprintf(f, "  ]\n}\n");
      std::fclose(f);
    }
    std::printf("\nbench_gpu on %s (cc %d.%d)\n", p.device_name.c_str(), p.cc_major, p.cc_minor);
    std::printf("%-46s %10s %12s %8s %9s\n", "what", "ms", "value", "unit", "%ceiling");
    for (const Row& r : rows)
      std::printf("%-46s %10.4f %12.2f %8s %9s\n", r.name.c_str(), r.ms, r.value, r.unit.c_str(),
                  r.ceiling > 0 ? std::to_string(int(100.0 * r.value / r.ceiling + 0.5)).c_str() : "-");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
