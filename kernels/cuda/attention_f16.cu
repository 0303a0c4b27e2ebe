// Explicit instantiations of the attention kernel (detail/attention_kernel.cuh) for F16
// activations: every KV dtype (F16, BF16, F32) x head_dim {64, 128}. The list must match
// dispatch_attention in attention.cu (a missing entry is a link error).
#include "kernels/cuda/detail/attention_kernel.cuh"

namespace flexh2o::gpu::detail {

template void launch_attention<__half, __half, 64>(const AttentionArgs&, int64_t, cudaStream_t);
template void launch_attention<__half, __half, 128>(const AttentionArgs&, int64_t, cudaStream_t);
template void launch_attention<__half, __nv_bfloat16, 64>(const AttentionArgs&, int64_t, cudaStream_t);
template void launch_attention<__half, __nv_bfloat16, 128>(const AttentionArgs&, int64_t, cudaStream_t);
template void launch_attention<__half, float, 64>(const AttentionArgs&, int64_t, cudaStream_t);
template void launch_attention<__half, float, 128>(const AttentionArgs&, int64_t, cudaStream_t);

}  // namespace flexh2o::gpu::detail
