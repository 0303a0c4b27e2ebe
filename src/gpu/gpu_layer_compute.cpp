// Embedding, transformer layer (OPT / LLaMA) and head on the CUDA ops; the same sequence of
// operations as engine/layer_compute.cpp, with activations in F16/BF16 (fp32 accumulation).
#include "gpu/gpu_layer_compute.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"
#include "gpu/device_info.h"
#include "gpu/memory_plan.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace flexh2o::gpu {

GpuLayerCompute::GpuLayerCompute(const ModelConfig& c, DType dt) : c_(c), dt_(dt) {
  FH_CHECK(dtype_supported(dt), "GPU compute dtype must be F16 or BF16, got ", dtype_name(dt));
  FH_CHECK(attention_supported(dt, c.head_dim), "attention on CUDA supports head_dim 64 and 128; ", c.name,
           " has head_dim ", c.head_dim, " (use --device cpu)");
}

size_t GpuLayerCompute::scratch_bytes(const ModelConfig& c, DType dt, int64_t M, int64_t B) {
  return gpu_scratch_bytes(c, dt, M, B);
}

Status GpuLayerCompute::carve(DeviceArena& a, int64_t M, int64_t B) {
  const std::array<int64_t, 8> e = gpu_scratch_elems(c_, M, B);
  void** ptrs[8] = {&normed_, &q_, &k_, &v_, &attn_, &ffn_a_, &ffn_b_, &last_};
  const size_t es = dtype_size(dt_);
  for (size_t i = 0; i < 8; ++i)
    if (Status s = a.allocate(size_t(e[i]) * es + 1, ptrs[i], kTensorAlign); !s.ok()) return s;
  rows_ = M, seqs_ = B;
  return Status::Ok();
}

void GpuLayerCompute::reserve(int64_t M, int64_t B) {
  if (M <= rows_ && B <= seqs_) return;
  M = std::max(M, rows_), B = std::max(B, seqs_);
  scratch_ = DeviceArena();  // free the old slab first
  rows_ = seqs_ = 0;
  const size_t need = scratch_bytes(c_, dt_, M, B);
  if (!DeviceArena::create(need, &scratch_).ok()) {
    const DeviceInfo d = current_device_info();
    FH_FAIL(fit_error("the activations of a step of " + std::to_string(M) + " rows", need, d.free_bytes,
                      d.total_bytes, d.name, "lower --batch-size or the prompt length"));
  }
  carve(scratch_, M, B).throw_if_error();
}

Status GpuLayerCompute::carve_scratch(DeviceArena& a, int64_t M, int64_t B) {
  scratch_ = DeviceArena();
  rows_ = seqs_ = 0;
  return carve(a, M, B);
}

void GpuLayerCompute::embed(const GpuModelWeights& w, const GpuStep& s, void* hidden, cudaStream_t stream) {
  const int64_t M = s.B * s.T;
  embedding(dt_, s.ids, M, w.embed, c_.vocab_size, c_.hidden, hidden, stream);
  if (c_.arch == Arch::kOpt)
    add_embedding(dt_, s.pos_rows, M, w.pos_embed, c_.max_positions + c_.position_offset(), c_.hidden, hidden,
                  stream);
}

void GpuLayerCompute::layer(const GpuLayerWeights& L, const GpuStep& s, void* hidden,
                            std::span<const GpuKvSegment> segs, cudaStream_t stream) {
  qkv(L, s, hidden, stream);
  attend(s, segs, stream);
  finish(L, s, hidden, stream);
}

void GpuLayerCompute::qkv(const GpuLayerWeights& L, const GpuStep& s, const void* hidden, cudaStream_t stream) {
  const int64_t H = c_.hidden, M = s.B * s.T, Q = c_.q_dim(), KV = c_.kv_dim();
  FH_CHECK(M <= rows_ && s.B <= seqs_, "GpuLayerCompute: reserve(", M, ", ", s.B, ") was not called");
  if (c_.arch == Arch::kOpt)
    layernorm(dt_, hidden, M, H, L.ln1_w, L.ln1_b, c_.norm_eps, normed_, stream);
  else
    rmsnorm(dt_, hidden, M, H, L.ln1_w, c_.norm_eps, normed_, stream);
  linear(cublas_, dt_, normed_, M, H, L.q_w, Q, L.q_b, q_, Epilogue::kStore, stream);
  linear(cublas_, dt_, normed_, M, H, L.k_w, KV, L.k_b, k_, Epilogue::kStore, stream);
  linear(cublas_, dt_, normed_, M, H, L.v_w, KV, L.v_b, v_, Epilogue::kStore, stream);
  if (c_.arch != Arch::kOpt) {
    rotary(dt_, q_, M, c_.n_heads, c_.head_dim, Q, s.positions, c_.rope_theta, stream);
    rotary(dt_, k_, M, c_.n_kv_heads, c_.head_dim, KV, s.positions, c_.rope_theta, stream);
  }
}

void GpuLayerCompute::attend(const GpuStep& s, std::span<const GpuKvSegment> segs, cudaStream_t stream) {
  const int64_t Q = c_.q_dim(), KV = c_.kv_dim();
  const size_t es = dtype_size(dt_);
  auto at = [&](void* base, int64_t elems) { return static_cast<char*>(base) + size_t(elems) * es; };
  int64_t next = 0;
  for (const GpuKvSegment& seg : segs) {
    FH_CHECK(seg.first_seq == next, "KV segments must cover the batch in order");
    next += seg.n_seq;
    if (seg.n_seq == 0) continue;
    const int64_t row0 = seg.first_seq * s.T;
    const int32_t* keys = s.seq_keys + seg.first_seq;
    write_kv(dt_, at(k_, row0 * KV), KV, seg.n_seq, s.T, c_.n_kv_heads, c_.head_dim, seg.k, seg.capacity, keys,
             stream);
    write_kv(dt_, at(v_, row0 * KV), KV, seg.n_seq, s.T, c_.n_kv_heads, c_.head_dim, seg.v, seg.capacity, keys,
             stream);
    AttentionArgs a;
    a.dtype = dt_;
    a.q = at(q_, row0 * Q);
    a.q_stride = Q;
    a.k = seg.k;
    a.v = seg.v;
    a.batch = seg.n_seq;
    a.tq = s.T;
    a.n_heads = c_.n_heads;
    a.kv_heads = c_.n_kv_heads;
    a.head_dim = c_.head_dim;
    a.capacity = seg.capacity;
    a.seq_keys = keys;
    a.max_keys = std::min(s.max_keys, seg.capacity);
    a.scale = 1.0f / std::sqrt(float(c_.head_dim));
    a.out = at(attn_, row0 * Q);
    a.out_stride = Q;
    a.key_scores = seg.key_scores;
    attention(a, stream);
  }
  FH_CHECK(next == s.B, "KV segments cover ", next, " of ", s.B, " sequences");
}

void GpuLayerCompute::finish(const GpuLayerWeights& L, const GpuStep& s, void* hidden, cudaStream_t stream) {
  const int64_t H = c_.hidden, M = s.B * s.T, Q = c_.q_dim(), F = c_.ffn_dim;
  const bool opt = c_.arch == Arch::kOpt;
  linear(cublas_, dt_, attn_, M, Q, L.o_w, H, L.o_b, hidden, Epilogue::kAccumulate, stream);
  if (opt)
    layernorm(dt_, hidden, M, H, L.ln2_w, L.ln2_b, c_.norm_eps, normed_, stream);
  else
    rmsnorm(dt_, hidden, M, H, L.ln2_w, c_.norm_eps, normed_, stream);
  if (opt) {
    linear(cublas_, dt_, normed_, M, H, L.fc1_w, F, L.fc1_b, ffn_a_, Epilogue::kRelu, stream);
    linear(cublas_, dt_, ffn_a_, M, F, L.fc2_w, H, L.fc2_b, hidden, Epilogue::kAccumulate, stream);
  } else {
    linear(cublas_, dt_, normed_, M, H, L.gate_w, F, L.gate_b, ffn_a_, Epilogue::kStore, stream);
    linear(cublas_, dt_, normed_, M, H, L.up_w, F, L.up_b, ffn_b_, Epilogue::kStore, stream);
    silu_mul(dt_, ffn_a_, ffn_b_, M * F, stream);
    linear(cublas_, dt_, ffn_a_, M, F, L.down_w, H, L.down_b, hidden, Epilogue::kAccumulate, stream);
  }
}

void GpuLayerCompute::head(const GpuModelWeights& w, const GpuStep& s, const void* hidden, float* logits,
                           cudaStream_t stream) {
  const int64_t H = c_.hidden;
  FH_CHECK(s.B <= seqs_, "GpuLayerCompute: reserve() was not called for ", s.B, " sequences");
  const size_t row = size_t(H) * dtype_size(dt_);
  // Each sequence's last row: rows T-1, 2T-1, ... of hidden.
  FH_CUDA_CHECK(cudaMemcpy2DAsync(last_, row, static_cast<const char*>(hidden) + size_t(s.T - 1) * row,
                                  size_t(s.T) * row, row, size_t(s.B), cudaMemcpyDeviceToDevice, stream));
  if (c_.arch == Arch::kOpt)
    layernorm(dt_, last_, s.B, H, w.final_norm_w, w.final_norm_b, c_.norm_eps, last_, stream);
  else
    rmsnorm(dt_, last_, s.B, H, w.final_norm_w, c_.norm_eps, last_, stream);
  linear_f32out(cublas_, dt_, last_, s.B, H, w.lm_head, c_.vocab_size, logits, stream);
}

}  // namespace flexh2o::gpu
