// GpuRunner for builds without CUDA (nvcc not found at build time): construction throws the
// reason, so callers need no #ifdefs. The other members are never reached.
#include "core/error.h"
#include "gpu/gpu_runner.h"
#include "kernels/cuda/cuda_probe.h"

namespace flexh2o::gpu {

struct GpuRunner::Impl {};

GpuRunner::GpuRunner(const Model&, const GpuRunnerOptions&) {
  FH_FAIL("the CUDA runner is not available: ", probe_cuda().reason, "; use --device cpu");
}
GpuRunner::~GpuRunner() = default;
const ModelConfig& GpuRunner::config() const { FH_FAIL("GpuRunner: CUDA is not compiled in"); }
int64_t GpuRunner::max_batch() const { return 0; }
void GpuRunner::begin_batch(int64_t, int64_t) { FH_FAIL("GpuRunner: CUDA is not compiled in"); }
void GpuRunner::step(const int32_t*, const int32_t*, int64_t, const int32_t*, std::vector<float>&) {
  FH_FAIL("GpuRunner: CUDA is not compiled in");
}
size_t GpuRunner::kv_bytes() const { return 0; }
GpuRunInfo GpuRunner::info() const { return {}; }
std::vector<int32_t> GpuRunner::lengths() const { return {}; }
const KvPolicyState* GpuRunner::policy_state(int64_t) const { return nullptr; }

}  // namespace flexh2o::gpu
