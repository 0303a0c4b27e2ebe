// Embedding, transformer layer (OPT / LLaMA) and head on the CPU kernels.
#include "engine/layer_compute.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace flexh2o {
namespace {

void grow(std::vector<float>& v, int64_t n) {
  if (v.size() < size_t(n)) v.resize(size_t(n));
}
const TensorView* bias(const TensorView& b) { return b.empty() ? nullptr : &b; }

}  // namespace

int64_t LayerCompute::scratch_bytes(const ModelConfig& c, int64_t M) {
  const int64_t floats = M * (c.hidden + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.ffn_dim);
  return floats * int64_t(sizeof(float));
}

void LayerCompute::embed(const ModelConfig& c, const ModelWeights& w, const int32_t* ids, const StepShape& s,
                         float* hidden) {
  const int64_t M = s.B * s.T;
  cpu::embedding(ids, M, w.embed, hidden);
  if (c.arch == Arch::kOpt) {
    std::vector<int32_t> rows(s.positions, s.positions + M);
    for (auto& p : rows) p += int32_t(c.position_offset());
    cpu::add_embedding(rows.data(), M, w.pos_embed, hidden);
  }
}

void LayerCompute::qkv(const ModelConfig& c, const LayerWeights& L, const StepShape& s, const float* hidden) {
  const int64_t H = c.hidden, M = s.B * s.T, Q = c.q_dim(), KV = c.kv_dim();
  grow(normed_, M * H);
  grow(q_, M * Q);
  grow(k_, M * KV);
  grow(v_, M * KV);
  grow(attn_, M * Q);
  if (c.arch == Arch::kOpt)
    cpu::layernorm(hidden, M, H, L.ln1_w, L.ln1_b, c.norm_eps, normed_.data());
  else
    cpu::rmsnorm(hidden, M, H, L.ln1_w, c.norm_eps, normed_.data());
  cpu::linear(normed_.data(), M, H, L.q_w, bias(L.q_b), q_.data(), cpu::Epilogue::kStore);
  cpu::linear(normed_.data(), M, H, L.k_w, bias(L.k_b), k_.data(), cpu::Epilogue::kStore);
  cpu::linear(normed_.data(), M, H, L.v_w, bias(L.v_b), v_.data(), cpu::Epilogue::kStore);
  if (c.arch == Arch::kLlama) {
    cpu::rotary(q_.data(), M, c.n_heads, c.head_dim, Q, s.positions, c.rope_theta);
    cpu::rotary(k_.data(), M, c.n_kv_heads, c.head_dim, KV, s.positions, c.rope_theta);
  }
}

void LayerCompute::load_qkv(const ModelConfig& c, const StepShape& s, const float* q, const float* k,
                            const float* v) {
  const int64_t M = s.B * s.T, Q = c.q_dim(), KV = c.kv_dim();
  grow(q_, M * Q);
  grow(k_, M * KV);
  grow(v_, M * KV);
  grow(attn_, M * Q);
  std::copy_n(q, M * Q, q_.data());
  std::copy_n(k, M * KV, k_.data());
  std::copy_n(v, M * KV, v_.data());
}

void LayerCompute::load_attn(const ModelConfig& c, const StepShape& s, const float* attn) {
  const int64_t n = s.B * s.T * c.q_dim();
  grow(attn_, n);
  std::copy_n(attn, n, attn_.data());
}

void LayerCompute::attend(const ModelConfig& c, const StepShape& s, const KvSegment& seg) {
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), row0 = seg.first_seq * s.T;
  const int32_t* keys = s.seq_keys + seg.first_seq;
  for (int64_t b = 0; b < seg.n_seq; ++b)
    FH_CHECK(keys[b] <= seg.capacity, "KV cache full: sequence needs ", keys[b], " slots, capacity ", seg.capacity);
  cpu::write_kv(k_.data() + row0 * KV, KV, seg.n_seq, s.T, c.n_kv_heads, c.head_dim, seg.k, seg.capacity, keys);
  cpu::write_kv(v_.data() + row0 * KV, KV, seg.n_seq, s.T, c.n_kv_heads, c.head_dim, seg.v, seg.capacity, keys);
  cpu::AttentionArgs a;
  a.q = q_.data() + row0 * Q;
  a.q_stride = Q;
  a.k = seg.k;
  a.v = seg.v;
  a.batch = seg.n_seq;
  a.tq = s.T;
  a.n_heads = c.n_heads;
  a.kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.capacity = seg.capacity;
  a.seq_keys = keys;
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  a.out = attn_.data() + row0 * Q;
  a.out_stride = Q;
  a.key_scores = seg.key_scores;
  cpu::attention(a);
}

void LayerCompute::finish(const ModelConfig& c, const LayerWeights& L, const StepShape& s, float* hidden) {
  const int64_t H = c.hidden, M = s.B * s.T, Q = c.q_dim(), F = c.ffn_dim;
  const bool opt = c.arch == Arch::kOpt;
  cpu::linear(attn_.data(), M, Q, L.o_w, bias(L.o_b), hidden, cpu::Epilogue::kAccumulate);
  if (opt)
    cpu::layernorm(hidden, M, H, L.ln2_w, L.ln2_b, c.norm_eps, normed_.data());
  else
    cpu::rmsnorm(hidden, M, H, L.ln2_w, c.norm_eps, normed_.data());
  grow(ffn_a_, M * F);
  if (opt) {
    cpu::linear(normed_.data(), M, H, L.fc1_w, bias(L.fc1_b), ffn_a_.data(), cpu::Epilogue::kRelu);
    cpu::linear(ffn_a_.data(), M, F, L.fc2_w, bias(L.fc2_b), hidden, cpu::Epilogue::kAccumulate);
  } else {
    grow(ffn_b_, M * F);
    cpu::linear(normed_.data(), M, H, L.gate_w, bias(L.gate_b), ffn_a_.data(), cpu::Epilogue::kStore);
    cpu::linear(normed_.data(), M, H, L.up_w, bias(L.up_b), ffn_b_.data(), cpu::Epilogue::kStore);
    cpu::silu_mul(ffn_a_.data(), ffn_b_.data(), M * F);
    cpu::linear(ffn_a_.data(), M, F, L.down_w, bias(L.down_b), hidden, cpu::Epilogue::kAccumulate);
  }
}

void LayerCompute::layer(const ModelConfig& c, const LayerWeights& L, const StepShape& s, float* hidden,
                         std::span<const KvSegment> segs) {
  qkv(c, L, s, hidden);
  int64_t next = 0;
  for (const KvSegment& seg : segs) {
    FH_CHECK(seg.first_seq == next, "KV segments must cover the batch in order");
    if (seg.n_seq > 0) attend(c, s, seg);
    next += seg.n_seq;
  }
  FH_CHECK(next == s.B, "KV segments cover ", next, " of ", s.B, " sequences");
  finish(c, L, s, hidden);
}

void LayerCompute::head(const ModelConfig& c, const ModelWeights& w, const StepShape& s, const float* hidden,
                        bool last_only, std::vector<float>& logits) {
  const int64_t H = c.hidden, R = last_only ? s.B : s.B * s.T;
  grow(last_, R * H);
  if (last_only) {
    for (int64_t b = 0; b < s.B; ++b) std::copy_n(hidden + (b * s.T + s.T - 1) * H, H, last_.data() + b * H);
  } else {
    std::copy_n(hidden, R * H, last_.data());
  }
  if (c.arch == Arch::kOpt)
    cpu::layernorm(last_.data(), R, H, w.final_norm_w, w.final_norm_b, c.norm_eps, last_.data());
  else
    cpu::rmsnorm(last_.data(), R, H, w.final_norm_w, c.norm_eps, last_.data());
  logits.resize(size_t(R * c.vocab_size));
  cpu::linear(last_.data(), R, H, w.lm_head, nullptr, logits.data(), cpu::Epilogue::kStore);
}

}  // namespace flexh2o
