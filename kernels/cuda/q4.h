// CUDA ops on the Q4 row format of core/quant4.h (4-bit groups of 64 along the last dimension,
// one self-contained record of q4::row_bytes(cols) bytes per row): encode and decode rows, the
// Q4 KV-cache write, embeddings from a Q4 table, and linear layers with a Q4 weight (a fused
// small-M GEMV/GEMM that dequantizes in registers; dequantize-into-scratch + cuBLAS above
// kQ4FusedMaxRows). Host-only declarations; kernels in q4.cu, q4_gemv.cu and linear.cu. All
// pointers are device pointers; every call is asynchronous on `stream`; argument errors throw
// flexh2o::Error before anything is enqueued. Q4 records must start 4-byte aligned.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/resources.h"

namespace flexh2o::gpu {

// Rows up to which linear_q4 runs the fused kernel (q4_gemv) rather than dequantizing the
// weight into scratch and calling cuBLAS. The fused kernel reads 36/64 bytes per weight where
// the other path reads those, writes 2 and reads them back; but each decoded weight feeds only M
// FMAs on CUDA cores with x from L1, so it loses to tensor cores as M grows. 8 is a reasoned
// first value (decode steps of a small micro-batch); bench_gpu (run by bench/gpu_check.sh)
// times both paths per M ("q4 fused speedup over dequant"), and this is set from those rows.
inline constexpr int64_t kQ4FusedMaxRows = 8;

// Encodes `rows` rows of `cols` values of `src_dtype` (F32, F16 or BF16; row r at
// src + r*src_stride elements) into Q4 records (row r at dst + r*q4::row_bytes(cols)), codes
// and meta bit-identical to q4::encode_rows* on the same values. A group the host would refuse
// (NaN/Inf, or min/scale not finite in fp16) gets NaN meta and zero codes: it decodes to NaN.
void q4_encode_rows(DType src_dtype, const void* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                    cudaStream_t stream);
// Decodes Q4 records into `dst_dtype` (F32, F16 or BF16; row r at dst + r*dst_stride elements):
// q4::decode_rows's fp32 value, then (F16/BF16) rounded to nearest even, bit for bit.
void q4_decode_rows(const void* src, int64_t rows, int64_t cols, DType dst_dtype, void* dst, int64_t dst_stride,
                    cudaStream_t stream);

// write_kv (attention.h) into a Q4 cache: src row (b,t) of kv_heads*head_dim values in src_dtype
// (F16/BF16) becomes kv_heads records of head_dim at slot seq_keys[b] - T + t of
// cache [B, kv_heads, capacity] records (negative slots and slots >= capacity skipped).
void q4_write_kv(DType src_dtype, const void* src, int64_t src_stride, int64_t B, int64_t T, int64_t kv_heads,
                 int64_t head_dim, void* cache, int64_t capacity, const int32_t* seq_keys, cudaStream_t stream);

// embedding / add_embedding (ops.h) from a Q4 table [V, D] of records: out in dt (F16/BF16)
// gets the decoded row (add: out = round(out + decoded)); ids outside [0, V) give zeros.
void q4_embedding(DType dt, const int32_t* ids, int64_t T, const void* table, int64_t V, int64_t D, void* out,
                  bool add, cudaStream_t stream);

// The fused kernel: y[M,N] = epilogue(x[M,K] . decode(w)[N,K]^T + bias[N]) with x, bias in dt
// (F16/BF16), w N Q4 records of K, fp32 accumulation, one rounding of y to y_dtype (dt, or F32
// for the lm_head; kAccumulate adds y's old value before it). M in [1, 16]. y must not alias x.
void q4_gemv(DType dt, const void* x, int64_t M, int64_t K, const void* w, int64_t N, const void* bias, void* y,
             DType y_dtype, Epilogue ep, cudaStream_t stream);

// linear() (ops.h) with a Q4 weight: q4_gemv when M <= kQ4FusedMaxRows; else tiles of weight
// rows are decoded into `scratch` (device, scratch_bytes >= K * dtype_size(dt)) and multiplied
// by cuBLAS, then the bias/ReLU pass (the CUDA device's scratch is q4_dequant_tile_bytes() of
// engine/device.h: no full-size fp16 copy of a weight). Same semantics and rules as linear().
void linear_q4(CublasHandle& cublas, DType dt, const void* x, int64_t M, int64_t K, const void* w, int64_t N,
               const void* bias, void* y, Epilogue ep, void* scratch, size_t scratch_bytes, cudaStream_t stream);
// linear_f32out() with a Q4 weight (the lm_head), same paths.
void linear_q4_f32out(CublasHandle& cublas, DType dt, const void* x, int64_t M, int64_t K, const void* w, int64_t N,
                      float* y, void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace flexh2o::gpu
