// CudaDevice unit ops on the compute stream: embedding, attention (q/k/v, per-segment KV write
// and attention, output projection), the MLP in row chunks, the head, and KV compaction; the
// same sequence of operations as engine/layer_compute.cpp, with activations in F16/BF16. Q4
// weights (2-D: linear layers, embeddings, lm_head) and Q4 KV caches are read compressed.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "engine/layer_compute.h"
#include "gpu/detail/cuda_device_impl.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/q4.h"

namespace flexh2o::gpu {
namespace {
const void* ptr(const TensorView& v) { return v.empty() ? nullptr : v.data; }
// The LLaMA family's RMSNorm (Gemma's multiplies by 1 + gamma).
void rms(const ModelConfig& c, DType dt, const void* x, int64_t M, int64_t D, const TensorView& gamma, void* y,
         cudaStream_t st) {
  rmsnorm(dt, x, M, D, gamma.data, c.norm_eps, y, st, c.norm_offset);
}
}  // namespace

TierCharge CudaDevice::reserve(const ModelConfig& c, int64_t rows, int64_t seqs, TierBudget& budget) {
  TierCharge charge;
  TierCharge::reserve(budget, device_scratch_bytes(DeviceKind::kCuda, c, dt_, rows), "compute scratch", &charge)
      .throw_if_error();
  // One scratch serves every batch state on this device (pipeline groups swap theirs in without
  // a new reserve), so it only grows: sized for the largest rows and seqs asked so far, never
  // for a later, smaller caller's.
  if (rows <= rows_ && seqs <= seqs_ && scratch_) return charge;
  rows = std::max(rows, rows_), seqs = std::max(seqs, seqs_);
  synchronize();
  bind_thread();
  if (scratch_) FH_CUDA_CHECK(cudaFree(scratch_));
  scratch_ = nullptr;
  rows_ = seqs_ = 0;
  const CudaScratch sz = cuda_scratch(c, dt_, rows);
  const cudaError_t e = cudaMalloc(&scratch_, sz.allocation());
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    FH_FAIL("the GPU cannot allocate ", sz.allocation(), " bytes of compute scratch for steps of ", rows,
            " rows; lower the micro-batch or the prompt length");
  }
  FH_CUDA_CHECK(e);
  char* p = static_cast<char*>(scratch_);
  normed_ = p;
  ffn_a_ = p += sz.normed;
  ffn_b_ = p += sz.ffn_chunk;
  dq_ = p += sz.ffn_chunk;
  moe_logits_ = reinterpret_cast<float*>(p += sz.dequant);
  moe_experts_ = reinterpret_cast<int32_t*>(p += sz.moe_logits);
  moe_weights_ = reinterpret_cast<float*>(p += sz.moe_list);
  moe_rows_ = reinterpret_cast<int32_t*>(p += sz.moe_list);
  moe_row_w_ = reinterpret_cast<float*>(p += sz.moe_list);
  moe_counts_ = reinterpret_cast<int32_t*>(p += sz.moe_list);
  moe_x_ = p += sz.moe_counts;
  moe_out_ = p += sz.moe_x;
  moe_sum_ = reinterpret_cast<float*>(p += sz.moe_out);
  dq_bytes_ = sz.dequant;
  rows_ = rows, seqs_ = seqs;
  return charge;
}

void CudaDevice::linear_w(const TensorView& w, const void* x, int64_t M, int64_t K, int64_t N, const TensorView& b,
                          void* y, Epilogue ep) {
  cudaStream_t st = stream(Queue::kCompute);
  if (w.dtype == DType::Q4) linear_q4(cublas_, dt_, x, M, K, w.data, N, ptr(b), y, ep, dq_, dq_bytes_, st);
  else linear(cublas_, dt_, x, M, K, w.data, N, ptr(b), y, ep, st);
}

void CudaDevice::linear_f32out_w(const TensorView& w, const void* x, int64_t M, int64_t K, int64_t N, float* y) {
  cudaStream_t st = stream(Queue::kCompute);
  if (w.dtype == DType::Q4)
    linear_q4_f32out(cublas_, dt_, x, M, K, w.data, N, y, dq_, dq_bytes_, st);
  else
    linear_f32out(cublas_, dt_, x, M, K, w.data, N, y, st);
}

void CudaDevice::expert_ffn(const ExpertWeights& w, const void* x, int64_t n, int64_t H, int64_t F, void* out) {
  linear_w(w.gate_w, x, n, H, F, TensorView(), ffn_a_, Epilogue::kStore);
  linear_w(w.up_w, x, n, H, F, TensorView(), ffn_b_, Epilogue::kStore);
  silu_mul(dt_, ffn_a_, ffn_b_, n * F, stream(Queue::kCompute));
  linear_w(w.down_w, ffn_a_, n, F, H, TensorView(), out, Epilogue::kStore);
}

void CudaDevice::embed(const ModelConfig& c, const ModelWeights& w, const StepRows& r, void* hidden) {
  const int64_t M = r.n * r.T;
  cudaStream_t st = stream(Queue::kCompute);
  if (w.embed.dtype == DType::Q4) q4_embedding(dt_, r.ids, M, w.embed.data, w.embed.shape[0], c.hidden, hidden, false, st);
  else embedding(dt_, r.ids, M, w.embed.data, w.embed.shape[0], c.hidden, hidden, st);
  if (c.embed_scale != 1.f) scale(dt_, hidden, M * c.hidden, c.embed_scale, st);
  if (c.arch != Arch::kOpt) return;
  if (w.pos_embed.dtype == DType::Q4)
    q4_embedding(dt_, r.pos_rows, M, w.pos_embed.data, w.pos_embed.shape[0], c.hidden, hidden, true, st);
  else
    add_embedding(dt_, r.pos_rows, M, w.pos_embed.data, w.pos_embed.shape[0], c.hidden, hidden, st);
}

void CudaDevice::attention_in(const ModelConfig& c, const LayerWeights& L, const StepRows& r, const void* hidden,
                              void* q, void* k, void* v) {
  const int64_t H = c.hidden, M = r.n * r.T, Q = c.q_dim(), KV = c.kv_dim();
  FH_CHECK(M <= rows_, "CUDA device: reserve() covers ", rows_, " rows, the step has ", M);
  cudaStream_t st = stream(Queue::kCompute);
  if (c.arch == Arch::kOpt) layernorm(dt_, hidden, M, H, L.ln1_w.data, ptr(L.ln1_b), c.norm_eps, normed_, st);
  else
    rms(c, dt_, hidden, M, H, L.ln1_w, normed_, st);
  linear_w(L.q_w, normed_, M, H, Q, L.q_b, q, Epilogue::kStore);
  linear_w(L.k_w, normed_, M, H, KV, L.k_b, k, Epilogue::kStore);
  linear_w(L.v_w, normed_, M, H, KV, L.v_b, v, Epilogue::kStore);
  if (c.qk_norm_whole) {  // OLMoE: RMSNorm over each row of q and of k (in place)
    rms(c, dt_, q, M, c.q_dim(), L.q_norm_w, q, st);
    rms(c, dt_, k, M, KV, L.k_norm_w, k, st);
  } else if (c.qk_norm) {  // Qwen3: RMSNorm over each head, rows of head_dim (in place)
    rms(c, dt_, q, M * c.n_heads, c.head_dim, L.q_norm_w, q, st);
    rms(c, dt_, k, M * c.n_kv_heads, c.head_dim, L.k_norm_w, k, st);
  }
  if (c.arch == Arch::kLlama) {
    const Rope& rope = L.local_rope ? c.rope_local : c.rope;
    const RotaryTable table =
        rotary_table(rope.inv_freq.data(), int64_t(rope.inv_freq.size()), float(rope.attention_factor));
    rotary(dt_, q, M, c.n_heads, c.head_dim, Q, r.positions, table, st);
    rotary(dt_, k, M, c.n_kv_heads, c.head_dim, KV, r.positions, table, st);
  }
}

void CudaDevice::attend(const ModelConfig& c, const StepRows& r, const void* q, const void* k, const void* v,
                        std::span<const KvSegment> segs, void* attn) {
  const int64_t Q = c.q_dim(), KV = c.kv_dim();
  const size_t es = dtype_size(dt_);
  auto at = [&](const void* base, int64_t elems) {
    return static_cast<const std::byte*>(base) + size_t(elems) * es;
  };
  cudaStream_t st = stream(Queue::kCompute);
  for (const KvSegment& seg : segs) {
    if (seg.n_seq == 0) continue;
    if (r.host_seq_keys) check_kv_room(r.host_seq_keys, seg);
    const int64_t row0 = seg.first_seq * r.T;
    const int32_t* keys = r.seq_keys + seg.first_seq;
    write_kv(dt_, at(k, row0 * KV), KV, seg.n_seq, r.T, c.n_kv_heads, c.head_dim, seg.k, seg.dtype, seg.capacity, keys,
             st);
    write_kv(dt_, at(v, row0 * KV), KV, seg.n_seq, r.T, c.n_kv_heads, c.head_dim, seg.v, seg.dtype, seg.capacity, keys,
             st);
    AttentionArgs a;
    a.dtype = dt_;
    a.kv_dtype = seg.dtype;
    a.q = at(q, row0 * Q);
    a.q_stride = Q;
    a.k = seg.k;
    a.v = seg.v;
    a.batch = seg.n_seq;
    a.tq = r.T;
    a.n_heads = c.n_heads;
    a.kv_heads = c.n_kv_heads;
    a.head_dim = c.head_dim;
    a.capacity = seg.capacity;
    a.seq_keys = keys;
    a.max_keys = std::min(r.max_keys, seg.capacity);
    a.scale = c.attention_scale();
    a.softcap = c.attn_softcap;
    a.window = seg.window;
    a.out = const_cast<std::byte*>(at(attn, row0 * Q));
    a.out_stride = Q;
    a.key_scores = seg.key_scores;
    attention(a, st);
  }
}

void CudaDevice::attention_out(const ModelConfig& c, const LayerWeights& L, const StepRows& r, const void* attn,
                               void* hidden) {
  const int64_t M = r.n * r.T;
  if (!c.sandwich_norms) return linear_w(L.o_w, attn, M, c.q_dim(), c.hidden, L.o_b, hidden, Epilogue::kAccumulate);
  FH_CHECK(M <= rows_, "CUDA device: reserve() covers ", rows_, " rows, the step has ", M);
  // Gemma 2/3: hidden += norm(o_proj(attn)), through the normed rows' scratch
  linear_w(L.o_w, attn, M, c.q_dim(), c.hidden, L.o_b, normed_, Epilogue::kStore);
  rmsnorm_add(dt_, normed_, M, c.hidden, L.post_attn_norm_w.data, c.norm_eps, c.norm_offset, hidden,
              stream(Queue::kCompute));
}

void CudaDevice::mlp(const ModelConfig& c, const LayerWeights& L, const StepRows& r, void* hidden) {
  const int64_t H = c.hidden, M = r.n * r.T, F = c.ffn_dim, chunk = std::min(M, kMlpChunkRows);
  FH_CHECK(M <= rows_, "CUDA device: reserve() covers ", rows_, " rows, the step has ", M);
  cudaStream_t st = stream(Queue::kCompute);
  const size_t es = dtype_size(dt_);
  for (int64_t r0 = 0; r0 < M; r0 += chunk) {
    const int64_t m = std::min(chunk, M - r0);
    void* h = static_cast<std::byte*>(hidden) + size_t(r0 * H) * es;
    if (c.arch == Arch::kOpt) {
      layernorm(dt_, h, m, H, L.ln2_w.data, ptr(L.ln2_b), c.norm_eps, normed_, st);
      linear_w(L.fc1_w, normed_, m, H, F, L.fc1_b, ffn_a_, Epilogue::kRelu);
      linear_w(L.fc2_w, ffn_a_, m, F, H, L.fc2_b, h, Epilogue::kAccumulate);
    } else if (c.moe()) {
      rms(c, dt_, h, m, H, L.ln2_w, normed_, st);
      moe(c, L, m, h);
    } else {
      rms(c, dt_, h, m, H, L.ln2_w, normed_, st);
      linear_w(L.gate_w, normed_, m, H, F, L.gate_b, ffn_a_, Epilogue::kStore);
      linear_w(L.up_w, normed_, m, H, F, L.up_b, ffn_b_, Epilogue::kStore);
      if (c.gelu_gate)
        gelu_tanh_mul(dt_, ffn_a_, ffn_b_, m * F, st);
      else
        silu_mul(dt_, ffn_a_, ffn_b_, m * F, st);
      if (!c.sandwich_norms) {
        linear_w(L.down_w, ffn_a_, m, F, H, L.down_b, h, Epilogue::kAccumulate);
        continue;
      }
      // Gemma 2/3: h += norm(down(...)); normed_ is free once gate and up have read it
      linear_w(L.down_w, ffn_a_, m, F, H, L.down_b, normed_, Epilogue::kStore);
      rmsnorm_add(dt_, normed_, m, H, L.post_ffn_norm_w.data, c.norm_eps, c.norm_offset, h, st);
    }
  }
}

// The rows are grouped by expert on the device; the group sizes come back to the host (the one
// synchronisation of the compute stream, which only the compute queue's thread waits for) so
// that each expert's GEMMs run on its rows alone.
void CudaDevice::moe(const ModelConfig& c, const LayerWeights& L, int64_t m, void* h) {
  const int64_t H = c.hidden, F = c.ffn_dim, E = c.n_experts, k = c.experts_per_token;
  FH_CHECK(int64_t(L.experts.size()) == E, "MoE layer with ", L.experts.size(), " experts, config has ", E);
  cudaStream_t st = stream(Queue::kCompute);
  linear_f32out_w(L.router_w, normed_, m, H, E, moe_logits_);
  moe_route(moe_logits_, m, E, k, c.norm_topk_prob, moe_experts_, moe_weights_, st);
  moe_group(moe_experts_, moe_weights_, m, k, E, moe_counts_, moe_counts_ + E, moe_rows_, moe_row_w_, st);
  moe_host_counts_.resize(size_t(E));
  FH_CUDA_CHECK(
      cudaMemcpyAsync(moe_host_counts_.data(), moe_counts_, size_t(E) * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  FH_CUDA_CHECK(cudaMemsetAsync(moe_sum_, 0, size_t(m * H) * sizeof(float), st));
  FH_CUDA_CHECK(cudaStreamSynchronize(st));
  const size_t row = size_t(H) * dtype_size(dt_);
  int64_t at = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = moe_host_counts_[size_t(e)];
    FH_CHECK(n >= 0 && at + n <= m * k, "MoE grouping gave expert ", e, " ", n, " rows");
    if (n == 0) continue;
    gpu::gather_rows(moe_rows_ + at, n, normed_, m, int64_t(row), moe_x_, st);
    expert_ffn(L.experts[size_t(e)], moe_x_, n, H, F, moe_out_);
    moe_scatter_add(dt_, moe_out_, moe_rows_ + at, moe_row_w_ + at, n, H, moe_sum_, st);
    at += n;
  }
  FH_CHECK(at == m * k, "MoE grouping placed ", at, " of ", m * k, " choices");
  if (const int64_t S = c.shared_expert_dim) {  // Qwen2-MoE: sum += sigmoid(gate . x) * shared(x)
    float* gate = moe_logits_ + m * E;  // the logits' scratch holds n_experts + 1 a row
    expert_ffn(L.shared_expert, normed_, m, H, S, moe_out_);
    linear_f32out_w(L.shared_gate_w, normed_, m, H, 1, gate);
    moe_gated_add(dt_, moe_out_, gate, m, H, moe_sum_, st);
  }
  add_f32(dt_, h, moe_sum_, m * H, st);
}

void CudaDevice::head(const ModelConfig& c, const ModelWeights& w, const StepRows& r, const void* hidden,
                      int64_t first, int64_t rows, float* logits) {
  const int64_t H = c.hidden, m = rows * r.n;
  FH_CHECK(r.n <= seqs_, "CUDA device: reserve() covers ", seqs_, " sequences, the step has ", r.n);
  FH_CHECK(first >= 0 && rows >= 1 && first + rows <= r.T, "head of rows [", first, ", ", first + rows,
           ") of a step of ", r.T);
  FH_CHECK(m <= rows_, "CUDA device: reserve() covers ", rows_, " rows, the head has ", m);
  cudaStream_t st = stream(Queue::kCompute);
  const size_t bytes = size_t(H) * dtype_size(dt_);
  // Row first + i of each sequence (rows first + i, first + i + T, ... of hidden) to rows
  // i * n .. i * n + n - 1 of normed_, the logits' order; one sequence's rows are one run.
  const auto* from = static_cast<const std::byte*>(hidden) + size_t(first) * bytes;
  if (r.n == 1)
    FH_CUDA_CHECK(cudaMemcpyAsync(normed_, from, size_t(rows) * bytes, cudaMemcpyDeviceToDevice, st));
  else
    for (int64_t i = 0; i < rows; ++i)
      FH_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<std::byte*>(normed_) + size_t(i * r.n) * bytes, bytes,
                                      from + size_t(i) * bytes, size_t(r.T) * bytes, bytes, size_t(r.n),
                                      cudaMemcpyDeviceToDevice, st));
  if (c.arch == Arch::kOpt)
    layernorm(dt_, normed_, m, H, w.final_norm_w.data, ptr(w.final_norm_b), c.norm_eps, normed_, st);
  else
    rms(c, dt_, normed_, m, H, w.final_norm_w, normed_, st);
  linear_f32out_w(w.lm_head, normed_, m, H, c.vocab_size, logits);
  if (c.final_softcap > 0) softcap_f32(logits, m * c.vocab_size, c.final_softcap, st);
}

void CudaDevice::kv_gather(void* buf, DType dt, int64_t rows, int64_t capacity, int64_t row_elems,
                           const int32_t* keep, int64_t keep_stride, const int32_t* count) {
  gpu::kv_gather(dt, buf, rows, 1, capacity, row_elems, keep, keep_stride, count, stream(Queue::kCompute));
}

}  // namespace flexh2o::gpu
