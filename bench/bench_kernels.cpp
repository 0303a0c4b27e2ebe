// bench_kernels: CPU kernels at OPT-125M / OPT-1.3B layer shapes against the machine's
// ceilings. linear with f16 weights: decode M=1/8/64 as GB/s of weight bytes vs the read
// bandwidth (weights rotated through > L3 so they come from DRAM), prefill M=512/2048 as
// GFLOP/s vs OpenBLAS sgemm; attention prefill/decode times; decode attention over an fp32
// vs an f16 vs a Q4 KV cache (GB/s of K/V bytes vs the read bandwidth). --case q4: linear with Q4
// weights (core/quant4.h) decoded inside the kernel vs f16 weights vs FlexGen's way
// (dequantize the weight to fp32, then the fp32 linear), at OPT-1.3B shapes.
// Usage: bench_kernels [--json FILE] [--kv-only | --case q4]
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ceilings.h"
#include "core/dtype.h"
#include "core/quant4.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace {

using namespace flexh2o;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Model {
  const char* name;
  int64_t hidden, ffn, heads;
};

std::vector<uint16_t> random_f16(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 0.02f);
  std::vector<uint16_t> v(n);
  for (auto& h : v) h = f32_to_f16(d(g));
  return v;
}

// Decode attention (tq = 1, no key scores) of B sequences of n_keys cached tokens, K/V in
// `dt`. Each call reads the next of several cache copies (>= 1 GiB in all), so K/V come
// from DRAM, as they do for a real batch.
struct DecodeKv {
  int64_t B, H, KV, d, n_keys;
  DType dt;
  size_t bytes = 0, copies = 0, next = 0;  // bytes: of K (and again of V) per call
  std::vector<uint8_t> k, v;
  std::vector<float> q, o;
  std::vector<int32_t> seq_keys;
  cpu::AttentionArgs a;

  DecodeKv(int64_t B_, int64_t H_, int64_t KV_, int64_t d_, int64_t n_, DType dt_)
      : B(B_), H(H_), KV(KV_), d(d_), n_keys(n_), dt(dt_) {
    const size_t rows = size_t(B * KV * n_keys), rb = row_nbytes(dt, d), elems = rows * size_t(d);
    bytes = rows * rb;
    copies = std::max<size_t>(2, ((size_t(1) << 30) + 2 * bytes - 1) / (2 * bytes));
    std::vector<float> pattern(size_t(1) << 20);
    std::mt19937 g(5);
    std::normal_distribution<float> nd;
    for (auto& x : pattern) x = nd(g);
    k.resize(bytes * copies);
    v.resize(bytes * copies);
    const size_t prow = pattern.size() / size_t(d);  // pattern rows per fill step
    for (size_t r = 0; dt == DType::Q4 && r < rows * copies; r += prow) {
      const int64_t n = int64_t(std::min(prow, rows * copies - r));
      q4::encode_rows(pattern.data(), d, n, d, k.data() + r * rb, "bench K");
      q4::encode_rows(pattern.data(), d, n, d, v.data() + r * rb, "bench V");
    }
    for (size_t off = 0; dt != DType::Q4 && off < elems * copies; off += pattern.size()) {
      const int64_t n = int64_t(std::min(pattern.size(), elems * copies - off));
      cpu::from_f32(pattern.data(), n, dt, k.data() + off * rb / size_t(d));
      cpu::from_f32(pattern.data(), n, dt, v.data() + off * rb / size_t(d));
    }
    q.assign(pattern.begin(), pattern.begin() + B * H * d);
    o.resize(q.size());
    seq_keys.assign(size_t(B), int32_t(n_keys));
    a.q = q.data();
    a.q_stride = H * d;
    a.kv_dtype = dt;
    a.batch = B;
    a.tq = 1;
    a.n_heads = H;
    a.kv_heads = KV;
    a.head_dim = d;
    a.capacity = n_keys;
    a.seq_keys = seq_keys.data();
    a.scale = 1.f / std::sqrt(float(d));
    a.out = o.data();
    a.out_stride = H * d;
  }
  // Seconds per call, averaged over one pass through all copies (at least 4 calls).
  double time_pass() {
    const size_t calls = std::max<size_t>(copies, 4);
    const auto t0 = Clock::now();
    for (size_t c = 0; c < calls; ++c, ++next) {
      a.k = k.data() + bytes * (next % copies);
      a.v = v.data() + bytes * (next % copies);
      cpu::attention(a);
    }
    return seconds_since(t0) / double(calls);
  }
};

// Linear with Q4 weights against f16 weights and against dequantize-then-fp32-linear, at
// OPT-1.3B shapes. Each variant reads the next of several weight copies (> 640 MB in all) in
// decode, as a layer's weights come from DRAM; the three alternate per round (best of 4).
void bench_q4(nlohmann::json& out) {
  std::printf("linear, Q4 weights (groups of 64 along K) vs f16 vs dequantize+fp32 (FlexGen)\n");
  std::printf("%-11s %5s | %8s %8s %8s | %7s %7s %7s | %7s %7s\n", "KxN", "M", "f16 ms", "q4 ms", "deq ms",
              "f16 GB/s", "q4 GB/s", "deq", "q4/f16", "q4/deq");
  const std::pair<int64_t, int64_t> shapes[] = {{2048, 2048}, {2048, 8192}, {8192, 2048}};
  for (auto [K, N] : shapes) {
    const size_t f16_bytes = size_t(K * N) * 2, q4_bytes = size_t(q4::tensor_bytes(N, K));
    const size_t copies16 = std::max<size_t>(1, (size_t(640) << 20) / f16_bytes);
    const size_t copies4 = std::max<size_t>(1, (size_t(640) << 20) / q4_bytes);
    const auto w16 = random_f16(size_t(K * N) * copies16, 1);
    std::vector<uint8_t> w4(q4_bytes * copies4);
    q4::encode_rows_f16(w16.data(), K, N, K, w4.data(), "bench weight");
    for (size_t c = 1; c < copies4; ++c) std::memcpy(w4.data() + c * q4_bytes, w4.data(), q4_bytes);
    std::vector<float> deq(size_t(K * N));
    for (int64_t M : {1, 8, 32, 512}) {
      std::vector<float> x(size_t(M * K), 0.01f), y(size_t(M * N));
      const bool decode = M <= 64;
      size_t next16 = 0, next4 = 0, nextd = 0;
      auto f16 = [&] {
        TensorView tv{w16.data() + size_t(K * N) * (decode ? next16++ % copies16 : 0), DType::F16, Shape{N, K}};
        cpu::linear(x.data(), M, K, tv, nullptr, y.data(), cpu::Epilogue::kStore);
      };
      auto fused = [&] {
        TensorView tv{w4.data() + q4_bytes * (decode ? next4++ % copies4 : 0), DType::Q4, Shape{N, K}};
        cpu::linear(x.data(), M, K, tv, nullptr, y.data(), cpu::Epilogue::kStore);
      };
      auto materialise = [&] {
        cpu::decode_q4(w4.data() + q4_bytes * (decode ? nextd++ % copies4 : 0), N, K, deq.data(), K);
        TensorView tv{deq.data(), DType::F32, Shape{N, K}};
        cpu::linear(x.data(), M, K, tv, nullptr, y.data(), cpu::Epilogue::kStore);
      };
      auto time = [&](auto& f, size_t calls) {
        const auto t0 = Clock::now();
        for (size_t c = 0; c < calls; ++c) f();
        return seconds_since(t0) / double(calls);
      };
      const size_t calls16 = decode ? copies16 : 1, calls4 = decode ? copies4 : 1;
      f16(), fused(), materialise();  // warm-up
      double b16 = 1e30, b4 = 1e30, bd = 1e30;
      for (int r = 0; r < 4; ++r) {
        b16 = std::min(b16, time(f16, calls16));
        b4 = std::min(b4, time(fused, calls4));
        bd = std::min(bd, time(materialise, std::min<size_t>(calls4, 8)));
      }
      const double g16 = double(f16_bytes) / b16 / 1e9, g4 = double(q4_bytes) / b4 / 1e9,
                   gd = double(q4_bytes) / bd / 1e9;
      std::printf("%5lldx%-5lld %5lld | %8.3f %8.3f %8.3f | %7.1f %7.1f %7.1f | %6.2fx %6.2fx\n", (long long)K,
                  (long long)N, (long long)M, b16 * 1e3, b4 * 1e3, bd * 1e3, g16, g4, gd, b16 / b4, bd / b4);
      out["linear_q4"].push_back({{"K", K}, {"N", N}, {"M", M}, {"f16_ms", b16 * 1e3}, {"q4_ms", b4 * 1e3},
                                  {"dequant_f32_ms", bd * 1e3}, {"f16_gbs", g16}, {"q4_gbs", g4},
                                  {"speedup_vs_f16", b16 / b4}, {"speedup_vs_dequant", bd / b4},
                                  {"gflops_q4", 2.0 * M * K * N / b4 / 1e9}});
    }
  }
  std::printf("  (GB/s: bytes of the weight as stored per second: f16 2 B/element, Q4 %.4f B/element;\n"
              "   q4/f16, q4/deq: time ratios, > 1 means the fused Q4 kernel is faster)\n",
              double(q4::row_bytes(2048)) / 2048);
}

}  // namespace

int main(int argc, char** argv) {
  bench::ensure_openblas_coretype(argv);
  std::string json_path;
  bool kv_only = false, q4_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    if (std::strcmp(argv[i], "--kv-only") == 0) kv_only = true;
    if (std::strcmp(argv[i], "--case") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "q4") == 0) q4_only = true;
  }
  const int threads = tbb::info::default_concurrency();
  std::printf("machine: %s\n", bench::machine_info().c_str());
  // The machine may be shared: ceilings are re-measured after the kernels, and the larger
  // value is kept (ratios are then conservative).
  double sgemm = kv_only || q4_only ? 0 : bench::measure_sgemm_gflops(threads);  // 0: not measured
  double bw = bench::measure_read_bandwidth_gbs(threads);
  if (kv_only || q4_only)
    std::printf("ceiling: read bandwidth %.1f GB/s (%d threads)\n\n", bw, threads);
  else
    std::printf("ceilings: OpenBLAS sgemm %.1f GFLOP/s (%d threads), read bandwidth %.1f GB/s\n\n",
                sgemm, threads, bw);
  nlohmann::json out = {{"machine", bench::machine_info()}, {"cpu_isa", cpu::cpu_isa_name()},
                        {"threads", threads}, {"sgemm_gflops", sgemm}, {"read_bw_gbs", bw}};
  if (q4_only) {
    bench_q4(out);
    bw = std::max(bw, bench::measure_read_bandwidth_gbs(threads));
    out["read_bw_gbs"] = bw;
    std::printf("read bandwidth (max of before/after): %.1f GB/s; q4 GB/s / read BW:", bw);
    for (auto& l : out["linear_q4"]) {
      l["q4_vs_read_bw"] = l["q4_gbs"].get<double>() / bw;
      l["f16_vs_read_bw"] = l["f16_gbs"].get<double>() / bw;
      if (l["M"].get<int64_t>() <= 64) std::printf(" %.0f%%", 100 * l["q4_gbs"].get<double>() / bw);
    }
    std::printf(" (M <= 64)\n");
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    return 0;
  }

  // Decode attention over an fp32 vs an f16 vs a Q4 KV cache: MHA (LLaMA-7B / OPT-6.7B heads)
  // and GQA 4:1. The dtypes' passes alternate (best of 5 each), so load from other users of
  // a shared machine falls on all alike.
  std::printf("decode attention, tq=1:  %3s %5s %4s %5s %5s %9s %9s %8s\n", "B", "heads", "kv", "d",
              "keys", "ms", "KV GB/s", "vs f32");
  for (auto [B, H, KV] : {std::tuple<int64_t, int64_t, int64_t>{8, 32, 32}, {8, 32, 8}}) {
    const int64_t d = 128, n_keys = 2048;
    DecodeKv f32(B, H, KV, d, n_keys, DType::F32), f16(B, H, KV, d, n_keys, DType::F16),
        q4(B, H, KV, d, n_keys, DType::Q4);
    DecodeKv* const cases[3] = {&f32, &f16, &q4};
    double best[3] = {1e30, 1e30, 1e30};
    for (DecodeKv* c : cases) c->time_pass();  // warm-up
    for (int r = 0; r < 5; ++r)
      for (int i = 0; i < 3; ++i) best[i] = std::min(best[i], cases[i]->time_pass());
    const double best32 = best[0];
    for (int i = 0; i < 3; ++i) {
      const DecodeKv* c = cases[i];
      const double s_call = best[i], gbs = 2.0 * double(c->bytes) / s_call / 1e9;
      std::printf("  %-3s KV cache            %3lld %5lld %4lld %5lld %5lld %9.3f %9.1f %7.2fx\n",
                  std::string(dtype_name(c->dt)).c_str(), (long long)B, (long long)H, (long long)KV,
                  (long long)d, (long long)n_keys, s_call * 1e3, gbs, s_call / best32);
      out["decode_attention_kv"].push_back(
          {{"batch", B}, {"heads", H}, {"kv_heads", KV}, {"head_dim", d}, {"n_keys", n_keys},
           {"kv_dtype", std::string(dtype_name(c->dt))}, {"ms", s_call * 1e3}, {"kv_gbs", gbs},
           {"time_vs_f32", s_call / best32}});
    }
  }
  std::printf("  (KV GB/s: bytes of K and V as stored read per second; vs f32: time ratio)\n\n");
  if (kv_only) {
    bw = std::max(bw, bench::measure_read_bandwidth_gbs(threads));
    out["read_bw_gbs"] = bw;
    std::printf("read bandwidth (max of before/after): %.1f GB/s\n", bw);
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    return 0;
  }

  const Model models[] = {{"opt-125m", 768, 3072, 12}, {"opt-1.3b", 2048, 8192, 32}};
  std::printf("%-9s %-14s %5s %8s %8s %10s\n", "model", "linear KxN", "M", "GB/s", "GFLOP/s", "ms");
  for (const Model& md : models) {
    const std::pair<int64_t, int64_t> shapes[] = {
        {md.hidden, md.hidden}, {md.hidden, md.ffn}, {md.ffn, md.hidden}};
    double layer_linear_ms_2048 = 0;
    for (auto [K, N] : shapes) {
      const size_t wbytes = size_t(K * N) * 2;
      // Enough distinct copies that a pass through them does not fit in the L3.
      const size_t copies = std::max<size_t>(1, (size_t(640) << 20) / wbytes);
      const auto w = random_f16(size_t(K * N) * copies, 1);
      for (int64_t M : {1, 8, 64, 512, 2048}) {
        std::vector<float> x(size_t(M * K), 0.01f), y(size_t(M * N));
        const bool decode = M <= 64;
        const size_t ncopy = decode ? copies : 1;
        auto run = [&](size_t c) {
          TensorView tv{w.data() + size_t(K * N) * (c % ncopy), DType::F16, Shape{N, K}};
          cpu::linear(x.data(), M, K, tv, nullptr, y.data(), cpu::Epilogue::kStore);
        };
        run(0);  // warm-up
        double best = 1e30;
        const int reps = decode ? 3 : (M == 2048 && K * N > (int64_t(1) << 24) ? 2 : 3);
        for (int r = 0; r < reps; ++r) {
          const size_t calls = decode ? ncopy : 1;
          const auto t0 = Clock::now();
          for (size_t c = 0; c < calls; ++c) run(c + 1);
          best = std::min(best, seconds_since(t0) / double(calls));
        }
        const double gbs = double(wbytes) / best / 1e9, gflops = 2.0 * M * K * N / best / 1e9;
        if (M == 2048) layer_linear_ms_2048 += best * 1e3 * (K == N ? 2 : 1);  // q,k,v,out: 4 K=N
        std::printf("%-9s %5lldx%-8lld %5lld %8.1f %8.1f %10.3f\n", md.name, (long long)K,
                    (long long)N, (long long)M, gbs, gflops, best * 1e3);
        out["linear"].push_back({{"model", md.name}, {"K", K}, {"N", N}, {"M", M},
                                 {"ms", best * 1e3}, {"gbs", gbs}, {"gflops", gflops}});
      }
    }
    // Attention: one layer, B=1, 2048-token prefill with H2O key scores, and a decode step.
    const int64_t d = 64, H = md.heads, T = 2048, cap = 2304;
    std::vector<float> q(size_t(T * H * d), 0.1f), kc(size_t(H * cap * d)), vc(size_t(H * cap * d)),
        o(size_t(T * H * d)), ks(size_t(H * cap));
    std::mt19937 g(3);
    std::normal_distribution<float> nd;
    for (auto& v : kc) v = nd(g);
    for (auto& v : vc) v = nd(g);
    for (auto& v : q) v = nd(g);
    const int32_t seq_keys = int32_t(T);  // left-aligned cache: T filled slots
    for (int64_t tq : {T, int64_t(1)}) {
      cpu::AttentionArgs a;
      a.q = q.data();
      a.q_stride = H * d;
      a.k = kc.data();
      a.v = vc.data();
      a.batch = 1;
      a.tq = tq;
      a.n_heads = H;
      a.kv_heads = H;
      a.head_dim = d;
      a.capacity = cap;
      a.seq_keys = &seq_keys;
      a.scale = 0.125f;
      a.out = o.data();
      a.out_stride = H * d;
      a.key_scores = ks.data();
      cpu::attention(a);
      double best = 1e30;
      for (int r = 0; r < (tq == 1 ? 20 : 3); ++r) {
        const auto t0 = Clock::now();
        cpu::attention(a);
        best = std::min(best, seconds_since(t0));
      }
      const double keys = tq == 1 ? double(T) : double(T) * (T + 1) / 2;
      const double gflops = 4.0 * keys * d * H / best / 1e9;
      std::printf("%-9s attention %s tq=%lld keys=%lld: %.3f ms, %.1f GFLOP/s%s\n", md.name,
                  tq == 1 ? "decode " : "prefill", (long long)tq, (long long)T, best * 1e3, gflops,
                  tq == 1 ? "" : ("  (" + std::to_string(int(100 * best * 1e3 / layer_linear_ms_2048)) +
                                  "% of the layer's linear time at M=2048)").c_str());
      out["attention"].push_back({{"model", md.name}, {"tq", tq}, {"n_keys", T}, {"heads", H},
                                  {"head_dim", d}, {"ms", best * 1e3}, {"gflops", gflops},
                                  {"layer_linear_ms_m2048", layer_linear_ms_2048}});
    }
    std::printf("\n");
  }
  sgemm = std::max(sgemm, bench::measure_sgemm_gflops(threads));
  bw = std::max(bw, bench::measure_read_bandwidth_gbs(threads));
  std::printf("ceilings (max of before/after): sgemm %.1f GFLOP/s, read %.1f GB/s\n", sgemm, bw);
  out["sgemm_gflops"] = sgemm;
  out["read_bw_gbs"] = bw;
  std::printf("\n%-9s %-14s %5s %9s   (decode M<=64: GB/s of f16 weights / read BW; "
              "prefill: GFLOP/s / sgemm)\n", "model", "linear KxN", "M", "ratio");
  for (auto& l : out["linear"]) {
    const bool decode = l["M"].get<int64_t>() <= 64;
    const double ratio = decode ? l["gbs"].get<double>() / bw : l["gflops"].get<double>() / sgemm;
    l["ratio"] = ratio;
    l["vs"] = decode ? "read_bw" : "sgemm";
    std::printf("%-9s %5lldx%-8lld %5lld %8.0f%%\n", l["model"].get<std::string>().c_str(),
                (long long)l["K"].get<int64_t>(), (long long)l["N"].get<int64_t>(),
                (long long)l["M"].get<int64_t>(), ratio * 100);
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << out.dump(2) << "\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
