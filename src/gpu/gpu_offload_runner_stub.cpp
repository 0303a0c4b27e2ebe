// GpuOffloadRunner for builds without CUDA (nvcc not found at build time): construction throws
// the reason, so callers need no #ifdefs. The other members are never reached.
#include "core/error.h"
#include "gpu/gpu_offload_runner.h"
#include "gpu/offload_plan.h"
#include "kernels/cuda/cuda_probe.h"

namespace flexh2o::gpu {

struct GpuOffloadRunner::Impl {};

GpuOffloadRunner::GpuOffloadRunner(const Model&, const GpuOffloadOptions& o) {
  check_gpu_offload_policy(o.policy, o.kv_policy != nullptr);
  FH_FAIL("the CUDA offloading runner is not available: ", probe_cuda().reason, "; use --device cpu");
}
GpuOffloadRunner::~GpuOffloadRunner() = default;
const ModelConfig& GpuOffloadRunner::config() const { FH_FAIL("GpuOffloadRunner: CUDA is not compiled in"); }
int64_t GpuOffloadRunner::max_batch() const { return 0; }
void GpuOffloadRunner::begin_batch(int64_t, int64_t) { FH_FAIL("GpuOffloadRunner: CUDA is not compiled in"); }
void GpuOffloadRunner::step(const int32_t*, const int32_t*, int64_t, const int32_t*, std::vector<float>&) {
  FH_FAIL("GpuOffloadRunner: CUDA is not compiled in");
}
size_t GpuOffloadRunner::kv_bytes() const { return 0; }
void GpuOffloadRunner::expect_more_steps(bool) {}
GpuOffloadReport GpuOffloadRunner::report() const { return {}; }
std::vector<int32_t> GpuOffloadRunner::lengths() const { return {}; }

}  // namespace flexh2o::gpu
