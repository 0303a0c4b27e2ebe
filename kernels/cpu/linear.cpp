// linear(): argument checks, bias conversion and the oneTBB split of y into output blocks.
// The arithmetic is in detail/linear_impl.h (one instantiation per ISA). Blocks never split
// K, so an output's value does not depend on the blocking, M, or the thread count.
#include <tbb/blocked_range2d.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/detail/rows.h"
#include "kernels/cpu/ops.h"

namespace flexh2o::cpu {
namespace detail {
void linear_isa(Isa isa, const float* x, int64_t M, int64_t K, const TensorView& w,
                const TensorView* bias, float* y, Epilogue ep) {
  FH_CHECK(w.shape.ndim == 2 && w.shape[1] == K, "linear: weight shape ", w.shape.str(),
           " does not match K=", K);
  FH_CHECK(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16 || w.dtype == DType::Q4,
           "linear: weight dtype ", dtype_name(w.dtype), " is not supported");
  FH_CHECK(M >= 0 && K > 0, "linear: bad sizes M=", M, " K=", K);
  const int64_t N = w.shape[0];
  if (M == 0 || N == 0) return;
  FH_CHECK(x && y && w.data, "linear: null pointer");
  std::vector<float> b;
  if (bias && !bias->empty()) b = vec_to_f32(*bias, N, "linear bias");
  const KernelTable& kt = kernels(isa);

  LinearTask base;
  base.x = x;
  base.M = M;
  base.K = K;
  base.N = N;
  base.w = w.data;
  base.wdtype = w.dtype;
  base.bias = b.empty() ? nullptr : b.data();
  base.y = y;
  base.ep = ep;
  base.packed = M > kLinearDirectMaxM;

  if (!base.packed) {  // decode: stream w once, split over N only
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, N, 48),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        LinearTask t = base;
                        t.m0 = 0;
                        t.m1 = M;
                        t.n0 = r.begin();
                        t.n1 = r.end();
                        kt.linear_task(t);
                      });
    return;
  }
  // +16 floats so the per-thread scratch can be aligned to 64 B (the state holds vectors).
  tbb::enumerable_thread_specific<std::vector<float>> scratch(
      [] { return std::vector<float>(size_t(linear_scratch_floats() + 16)); });
  auto aligned = [](std::vector<float>& v) {
    const auto p = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + ((64 - p % 64) % 64) / sizeof(float);
  };
  const int64_t mblocks = (M + kLinearMB - 1) / kLinearMB, nblocks = (N + kLinearNB - 1) / kLinearNB;
  tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, nblocks, 1, 0, mblocks, 1),
                    [&](const tbb::blocked_range2d<int64_t>& r) {
                      LinearTask t = base;
                      t.scratch = aligned(scratch.local());
                      for (int64_t nbk = r.rows().begin(); nbk < r.rows().end(); ++nbk)
                        for (int64_t mbk = r.cols().begin(); mbk < r.cols().end(); ++mbk) {
                          t.n0 = nbk * kLinearNB;
                          t.n1 = t.n0 + kLinearNB < N ? t.n0 + kLinearNB : N;
                          t.m0 = mbk * kLinearMB;
                          t.m1 = t.m0 + kLinearMB < M ? t.m0 + kLinearMB : M;
                          kt.linear_task(t);
                        }
                    });
}

}  // namespace detail

void linear(const float* x, int64_t M, int64_t K, const TensorView& w, const TensorView* bias,
            float* y, Epilogue ep) {
  detail::linear_isa(detail::best_isa(), x, M, K, w, bias, y, ep);
}

}  // namespace flexh2o::cpu
