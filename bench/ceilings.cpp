// GEMM and memory-bandwidth ceilings for the benchmarks (see ceilings.h). OpenBLAS is used
// here only as a yardstick; the engine never links it.
#include "ceilings.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <unistd.h>
#include <vector>

#include "kernels/cpu/isa.h"

namespace flexh2o::bench {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__attribute__((target("avx2"))) float sum_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float f[8];
  _mm256_store_ps(f, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float v : f) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}

float sum_plain(const float* p, size_t n) {
  float s[4] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) s[l] += p[i + l];
  for (; i < n; ++i) s[0] += p[i];
  return s[0] + s[1] + s[2] + s[3];
}

}  // namespace

extern "C" char* openblas_get_corename(void);

std::string openblas_core() { return openblas_get_corename(); }

void ensure_openblas_coretype(char** argv) {
  if (openblas_core() != "Prescott" || std::getenv("OPENBLAS_CORETYPE")) return;
  const char* core = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                     : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                       : nullptr;
  if (!core) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  execv("/proc/self/exe", argv);  // returns only on failure: keep the fallback core
}

double measure_sgemm_gflops(int threads) {
  openblas_set_num_threads(threads);
  const int n = 2048;
  std::vector<float> a(size_t(n) * n, 1.f), b(size_t(n) * n, 0.5f), c(size_t(n) * n);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
    best = std::min(best, now_s() - t0);
  }
  return 2.0 * n * n * double(n) / best / 1e9;
}

double measure_read_bandwidth_gbs(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const size_t bytes = size_t(1) << 30, n = bytes / 4;
  float* buf = static_cast<float*>(std::aligned_alloc(64, bytes));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)  // first touch by the thread that will read the part
    pool.emplace_back([=] { std::memset(buf + n / threads * t, 1, n / threads * 4); });
  for (auto& th : pool) th.join();
  const bool avx2 = __builtin_cpu_supports("avx2");
  double best = 1e30;
  std::vector<float> sink(static_cast<size_t>(threads));
  for (int rep = 0; rep < 5; ++rep) {
    pool.clear();
    const double t0 = now_s();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const float* p = buf + n / threads * t;
        sink[size_t(t)] = avx2 ? sum_avx2(p, n / threads) : sum_plain(p, n / threads);
      });
    for (auto& th : pool) th.join();
    best = std::min(best, now_s() - t0);
  }
  std::free(buf);
  volatile float keep = sink[0];
  (void)keep;
  return double(n / threads * threads) * 4 / best / 1e9;
}

std::string machine_info() {
  std::string model = "unknown CPU";
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return std::string("cpu_isa=") + cpu::cpu_isa_name() + " openblas=" + openblas_core() +
         " threads=" + std::to_string(std::thread::hardware_concurrency()) + " model=\"" + model + "\"";
}

}  // namespace flexh2o::bench
