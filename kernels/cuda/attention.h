// CUDA ops, part 2: the KV cache — write_kv, attention (prefill and decode, with H2O key
// scores) and kv_gather (in-place compaction). Host-only declarations; kernels in attention.cu.
// Cache layout: [B, kv_heads, capacity, head_dim] per K and per V in the KV dtype (F16, BF16 or
// F32, independent of the F16/BF16 activation dtype), or Q4: [B, kv_heads, capacity] records of
// q4::row_bytes(head_dim) (core/quant4.h); left-aligned: sequence b's tokens occupy slots
// [0, seq_keys[b]) (device int32 [B]). Async on `stream`; argument errors throw first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "core/dtype.h"

namespace flexh2o::gpu {

// Copies T new rows per sequence into one cache (K or V): src row (b,t), at
// src + (b*T + t)*src_stride elements and holding kv_heads*head_dim values, goes to slot
// seq_keys[b] - T + t (seq_keys counts keys after this write). Negative slots (left padding
// of a shorter sequence) and slots >= capacity are skipped. src is in the activation dtype
// (F16/BF16), cache in the KV dtype (F16/BF16/F32): each element is converted exactly like
// the host conversions of src/core/dtype.h (widen exactly, round to nearest even, overflow to
// inf, NaN stays NaN), bit for bit; with equal dtypes it is a plain copy. A Q4 cache gets each
// head's row encoded (q4_write_kv in q4.h, bit-identical to q4::encode_rows). Other pairs throw.
void write_kv(DType src_dtype, const void* src, int64_t src_stride, int64_t B, int64_t T,
              int64_t kv_heads, int64_t head_dim, void* cache, DType cache_dtype, int64_t capacity,
              const int32_t* seq_keys, cudaStream_t stream);
// The same with cache dtype == src dtype.
void write_kv(DType dt, const void* src, int64_t src_stride, int64_t B, int64_t T, int64_t kv_heads,
              int64_t head_dim, void* cache, int64_t capacity, const int32_t* seq_keys,
              cudaStream_t stream);

// Which kernel attention() runs. kShared keeps a row's fp32 scores in shared memory: one q.k
// pass, rows of up to ~(227 KB - 2.5 KB)/4 keys on H100/H200 (more throws). kStreamed keeps no
// score row: two q.k passes (the softmax's max and sum, then probabilities and output), any
// length. kAuto: kShared when max_keys fits, else kStreamed. Both compute each q.k score with the same
// code; probabilities differ by the order the denominator is summed in.
enum class AttentionPath : uint8_t { kAuto, kShared, kStreamed };

// Causal softmax attention of tq queries per sequence over that sequence's keys.
// Query row t of sequence b sits at slot s = seq_keys[b] - tq + t and attends to slots [0, s]
// (with a window, (s - window, s]);
// s < 0 marks a padding row, whose output is zero and which adds no key score.
// GQA: query head h reads kv head h / (n_heads / kv_heads).
struct AttentionArgs {
  DType dtype = DType::F16;  // q and out: the activation dtype, F16 or BF16
  // k and v: F16, BF16, F32 or Q4 (decoded in registers with the format's fmaf). Unset means
  // "same as dtype" (callers written before the KV dtype was separate keep their meaning).
  std::optional<DType> kv_dtype;
  const void* q = nullptr;   // [B, tq] rows at stride q_stride (elements), n_heads*head_dim each
  int64_t q_stride = 0;
  const void* k = nullptr;   // cache [B, kv_heads, capacity, head_dim], kv_dtype elements
  const void* v = nullptr;   // same layout and dtype as k
  int64_t batch = 0, tq = 0, n_heads = 0, kv_heads = 0, head_dim = 0, capacity = 0;
  const int32_t* seq_keys = nullptr;  // device [B], each in [0, max_keys]
  // Host-side upper bound on every seq_keys[b] (<= capacity), sizes shared memory and picks the
  // path; 0 means capacity. A sequence above it gets NaN output (contract violation, visible).
  int64_t max_keys = 0;
  float scale = 0.f;         // softmax(q.k * scale)
  float softcap = 0.f;       // > 0: scores s = q.k * scale become softcap * tanh(s / softcap) (Gemma 2)
  int64_t window = 0;        // > 0: sliding window, the query in slot s sees slots (s - window, s]
  void* out = nullptr;       // [B, tq] rows at stride out_stride, n_heads*head_dim each
  int64_t out_stride = 0;
  // Optional fp32 [B, n_heads, capacity]: each slot += the probability it got, summed over the
  // queries (H2O scores). Prefill sums use float atomics (order not fixed); decode (tq=1) is exact.
  float* key_scores = nullptr;
  AttentionPath path = AttentionPath::kAuto;  // the engine leaves kAuto; tests force each path
};
// Supported: dtype {F16, BF16} x kv_dtype {F16, BF16, F32, Q4} x head_dim {64, 128, 256}, and
// head_dim 96 without Q4 (see attention_supported); else throws. Math is fp32 whatever the storage dtypes; the output
// is rounded once to dtype. Any number of keys per query (see AttentionPath).
void attention(const AttentionArgs& a, cudaStream_t stream);
bool attention_supported(DType act, DType kv, int64_t head_dim);
// The same with kv == act.
bool attention_supported(DType dt, int64_t head_dim);

// In-place compaction (KV eviction) of a [B, heads, capacity, row_elems] buffer, independently
// per (b, h) row r = b*heads + h: new slot i <- old slot keep[r*keep_stride + i] for
// i < keep_count[r]; slots >= keep_count[r] keep their contents. Same contract as the CPU
// kv_gather: i <= keep[i] < capacity and keep_count[r] <= min(capacity, keep_stride) (covers
// stable compaction and swap-remove). Device data cannot be checked here: entries breaking it
// are skipped. Any 2- or 4-byte element or Q4 records, moved as raw bits: K/V caches in F16,
// BF16, F32 or Q4 (heads = kv_heads, row_elems = head_dim; a Q4 slot is one record of
// q4::row_bytes(head_dim)) and key_scores (F32, heads = n_heads, row_elems = 1).
void kv_gather(DType dt, void* buf, int64_t B, int64_t heads, int64_t capacity, int64_t row_elems,
               const int32_t* keep, int64_t keep_stride, const int32_t* keep_count, cudaStream_t stream);

}  // namespace flexh2o::gpu
