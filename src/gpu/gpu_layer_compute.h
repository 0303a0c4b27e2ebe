// The transformer's compute on a CUDA device, unit by unit (embedding, one layer, head), on
// caller-provided device buffers and one stream — the GPU twin of engine/layer_compute.h,
// step for step (OPT: layernorm, biases, ReLU, learned positions; LLaMA: rmsnorm, rotary,
// GQA, SiLU*mul). Weights come as a GpuModelWeights view (any device addresses), so an
// offloading engine can reuse it. Owns its scratch and cuBLAS handle; not thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "gpu/weights_view.h"
#include "kernels/cuda/resources.h"
#include "model/config.h"

namespace flexh2o::gpu {

// Sequences [first_seq, first_seq + n_seq) of a step whose K/V live in one device buffer:
// K and V each [n_seq, kv_heads, capacity, head_dim] in the compute dtype, left-aligned.
struct GpuKvSegment {
  void* k = nullptr;
  void* v = nullptr;
  int64_t first_seq = 0, n_seq = 0;
  int64_t capacity = 0;
  // Optional device fp32 [n_seq, n_heads, capacity], zeroed by the caller: += each slot's
  // attention probability summed over this step's queries (H2O scores).
  float* key_scores = nullptr;
};

// One step's shape: B sequences x T rows (left-padded), device arrays unless stated.
struct GpuStep {
  int64_t B = 0, T = 0;
  const int32_t* ids = nullptr;        // [B*T] token ids, validated on the host
  const int32_t* positions = nullptr;  // [B*T] 0-based positions (LLaMA rotary)
  const int32_t* pos_rows = nullptr;   // [B*T] OPT: positions + 2 (rows of pos_embed)
  const int32_t* seq_keys = nullptr;   // [B] cached tokens per sequence after this step's write
  int64_t max_keys = 0;                // host: max of seq_keys (sizes attention's shared memory)
};

class GpuLayerCompute {
 public:
  GpuLayerCompute(const ModelConfig& c, DType dt);

  // Device bytes of scratch for steps of up to M = B*T rows and B sequences.
  static size_t scratch_bytes(const ModelConfig& c, DType dt, int64_t M, int64_t B);
  // Makes room for steps of up to M rows / B sequences (reallocates the scratch when it
  // grows). Throws Error naming the bytes when the device has no room.
  void reserve(int64_t M, int64_t B);
  // Instead of owning it: carves the scratch for M rows / B sequences out of the caller's
  // arena (memory_plan.h's gpu_scratch_bytes of it), valid while `a` holds it. Fails like
  // DeviceArena::allocate (kOutOfBudget) without touching `a` beyond what fitted.
  Status carve_scratch(DeviceArena& a, int64_t M, int64_t B);

  // hidden[B*T, H] = token embedding (+ OPT learned positions).
  void embed(const GpuModelWeights& w, const GpuStep& s, void* hidden, cudaStream_t stream);
  // One transformer layer in place on hidden[B*T, H]; new K/V rows are written into the
  // segments (which must cover sequences [0, B) in order) and attention runs over them.
  void layer(const GpuLayerWeights& L, const GpuStep& s, void* hidden, std::span<const GpuKvSegment> segs,
             cudaStream_t stream);
  // layer() in three parts, for the host-attention path (cpu_cache_compute): qkv() leaves
  // q() [M, q_dim] and k(), v() [M, kv_dim] (bias and rotary applied); attend() is layer()'s
  // attention over the segments into attn() [M, q_dim]; finish() is the output projection and
  // the FFN on attn(), which may instead be filled by the caller.
  void qkv(const GpuLayerWeights& L, const GpuStep& s, const void* hidden, cudaStream_t stream);
  void attend(const GpuStep& s, std::span<const GpuKvSegment> segs, cudaStream_t stream);
  void finish(const GpuLayerWeights& L, const GpuStep& s, void* hidden, cudaStream_t stream);
  void* q() const { return q_; }
  void* k() const { return k_; }
  void* v() const { return v_; }
  void* attn() const { return attn_; }

  // Final norm + lm_head of each sequence's last row: logits device fp32 [B, vocab].
  void head(const GpuModelWeights& w, const GpuStep& s, const void* hidden, float* logits, cudaStream_t stream);

 private:
  Status carve(DeviceArena& a, int64_t M, int64_t B);

  ModelConfig c_;
  DType dt_;
  CublasHandle cublas_;
  DeviceArena scratch_;
  int64_t rows_ = 0, seqs_ = 0;
  void *normed_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr;
  void *ffn_a_ = nullptr, *ffn_b_ = nullptr, *last_ = nullptr;
};

}  // namespace flexh2o::gpu
