// CPU kernels: the reference implementation of every op, fp32 compute.
// Weights come as TensorViews in f32, f16, bf16 or Q4 (core/quant4.h) and are converted or
// decoded on the fly; the KV cache may be f32, f16, bf16 or Q4 likewise (write_kv rounds or
// encodes into it, attention widens or decodes from it).
// All functions are blocking and parallelise internally with oneTBB; call them from
// inside the CPU device's tbb::task_arena to bound the threads. Thread-safe (no state).
//
// Determinism contract (tests rely on it): the value computed for one row/sequence never
// depends on how many other rows are in the call, on their contents, or on the thread
// count. A batch of prompts therefore gives bit-identical results to each prompt alone.
// Attention over an f16/bf16/Q4 cache is bit-identical to attention over an fp32 cache holding
// the same (already rounded, or q4::decode_rows-decoded) values, and a Q4 linear to the fp32
// linear over q4::decode_rows of its weight.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace flexh2o::cpu {

enum class Epilogue {
  kStore,       // y = x W^T + b
  kRelu,        // y = max(0, x W^T + b)
  kAccumulate,  // y += x W^T + b   (residual add)
};

// y[M,N] = epilogue(x[M,K] . w[N,K]^T + bias[N]). w: f32/f16/bf16, row-major [N, K] (the
// Hugging Face nn.Linear layout), or Q4: N records of q4::row_bytes(K) (groups along K),
// decoded inside the kernel. bias: null or [N] of any float dtype. x and y must not alias.
void linear(const float* x, int64_t M, int64_t K, const TensorView& w, const TensorView* bias,
            float* y, Epilogue ep);

// out[t, :] = table[ids[t], :] as fp32. table: [V, D] of f32/f16/bf16, or Q4 (V records of
// q4::row_bytes(D); only the chosen rows are decoded). ids are checked against V (throws).
void embedding(const int32_t* ids, int64_t T, const TensorView& table, float* out);
// out[t, :] += table[rows[t], :] (learned position embeddings). rows checked against V.
void add_embedding(const int32_t* rows, int64_t T, const TensorView& table, float* out);

// y = (x - mean) / sqrt(var + eps) * gamma + beta, per row of D. x and y may alias.
void layernorm(const float* x, int64_t M, int64_t D, const TensorView& gamma,
               const TensorView& beta, float eps, float* y);
// y = x / sqrt(mean(x^2) + eps) * (gamma + gamma_offset), per row of D (Gemma's norms: offset 1,
// added to gamma in fp32). x and y may alias.
void rmsnorm(const float* x, int64_t M, int64_t D, const TensorView& gamma, float eps, float* y,
             float gamma_offset = 0.f);
// y += rmsnorm(x) (Gemma 2's norms of the attention and MLP outputs). x and y must not alias.
void rmsnorm_add(const float* x, int64_t M, int64_t D, const TensorView& gamma, float eps, float gamma_offset,
                 float* y);

// Rotary embedding in the Hugging Face (non-interleaved, rotate_half) layout, in place.
// x: T rows, row t at x + t*row_stride holding n_heads*head_dim floats; row t is rotated
// by position positions[t]: of each head's first rotary_dims values (even, <= head_dim; the
// rest pass unchanged), pair (i, i + rotary_dims/2) turns by positions[t] * inv_freq[i]
// (rotary_dims/2 values, the model's Rope), and cos and sin are multiplied by attention_factor.
// Angles are computed in double.
void rotary(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t row_stride, const int32_t* positions,
            const double* inv_freq, int64_t rotary_dims, float attention_factor);

// gate[i] = silu(gate[i]) * up[i] for i < n.
void silu_mul(float* gate, const float* up, int64_t n);
// gate[i] = gelu_tanh(gate[i]) * up[i] for i < n (GeGLU; PyTorch's gelu approximate="tanh").
void gelu_tanh_mul(float* gate, const float* up, int64_t n);
// x[i] = cap * tanh(x[i] / cap) for i < n (Gemma 2's soft caps; absolute error ~1e-7 * cap).
// Throws unless cap > 0.
void softcap(float* x, int64_t n, float cap);

// Mixture-of-experts routing of M rows of E router logits: p = softmax(row) in fp32, its k
// largest (ties: the lower expert first; NaN last) into experts[r*k + j] (int32) and their p,
// divided by the chosen ones' sum when `normalize`, into weights[r*k + j], in descending p.
// Throws unless 1 <= k <= E.
void moe_route(const float* logits, int64_t M, int64_t E, int64_t k, bool normalize, int32_t* experts, float* weights);

// Row conversions, element by element, bit-identical to the scalar ones in core/dtype.h:
// narrowing rounds to nearest even (subnormals included, overflow to inf) and turns NaN
// into a quiet NaN with the top payload bits; widening is exact, NaN bits included.
// dtype: F32 (a copy), F16 or BF16; anything else throws. src and dst must not overlap;
// neither needs any alignment beyond its element type's. Parallel over large n.
void to_f32(DType src_dtype, const void* src, int64_t n, float* dst);
void from_f32(const float* src, int64_t n, DType dst_dtype, void* dst);
// Q4 records (core/quant4.h) -> fp32: `rows` records of q4::row_bytes(cols) at src, row r to
// dst + r*dst_stride (dst_stride >= cols). Bit-identical to q4::decode_rows; vectorised and
// parallel over rows. Materialises a weight (what FlexGen does before its GEMM).
void decode_q4(const void* src, int64_t rows, int64_t cols, float* dst, int64_t dst_stride);
// The Q4 records of `rows` rows of cols elements of src_dtype (F32, F16 or BF16; row r at
// src + r*src_stride elements) into dst: the bytes of q4::encode_rows / _f16 / _bf16, in
// parallel over blocks of rows (compressing a weight when it is placed). Throws the
// reference's error (naming `what`, the row and the group) on NaN/Inf/beyond-fp16 values;
// the failing row is not written, other rows may be.
void encode_q4(DType src_dtype, const void* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
               const std::string& what);

// KV cache layout: [B, kv_heads, capacity, head_dim] of the cache dtype (F32, F16 or BF16),
// or for Q4 [B, kv_heads, capacity] records of q4::row_bytes(head_dim) (groups along head_dim);
// every row size is row_nbytes(dtype, head_dim). Left-aligned: sequence b's cached tokens fill slots [0, n_b) of each of its (b, head)
// rows, with no padding inside. seq_keys ([B], int32) gives n_b AFTER this step's T (or
// tq) new tokens are written. Row t of a step (0 <= t < T) of sequence b belongs at slot
// seq_keys[b] - T + t; a row whose slot is negative is a left-padding row (the sequence
// has fewer than T new tokens this step).

// Copies the T new rows of each sequence into the cache: src row (b,t), at
// src + (b*T + t)*src_stride holding kv_heads*head_dim floats, goes to slot
// seq_keys[b] - T + t of every kv head, rounded to cache_dtype as from_f32 does (Q4: encoded
// by q4::encode_rows, which refuses NaN/Inf/beyond-fp16 rows with an error naming the
// sequence, head and slot); padding rows (negative slot) are skipped. Checks
// 0 <= seq_keys[b] <= capacity (throws before writing anything).
void write_kv(const float* src, int64_t src_stride, int64_t B, int64_t T, int64_t kv_heads,
              int64_t head_dim, void* cache, DType cache_dtype, int64_t capacity,
              const int32_t* seq_keys);
// The same with an fp32 cache.
void write_kv(const float* src, int64_t src_stride, int64_t B, int64_t T, int64_t kv_heads,
              int64_t head_dim, float* cache, int64_t capacity, const int32_t* seq_keys);

// In-place compaction of a left-aligned cache (KV eviction), independently per (b, h) row:
// new slot i <- old slot keep[(b*kv_heads + h)*keep_stride + i] for i < keep_count[b*kv_heads + h];
// slots >= keep_count are left unchanged. Precondition (checked for every row before anything
// is moved; throws): 0 <= keep_count <= min(capacity, keep_stride) and i <= keep[i] < capacity.
// It covers stable compaction (keep increasing) and swap-remove ("move the last slot into the
// victim"). Rows of head_dim elements (of dtype: F32, F16, BF16 or Q4 records) are moved whole, so the
// op is generic over row width: head_dim = 1 compacts a [B, heads, capacity] score array
// (that is what score_gather does).
void kv_gather(void* cache, DType dtype, int64_t B, int64_t kv_heads, int64_t capacity,
               int64_t head_dim, const int32_t* keep, int64_t keep_stride,
               const int32_t* keep_count);
// The same with an fp32 cache.
void kv_gather(float* cache, int64_t B, int64_t kv_heads, int64_t capacity, int64_t head_dim,
               const int32_t* keep, int64_t keep_stride, const int32_t* keep_count);
// kv_gather with head_dim = 1, for H2O key scores [B, heads, capacity] (heads may be n_heads).
void score_gather(float* scores, int64_t B, int64_t heads, int64_t capacity, const int32_t* keep,
                  int64_t keep_stride, const int32_t* keep_count);

// Causal softmax attention of tq new queries per sequence over its left-aligned KV cache
// rows. Query row t of sequence b sits at slot p = seq_keys[b] - tq + t and attends to slots
// [0, p]; if p < 0 the row is left padding: its output row is written as zeros and it adds
// nothing to key_scores. Slots >= seq_keys[b] are never read. GQA: query head h reads kv
// head h / (n_heads / kv_heads). Checks 0 <= seq_keys[b] <= capacity (throws).
// K and V may be F16, BF16 or Q4 (kv_dtype); their values are converted exactly to fp32 (Q4:
// decoded as q4::decode_rows) as they are read, so the result is bit-identical to that of an
// fp32 cache holding the same values.
struct AttentionArgs {
  const float* q = nullptr;  // [B, tq] rows at stride q_stride, each n_heads*head_dim floats
  int64_t q_stride = 0;
  const void* k = nullptr;  // cache [B, kv_heads, capacity, head_dim] of kv_dtype (Q4: records)
  const void* v = nullptr;  // same layout and dtype as k
  DType kv_dtype = DType::F32;  // F32, F16, BF16 or Q4
  int64_t batch = 0, tq = 0, n_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t capacity = 0;
  const int32_t* seq_keys = nullptr;  // [B] filled slots of sequence b (incl. this step's tq)
  float scale = 0.f;                  // softmax(q.k * scale); usually 1/sqrt(head_dim)
  float softcap = 0.f;                // > 0: scores s = q.k * scale become softcap * tanh(s / softcap)
  // > 0: sliding-window attention, the query in slot s sees slots (s - window, s] (0: [0, s]).
  int64_t window = 0;
  float* out = nullptr;               // [B, tq] rows at stride out_stride, n_heads*head_dim
  int64_t out_stride = 0;
  // Optional [B, n_heads, capacity]: for each key slot, += the attention probability it got,
  // summed over the tq queries (H2O scores: prefill column sums, decode per-step probs).
  // Slots >= seq_keys[b] are not touched.
  float* key_scores = nullptr;
};
void attention(const AttentionArgs& a);

}  // namespace flexh2o::cpu
