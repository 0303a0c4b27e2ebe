// ops.h (linear, embeddings, scale, norms (Gemma's too), rotary, silu_mul, gelu_tanh_mul, softcap_f32, the MoE ops)
// against kernels/cpu on random inputs, for F16 and BF16 and awkward shapes (1, primes, non-multiples of 8/16). The CPU
// reference gets the same dt-rounded inputs; tolerances cover the fp16/bf16 rounding of the output.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda/ops.h"
#include "util.h"

namespace flexh2o::gpu::test {
namespace {

// A dt-rounded host tensor and a view of its dt bits (for the CPU ops' weight arguments).
struct HostT {
  std::vector<float> f;
  std::vector<uint16_t> bits;
  TensorView view;
};
HostT host_tensor(DType dt, std::vector<int64_t> shape, uint32_t seed, float scale = 1.f) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  HostT t;
  t.f = round_to(randn(size_t(n), seed, scale), dt);
  t.bits = to_bits(t.f, dt);
  t.view.data = t.bits.data();
  t.view.dtype = dt;
  t.view.shape.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.view.shape.dims[i] = shape[i];
  return t;
}

class OpsGpu : public GpuTest, public ::testing::WithParamInterface<DType> {};

TEST_P(OpsGpu, LinearAllEpiloguesMatchCpu) {
  const DType dt = GetParam();
  CublasHandle cublas;
  for (auto [M, K, N] : {std::tuple{1, 1, 1}, {3, 17, 5}, {7, 64, 33}, {13, 257, 31}, {64, 128, 96}}) {
    const float ws = 1.f / std::sqrt(float(K));
    HostT x = host_tensor(dt, {M, K}, 1, 1.f), w = host_tensor(dt, {N, K}, 2, ws), b = host_tensor(dt, {N}, 3);
    HostT y0 = host_tensor(dt, {M, N}, 4);
    void* dx = upload(x.f, dt);
    void* dw = upload(w.f, dt);
    void* db = upload(b.f, dt);
    for (cpu::Epilogue ep : {cpu::Epilogue::kStore, cpu::Epilogue::kRelu, cpu::Epilogue::kAccumulate})
      for (bool bias : {false, true}) {
        std::vector<float> ref = y0.f;
        cpu::linear(x.f.data(), M, K, w.view, bias ? &b.view : nullptr, ref.data(), ep);
        void* dy = upload(y0.f, dt);
        linear(cublas, dt, dx, M, K, dw, N, bias ? db : nullptr, dy, static_cast<Epilogue>(int(ep)), stream());
        const std::string what = std::string("linear ") + dt_str(dt) + " M=" + std::to_string(M) + " K=" +
                                 std::to_string(K) + " N=" + std::to_string(N) + " ep=" +
                                 std::to_string(int(ep)) + " bias=" + std::to_string(bias);
        // kAccumulate rounds twice (GEMM into y, then + bias): allow two output roundings.
        const Tol t = tol_for(dt, ep == cpu::Epilogue::kAccumulate ? 2.f : 1.f);
        expect_close(download(dy, size_t(M * N), dt), ref, {t.atol, 2 * t.rtol}, what);
      }
  }
}

TEST_P(OpsGpu, LinearWithFp32OutputMatchesCpu) {
  const DType dt = GetParam();
  CublasHandle cublas;
  for (auto [M, K, N] : {std::tuple{1, 1, 1}, {3, 17, 5}, {13, 257, 4099}}) {
    HostT x = host_tensor(dt, {M, K}, 7), w = host_tensor(dt, {N, K}, 8, 1.f / std::sqrt(float(K)));
    std::vector<float> ref(size_t(M * N));
    cpu::linear(x.f.data(), M, K, w.view, nullptr, ref.data(), cpu::Epilogue::kStore);
    float* dy = alloc<float>(ref.size());
    linear_f32out(cublas, dt, upload(x.f, dt), M, K, upload(w.f, dt), N, dy, stream());
    // fp32 output: only the accumulation order differs from the CPU.
    expect_close(download_raw(dy, ref.size()), ref, {1e-4f, 1e-4f},
                 std::string("linear_f32out ") + dt_str(dt) + " N=" + std::to_string(N));
  }
}

TEST_P(OpsGpu, EmbeddingAndPositionsMatchCpu) {
  const DType dt = GetParam();
  const int64_t V = 37;
  for (int64_t D : {1, 13, 96})
    for (int64_t T : {1, 7}) {
      HostT table = host_tensor(dt, {V, D}, 5), pos = host_tensor(dt, {V, D}, 6);
      std::vector<int32_t> ids(static_cast<size_t>(T)), rows(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        ids[size_t(t)] = int32_t((t * 11 + 3) % V);
        rows[size_t(t)] = int32_t(t + 2);
      }
      std::vector<float> ref(size_t(T * D));
      cpu::embedding(ids.data(), T, table.view, ref.data());
      void* out = alloc<uint16_t>(size_t(T * D));
      embedding(dt, upload_raw(ids), T, upload(table.f, dt), V, D, out, stream());
      expect_close(download(out, ref.size(), dt), ref, {0.f, 0.f}, "embedding (exact copy)");
      cpu::add_embedding(rows.data(), T, pos.view, ref.data());
      add_embedding(dt, upload_raw(rows), T, upload(pos.f, dt), V, D, out, stream());
      expect_close(download(out, ref.size(), dt), ref, tol_for(dt, 2.f), "add_embedding");
    }
}

TEST_P(OpsGpu, EmbeddingOutOfRangeIdGivesZeroRow) {
  const DType dt = GetParam();
  HostT table = host_tensor(dt, {5, 3}, 7);
  void* out = upload(std::vector<float>(6, 1.f), dt);
  embedding(dt, upload_raw(std::vector<int32_t>{-1, 5}), 2, upload(table.f, dt), 5, 3, out, stream());
  for (float v : download(out, 6, dt)) EXPECT_EQ(v, 0.f);
}

TEST_P(OpsGpu, NormsMatchCpu) {
  const DType dt = GetParam();
  for (int64_t M : {1, 5, 33})
    for (int64_t D : {1, 7, 100, 769}) {
      HostT x = host_tensor(dt, {M, D}, 8, 3.f), g = host_tensor(dt, {D}, 9), b = host_tensor(dt, {D}, 10);
      for (auto& v : x.f) v += 0.5f;  // nonzero mean (values stay as uploaded: re-round below)
      x.f = round_to(x.f, dt);
      const std::string sh = std::string(dt_str(dt)) + " M=" + std::to_string(M) + " D=" + std::to_string(D);
      std::vector<float> ref(x.f.size());
      cpu::layernorm(x.f.data(), M, D, g.view, b.view, 1e-5f, ref.data());
      void* dx = upload(x.f, dt);
      layernorm(dt, dx, M, D, upload(g.f, dt), upload(b.f, dt), 1e-5f, dx, stream());  // in place
      // |y| grows with |gamma| ~ 3: scale the absolute tolerance.
      expect_close(download(dx, ref.size(), dt), ref, tol_for(dt, 4.f), "layernorm " + sh);
      cpu::rmsnorm(x.f.data(), M, D, g.view, 1e-6f, ref.data());
      void* dy = alloc<uint16_t>(x.f.size());
      rmsnorm(dt, upload(x.f, dt), M, D, upload(g.f, dt), 1e-6f, dy, stream());
      expect_close(download(dy, ref.size(), dt), ref, tol_for(dt, 4.f), "rmsnorm " + sh);
      // Gemma: times 1 + gamma, and y += norm(x) rounded once
      cpu::rmsnorm(x.f.data(), M, D, g.view, 1e-6f, ref.data(), 1.f);
      rmsnorm(dt, upload(x.f, dt), M, D, upload(g.f, dt), 1e-6f, dy, stream(), 1.f);
      expect_close(download(dy, ref.size(), dt), ref, tol_for(dt, 4.f), "rmsnorm offset 1 " + sh);
      HostT acc = host_tensor(dt, {M, D}, 11);
      std::vector<float> sum = acc.f;
      cpu::rmsnorm_add(x.f.data(), M, D, g.view, 1e-6f, 1.f, sum.data());
      void* da = upload(acc.f, dt);
      rmsnorm_add(dt, upload(x.f, dt), M, D, upload(g.f, dt), 1e-6f, 1.f, da, stream());
      expect_close(download(da, sum.size(), dt), sum, tol_for(dt, 4.f), "rmsnorm_add " + sh);
    }
}

TEST_P(OpsGpu, RotaryMatchesCpuWithRowStride) {
  const DType dt = GetParam();
  for (int64_t T : {1, 5})
    for (int64_t H : {1, 3})
      for (int64_t hd : {2, 6, 64})
        for (int64_t rd : {hd, hd > 2 ? hd - 2 : hd}) {  // whole head, and partial rotary
          const int64_t stride = H * hd + 3;
          HostT x = host_tensor(dt, {T, stride}, 11);
          std::vector<int32_t> pos(static_cast<size_t>(T));
          for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t * 97 + 1);
          std::vector<double> inv(size_t(rd / 2));  // a scaled rope's arbitrary frequencies
          for (size_t i = 0; i < inv.size(); ++i) inv[i] = 0.8 / double(1 + 5 * ((i * 3) % inv.size()));
          std::vector<float> ref = x.f;
          cpu::rotary(ref.data(), T, H, hd, stride, pos.data(), inv.data(), rd, 1.1f);
          void* dx = upload(x.f, dt);
          rotary(dt, dx, T, H, hd, stride, upload_raw(pos), rotary_table(inv.data(), rd / 2, 1.1f), stream());
          expect_close(download(dx, ref.size(), dt), ref, tol_for(dt),
                       std::string("rotary ") + dt_str(dt) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
                           " hd=" + std::to_string(hd) + " rd=" + std::to_string(rd));
        }
}

TEST_P(OpsGpu, SiluMulMatchesCpu) {
  const DType dt = GetParam();
  for (int64_t n : {1, 31, 1000}) {
    HostT g = host_tensor(dt, {n}, 12, 3.f), u = host_tensor(dt, {n}, 13);
    std::vector<float> ref = g.f;
    cpu::silu_mul(ref.data(), u.f.data(), n);
    void* dg = upload(g.f, dt);
    silu_mul(dt, dg, upload(u.f, dt), n, stream());
    expect_close(download(dg, ref.size(), dt), ref, tol_for(dt), "silu_mul n=" + std::to_string(n));
  }
}

TEST_P(OpsGpu, GeluTanhMulScaleAndSoftcapMatchCpu) {
  const DType dt = GetParam();
  for (int64_t n : {1, 31, 1000}) {
    HostT g = host_tensor(dt, {n}, 14, 3.f), u = host_tensor(dt, {n}, 15);
    std::vector<float> ref = g.f;
    cpu::gelu_tanh_mul(ref.data(), u.f.data(), n);
    void* dg = upload(g.f, dt);
    gelu_tanh_mul(dt, dg, upload(u.f, dt), n, stream());
    expect_close(download(dg, ref.size(), dt), ref, tol_for(dt), "gelu_tanh_mul n=" + std::to_string(n));
    ref = g.f;
    for (float& v : ref) v *= 59.75f;
    void* ds = upload(g.f, dt);
    scale(dt, ds, n, 59.75f, stream());
    expect_close(download(ds, ref.size(), dt), ref, tol_for(dt, 60.f), "scale n=" + std::to_string(n));
    std::vector<float> logits = randn(size_t(n), 16, 40.f), capped = logits;
    cpu::softcap(capped.data(), n, 30.f);
    float* dl = upload_raw(logits);
    softcap_f32(dl, n, 30.f, stream());
    expect_close(download_raw(dl, capped.size()), capped, {1e-5f, 1e-5f}, "softcap_f32 n=" + std::to_string(n));
  }
}

// Routing: cpu::moe_route's experts (random logits: no near ties) and weights within fp32
// rounding. Grouping: each expert's group holds exactly the (row, weight) pairs that chose it.
// Scatter-add over every group and a gated shared expert, then one rounding into the hidden
// rows, against the CPU sum.
TEST_P(OpsGpu, MoeRouteGroupAndScatterMatchCpu) {
  const DType dt = GetParam();
  for (auto [M, E, k] : {std::tuple{1, 1, 1}, {37, 4, 2}, {37, 8, 2}, {5, 128, 8}, {19, 13, 13}, {600, 64, 6}})
    for (bool normalize : {false, true}) {
      const std::string what = std::string("moe ") + dt_str(dt) + " M=" + std::to_string(M) +
                               " E=" + std::to_string(E) + " k=" + std::to_string(k) +
                               " norm=" + std::to_string(normalize);
      const std::vector<float> logits = randn(size_t(M * E), 20, 2.f);
      std::vector<int32_t> ex(size_t(M * k));
      std::vector<float> wk(size_t(M * k));
      cpu::moe_route(logits.data(), M, E, k, normalize, ex.data(), wk.data());
      int32_t* dex = alloc<int32_t>(ex.size());
      float* dwk = alloc<float>(wk.size());
      moe_route(upload_raw(logits), M, E, k, normalize, dex, dwk, stream());
      ASSERT_EQ(download_raw(dex, ex.size()), ex) << what;
      expect_close(download_raw(dwk, wk.size()), wk, {1e-7f, 1e-5f}, what + " weights");

      int32_t* counts = alloc<int32_t>(size_t(E));
      int32_t* work = alloc<int32_t>(size_t(2 * E));
      int32_t* rows = alloc<int32_t>(ex.size());
      float* row_w = alloc<float>(ex.size());
      moe_group(dex, dwk, M, k, E, counts, work, rows, row_w, stream());
      const std::vector<int32_t> got_counts = download_raw(counts, size_t(E)), got_rows = download_raw(rows, ex.size());
      const std::vector<float> got_w = download_raw(row_w, ex.size());
      const std::vector<float> dev_w = download_raw(dwk, wk.size());
      int64_t at = 0;
      for (int64_t e = 0; e < E; ++e) {
        std::vector<std::pair<int32_t, float>> want, got;
        for (int64_t i = 0; i < M * k; ++i)
          if (ex[size_t(i)] == e) want.push_back({int32_t(i / k), dev_w[size_t(i)]});
        ASSERT_EQ(got_counts[size_t(e)], int32_t(want.size())) << what << " expert " << e;
        for (int64_t g = 0; g < int64_t(want.size()); ++g)
          got.push_back({got_rows[size_t(at + g)], got_w[size_t(at + g)]});
        std::sort(got.begin(), got.end());
        ASSERT_EQ(got, want) << what << " expert " << e;
        at += int64_t(want.size());
      }

      const int64_t H = 24;
      HostT y = host_tensor(dt, {M * k, H}, 21), x = host_tensor(dt, {M, H}, 22);
      std::vector<float> ref = x.f;
      std::vector<float> sum(size_t(M * H), 0.f);
      for (int64_t g = 0; g < M * k; ++g)
        for (int64_t d = 0; d < H; ++d)
          sum[size_t(got_rows[size_t(g)] * H + d)] += got_w[size_t(g)] * y.f[size_t(g * H + d)];
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += sum[i];
      float* dsum = upload_raw(std::vector<float>(size_t(M * H), 0.f));
      const std::byte* dy = static_cast<const std::byte*>(upload(y.f, dt));
      at = 0;
      for (int64_t e = 0; e < E; ++e) {  // one call a group, as the device runs them
        const int64_t n = got_counts[size_t(e)];
        moe_scatter_add(dt, dy + size_t(at * H) * dtype_size(dt), rows + at, row_w + at, n, H, dsum, stream());
        at += n;
      }
      // Qwen2-MoE's shared expert: sum[r, :] += sigmoid(gate[r]) * shared[r, :].
      HostT shared = host_tensor(dt, {M, H}, 24);
      const std::vector<float> gate = randn(size_t(M), 25, 3.f);
      for (int64_t r = 0; r < M; ++r)
        for (int64_t d = 0; d < H; ++d)
          ref[size_t(r * H + d)] += shared.f[size_t(r * H + d)] / (1.f + std::exp(-gate[size_t(r)]));
      moe_gated_add(dt, upload(shared.f, dt), upload_raw(gate), M, H, dsum, stream());
      void* dx = upload(x.f, dt);
      add_f32(dt, dx, dsum, M * H, stream());
      expect_close(download(dx, ref.size(), dt), ref, tol_for(dt, 2.f), what + " scatter-add and shared expert");
    }
  EXPECT_THROW(moe_route(nullptr, 1, 4, 5, true, nullptr, nullptr, stream()), Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OpsGpu, ::testing::Values(DType::F16, DType::BF16),
                         [](const auto& i) { return std::string(dt_str(i.param)); });

}  // namespace
}  // namespace flexh2o::gpu::test
