// CUDA ops, part 1: linear (cuBLAS), embeddings, norms, rotary, silu*mul. Host-only
// declarations; kernels live in linear.cu / elementwise.cu. Semantics match kernels/cpu/ops.h
// except that tensors are fp16 or bf16 (`dt`, one dtype per call) with fp32 accumulation.
// All pointers are device pointers unless stated; every call is asynchronous on `stream`
// (enqueue only; argument errors throw flexh2o::Error before anything is enqueued).
// Unsupported dtypes throw. Rows are contiguous (stride = row length) unless a stride is given.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/resources.h"

namespace flexh2o::gpu {

enum class Epilogue {
  kStore,       // y = x W^T + b
  kRelu,        // y = max(0, x W^T + b)
  kAccumulate,  // y += x W^T + b   (residual add)
};

// True for the activation dtypes the CUDA ops take (F16, BF16).
bool dtype_supported(DType dt);

// y[M,N] = epilogue(x[M,K] . w[N,K]^T + bias[N]); x, w, bias, y all `dt`; w row-major [N,K]
// (nn.Linear layout); bias may be null. cuBLAS GEMM (tensor cores, fp32 accumulate), then one
// element-wise pass for bias/ReLU. y must not alias x. Uses (and rebinds) `cublas` on `stream`.
void linear(CublasHandle& cublas, DType dt, const void* x, int64_t M, int64_t K, const void* w,
            int64_t N, const void* bias, void* y, Epilogue ep, cudaStream_t stream);

// y[M,N] (fp32) = x[M,K] . w[N,K]^T with x, w in `dt`: the lm_head, whose logits are kept in
// fp32 (no rounding to dt before sampling). No bias. Same cuBLAS path and rules as linear().
void linear_f32out(CublasHandle& cublas, DType dt, const void* x, int64_t M, int64_t K, const void* w,
                   int64_t N, float* y, cudaStream_t stream);

// out[t,:] = table[ids[t],:]; table [V,D]. ids (device, int32) outside [0,V) give a zero row:
// validate ids on the host (the CPU op throws; a kernel cannot).
void embedding(DType dt, const int32_t* ids, int64_t T, const void* table, int64_t V, int64_t D,
               void* out, cudaStream_t stream);
// out[t,:] += table[rows[t],:] (OPT learned positions; rows already include OPT's offset 2).
void add_embedding(DType dt, const int32_t* rows, int64_t T, const void* table, int64_t V,
                   int64_t D, void* out, cudaStream_t stream);

// Per row of D: y = (x-mean)/sqrt(var+eps)*gamma + beta (two-pass fp32). x and y may alias.
void layernorm(DType dt, const void* x, int64_t M, int64_t D, const void* gamma, const void* beta,
               float eps, void* y, cudaStream_t stream);
// Per row of D: y = x/sqrt(mean(x^2)+eps)*(gamma_offset + gamma) (Gemma: offset 1). x and y may alias.
void rmsnorm(DType dt, const void* x, int64_t M, int64_t D, const void* gamma, float eps, void* y, cudaStream_t stream,
             float gamma_offset = 0.f);
// y += rmsnorm(x) per row, in fp32, rounded once (Gemma 2's norms of the attention and MLP
// outputs). x and y must not alias.
void rmsnorm_add(DType dt, const void* x, int64_t M, int64_t D, const void* gamma, float eps, float gamma_offset,
                 void* y, cudaStream_t stream);
// x[i] *= s for i < n (Gemma's embedding scale).
void scale(DType dt, void* x, int64_t n, float s, cudaStream_t stream);

// A model's rotary frequencies, passed to the kernel by value (no device memory to manage):
// inv_freq[i] for i < dims/2 (the model's Rope), over each head's first `dims` values;
// attention_factor multiplies cos and sin.
struct RotaryTable {
  static constexpr int64_t kMaxHalf = 256;  // dims up to 512; the struct stays within 4 KiB of kernel parameters
  double inv_freq[kMaxHalf] = {};
  int64_t dims = 0;
  float attention_factor = 1.f;
};
// Copies `half` values (half <= kMaxHalf, else throws): dims = 2 * half.
RotaryTable rotary_table(const double* inv_freq, int64_t half, float attention_factor);

// HF rotate_half rotary, in place: row t at x + t*row_stride (elements) holds n_heads*head_dim
// values; of each head's first table.dims (<= head_dim; the rest pass unchanged), pair
// (i, i + dims/2) turns by positions[t] (device int32) * table.inv_freq[i]. Angles are computed
// in double, like the CPU op.
void rotary(DType dt, void* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t row_stride,
            const int32_t* positions, const RotaryTable& table, cudaStream_t stream);

// gate[i] = silu(gate[i]) * up[i] for i < n.
void silu_mul(DType dt, void* gate, const void* up, int64_t n, cudaStream_t stream);
// gate[i] = gelu_tanh(gate[i]) * up[i] for i < n (GeGLU), in the CPU op's form.
void gelu_tanh_mul(DType dt, void* gate, const void* up, int64_t n, cudaStream_t stream);
// x[i] = cap * tanh(x[i] / cap) over fp32 logits (Gemma 2's final soft cap). cap > 0.
void softcap_f32(float* x, int64_t n, float cap, cudaStream_t stream);

// Mixture-of-experts routing (moe.cu): cpu::moe_route's choice and weights ([M, k] each, device
// memory) from the fp32 router logits [M, E]. E <= 1024, k <= 64 (else throws).
void moe_route(const float* logits, int64_t M, int64_t E, int64_t k, bool normalize, int32_t* experts, float* weights,
               cudaStream_t stream);
// Groups moe_route's M*k choices by expert: counts[e] (int32 [E]) choices went to expert e, and
// expert e's group, at offset counts[0] + ... + counts[e-1] of rows / row_w (int32 / fp32
// [M*k]), holds each choosing row's index and its weight, in no fixed order. work: int32 [2E].
void moe_group(const int32_t* experts, const float* weights, int64_t M, int64_t k, int64_t E, int32_t* counts,
               int32_t* work, int32_t* rows, float* row_w, cudaStream_t stream);
// sum[rows[g], :] += row_w[g] * y[g, :] for g < n, rows of H (y in dt, sum fp32). The rows of
// one call must be distinct (one expert's group).
void moe_scatter_add(DType dt, const void* y, const int32_t* rows, const float* row_w, int64_t n, int64_t H, float* sum,
                     cudaStream_t stream);
// sum[r, :] += sigmoid(gate[r]) * y[r, :] over M rows of H (Qwen2-MoE's shared expert; y in dt,
// gate and sum fp32).
void moe_gated_add(DType dt, const void* y, const float* gate, int64_t M, int64_t H, float* sum, cudaStream_t stream);
// x[i] += sum[i] for i < n (x in dt, sum fp32), rounding once.
void add_f32(DType dt, void* x, const float* sum, int64_t n, cudaStream_t stream);

}  // namespace flexh2o::gpu
