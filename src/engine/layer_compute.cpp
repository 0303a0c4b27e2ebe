// Embedding, attention, MLP (OPT / LLaMA) and head on the CPU kernels.
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
// The LLaMA family's RMSNorm (Gemma's multiplies by 1 + gamma).
void rms(const ModelConfig& c, const float* x, int64_t M, int64_t D, const TensorView& gamma, float* y) {
  cpu::rmsnorm(x, M, D, gamma, c.norm_eps, y, c.norm_offset);
}
// The gated MLP's activation: SiLU (SwiGLU) or Gemma's tanh GELU (GeGLU).
void gate_mul(const ModelConfig& c, float* gate, const float* up, int64_t n) {
  if (c.gelu_gate)
    cpu::gelu_tanh_mul(gate, up, n);
  else
    cpu::silu_mul(gate, up, n);
}

}  // namespace

int64_t LayerCompute::unit_scratch_bytes(const ModelConfig& c, int64_t M) {
  const int64_t chunk = std::min(M, kMlpChunkRows);
  int64_t floats = M * c.hidden + 2 * chunk * c.ffn_scratch_dim();
  // MoE: router logits and the shared expert's gate; the choices (int32), their weights, the
  // choices grouped by expert (int64 rows, weights); gathered rows, an expert's output, the sum;
  // the groups' starts and cursors (int64, n_experts + 1 each)
  if (c.moe()) floats += chunk * (c.n_experts + 1 + 5 * c.experts_per_token + 3 * c.hidden) + 4 * (c.n_experts + 1);
  return floats * int64_t(sizeof(float));
}

void LayerCompute::embed(const ModelConfig& c, const ModelWeights& w, const int32_t* ids, const StepShape& s,
                         float* hidden) {
  const int64_t M = s.B * s.T;
  cpu::embedding(ids, M, w.embed, hidden);
  if (c.embed_scale != 1.f)
    for (int64_t i = 0; i < M * c.hidden; ++i) hidden[i] *= c.embed_scale;
  if (c.arch == Arch::kOpt) {
    std::vector<int32_t> rows(s.positions, s.positions + M);
    for (auto& p : rows) p += int32_t(c.position_offset());
    cpu::add_embedding(rows.data(), M, w.pos_embed, hidden);
  }
}

void LayerCompute::qkv(const ModelConfig& c, const LayerWeights& L, const StepShape& s, const float* hidden, float* q,
                       float* k, float* v) {
  const int64_t H = c.hidden, M = s.B * s.T, Q = c.q_dim(), KV = c.kv_dim();
  grow(normed_, M * H);
  if (c.arch == Arch::kOpt)
    cpu::layernorm(hidden, M, H, L.ln1_w, L.ln1_b, c.norm_eps, normed_.data());
  else
    rms(c, hidden, M, H, L.ln1_w, normed_.data());
  cpu::linear(normed_.data(), M, H, L.q_w, bias(L.q_b), q, cpu::Epilogue::kStore);
  cpu::linear(normed_.data(), M, H, L.k_w, bias(L.k_b), k, cpu::Epilogue::kStore);
  cpu::linear(normed_.data(), M, H, L.v_w, bias(L.v_b), v, cpu::Epilogue::kStore);
  if (c.qk_norm_whole) {  // OLMoE: RMSNorm over each row of q and of k
    rms(c, q, M, Q, L.q_norm_w, q);
    rms(c, k, M, KV, L.k_norm_w, k);
  } else if (c.qk_norm) {  // Qwen3: RMSNorm over each head, rows of head_dim
    rms(c, q, M * c.n_heads, c.head_dim, L.q_norm_w, q);
    rms(c, k, M * c.n_kv_heads, c.head_dim, L.k_norm_w, k);
  }
  if (c.arch == Arch::kLlama) {
    const Rope& rope = L.local_rope ? c.rope_local : c.rope;
    const double* f = rope.inv_freq.data();
    const float af = float(rope.attention_factor);
    const int64_t rd = rope.rotary_dims();
    cpu::rotary(q, M, c.n_heads, c.head_dim, Q, s.positions, f, rd, af);
    cpu::rotary(k, M, c.n_kv_heads, c.head_dim, KV, s.positions, f, rd, af);
  }
}

void LayerCompute::attend(const ModelConfig& c, const StepShape& s, const float* q, const float* k, const float* v,
                          const KvSegment& seg, float* attn) {
  if (seg.n_seq == 0) return;
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), row0 = seg.first_seq * s.T;
  check_kv_room(s.seq_keys, seg);
  const int32_t* keys = s.seq_keys + seg.first_seq;
  cpu::write_kv(k + row0 * KV, KV, seg.n_seq, s.T, c.n_kv_heads, c.head_dim, seg.k, seg.dtype, seg.capacity, keys);
  cpu::write_kv(v + row0 * KV, KV, seg.n_seq, s.T, c.n_kv_heads, c.head_dim, seg.v, seg.dtype, seg.capacity, keys);
  cpu::AttentionArgs a;
  a.q = q + row0 * Q;
  a.q_stride = Q;
  a.k = seg.k;
  a.v = seg.v;
  a.kv_dtype = seg.dtype;
  a.batch = seg.n_seq;
  a.tq = s.T;
  a.n_heads = c.n_heads;
  a.kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.capacity = seg.capacity;
  a.seq_keys = keys;
  a.scale = c.attention_scale();
  a.softcap = c.attn_softcap;
  a.window = seg.window;
  a.out = attn + row0 * Q;
  a.out_stride = Q;
  a.key_scores = seg.key_scores;
  cpu::attention(a);
}

void LayerCompute::attention_out(const ModelConfig& c, const LayerWeights& L, const StepShape& s, const float* attn,
                                 float* hidden) {
  const int64_t M = s.B * s.T;
  if (!c.sandwich_norms) return cpu::linear(attn, M, c.q_dim(), L.o_w, bias(L.o_b), hidden, cpu::Epilogue::kAccumulate);
  grow(normed_, M * c.hidden);  // Gemma 2/3: hidden += norm(o_proj(attn))
  cpu::linear(attn, M, c.q_dim(), L.o_w, bias(L.o_b), normed_.data(), cpu::Epilogue::kStore);
  cpu::rmsnorm_add(normed_.data(), M, c.hidden, L.post_attn_norm_w, c.norm_eps, c.norm_offset, hidden);
}

// out[n, H] = down(silu(gate(x)) * up(x)) of an expert of width F, through ffn_a_ / ffn_b_.
void LayerCompute::expert_ffn(const ExpertWeights& w, const float* x, int64_t n, int64_t H, int64_t F, float* out) {
  cpu::linear(x, n, H, w.gate_w, nullptr, ffn_a_.data(), cpu::Epilogue::kStore);
  cpu::linear(x, n, H, w.up_w, nullptr, ffn_b_.data(), cpu::Epilogue::kStore);
  cpu::silu_mul(ffn_a_.data(), ffn_b_.data(), n * F);
  cpu::linear(ffn_a_.data(), n, F, w.down_w, nullptr, out, cpu::Epilogue::kStore);
}

// Each expert runs on the rows that chose it, gathered; a row's sum over its experts is taken in
// expert order in fp32, so it depends on nothing but the row (the determinism contract).
void LayerCompute::moe(const ModelConfig& c, const LayerWeights& L, int64_t m, float* h) {
  const int64_t H = c.hidden, F = c.ffn_dim, E = c.n_experts, k = c.experts_per_token;
  FH_CHECK(int64_t(L.experts.size()) == E, "MoE layer with ", L.experts.size(), " experts, config has ", E);
  grow(router_, m * E);
  grow(route_w_, m * k);
  grow(gathered_, m * H);
  grow(expert_out_, m * H);
  grow(moe_sum_, m * H);
  route_e_.resize(size_t(std::max<int64_t>(int64_t(route_e_.size()), m * k)));
  cpu::linear(normed_.data(), m, H, L.router_w, nullptr, router_.data(), cpu::Epilogue::kStore);
  cpu::moe_route(router_.data(), m, E, k, c.norm_topk_prob, route_e_.data(), route_w_.data());
  // Group the m*k choices by expert in one pass (a counting sort: rows ascending in each group).
  std::vector<int64_t>& start = expert_start_;
  start.assign(size_t(E + 1), 0);
  for (int64_t i = 0; i < m * k; ++i) ++start[size_t(route_e_[size_t(i)]) + 1];
  for (int64_t e = 0; e < E; ++e) start[size_t(e + 1)] += start[size_t(e)];
  expert_rows_.resize(size_t(m * k)), expert_w_.resize(size_t(m * k));
  std::vector<int64_t>& at = expert_at_;
  at.assign(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < m * k; ++i) {
    const size_t g = size_t(at[size_t(route_e_[size_t(i)])]++);
    expert_rows_[g] = i / k, expert_w_[g] = route_w_[size_t(i)];
  }
  std::fill_n(moe_sum_.data(), m * H, 0.f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t g0 = start[size_t(e)], n = start[size_t(e + 1)] - g0;
    if (n == 0) continue;
    const int64_t* rows = expert_rows_.data() + g0;
    for (int64_t i = 0; i < n; ++i) std::copy_n(normed_.data() + rows[i] * H, H, gathered_.data() + i * H);
    expert_ffn(L.experts[size_t(e)], gathered_.data(), n, H, F, expert_out_.data());
    for (int64_t i = 0; i < n; ++i) {
      float* sum = moe_sum_.data() + rows[i] * H;
      const float* y = expert_out_.data() + i * H;
      const float w = expert_w_[size_t(g0 + i)];
      for (int64_t d = 0; d < H; ++d) sum[d] += w * y[d];
    }
  }
  if (const int64_t S = c.shared_expert_dim) {  // Qwen2-MoE: sum += sigmoid(gate . x) * shared(x)
    grow(shared_gate_, m);
    expert_ffn(L.shared_expert, normed_.data(), m, H, S, expert_out_.data());
    cpu::linear(normed_.data(), m, H, L.shared_gate_w, nullptr, shared_gate_.data(), cpu::Epilogue::kStore);
    for (int64_t r = 0; r < m; ++r) {
      const float g = 1.f / (1.f + std::exp(-shared_gate_[size_t(r)]));
      float* sum = moe_sum_.data() + r * H;
      const float* y = expert_out_.data() + r * H;
      for (int64_t d = 0; d < H; ++d) sum[d] += g * y[d];
    }
  }
  for (int64_t i = 0; i < m * H; ++i) h[i] += moe_sum_[size_t(i)];
}

void LayerCompute::mlp(const ModelConfig& c, const LayerWeights& L, const StepShape& s, float* hidden) {
  const int64_t H = c.hidden, M = s.B * s.T, F = c.ffn_dim;
  const bool opt = c.arch == Arch::kOpt;
  const int64_t chunk = std::min(M, kMlpChunkRows);
  grow(normed_, chunk * H);
  grow(ffn_a_, chunk * c.ffn_scratch_dim());
  if (!opt) grow(ffn_b_, chunk * c.ffn_scratch_dim());
  for (int64_t r0 = 0; r0 < M; r0 += chunk) {
    const int64_t m = std::min(chunk, M - r0);
    float* h = hidden + r0 * H;
    if (opt) {
      cpu::layernorm(h, m, H, L.ln2_w, L.ln2_b, c.norm_eps, normed_.data());
      cpu::linear(normed_.data(), m, H, L.fc1_w, bias(L.fc1_b), ffn_a_.data(), cpu::Epilogue::kRelu);
      cpu::linear(ffn_a_.data(), m, F, L.fc2_w, bias(L.fc2_b), h, cpu::Epilogue::kAccumulate);
    } else {
      rms(c, h, m, H, L.ln2_w, normed_.data());
      if (c.moe()) {
        moe(c, L, m, h);
        continue;
      }
      cpu::linear(normed_.data(), m, H, L.gate_w, bias(L.gate_b), ffn_a_.data(), cpu::Epilogue::kStore);
      cpu::linear(normed_.data(), m, H, L.up_w, bias(L.up_b), ffn_b_.data(), cpu::Epilogue::kStore);
      gate_mul(c, ffn_a_.data(), ffn_b_.data(), m * F);
      if (!c.sandwich_norms) {
        cpu::linear(ffn_a_.data(), m, F, L.down_w, bias(L.down_b), h, cpu::Epilogue::kAccumulate);
        continue;
      }
      // Gemma 2/3: h += norm(down(...)); normed_ is free once gate and up have read it.
      cpu::linear(ffn_a_.data(), m, F, L.down_w, bias(L.down_b), normed_.data(), cpu::Epilogue::kStore);
      cpu::rmsnorm_add(normed_.data(), m, H, L.post_ffn_norm_w, c.norm_eps, c.norm_offset, h);
    }
  }
}

void LayerCompute::layer(const ModelConfig& c, const LayerWeights& L, const StepShape& s, float* hidden,
                         std::span<const KvSegment> segs) {
  const int64_t M = s.B * s.T;
  grow(q_, M * c.q_dim());
  grow(k_, M * c.kv_dim());
  grow(v_, M * c.kv_dim());
  grow(attn_, M * c.q_dim());
  qkv(c, L, s, hidden, q_.data(), k_.data(), v_.data());
  int64_t next = 0;
  for (const KvSegment& seg : segs) {
    FH_CHECK(seg.first_seq == next, "KV segments must cover the batch in order");
    attend(c, s, q_.data(), k_.data(), v_.data(), seg, attn_.data());
    next += seg.n_seq;
  }
  FH_CHECK(next == s.B, "KV segments cover ", next, " of ", s.B, " sequences");
  attention_out(c, L, s, attn_.data(), hidden);
  mlp(c, L, s, hidden);
}

void LayerCompute::head_rows(const ModelConfig& c, const ModelWeights& w, const StepShape& s, const float* hidden,
                             int64_t first, int64_t rows, float* logits) {
  const int64_t H = c.hidden, R = rows * s.B;
  grow(normed_, R * H);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t b = 0; b < s.B; ++b)
      std::copy_n(hidden + (b * s.T + first + i) * H, H, normed_.data() + (i * s.B + b) * H);
  head_of_gathered(c, w, R, logits);
}

void LayerCompute::head_of_gathered(const ModelConfig& c, const ModelWeights& w, int64_t R, float* logits) {
  const int64_t H = c.hidden;
  if (c.arch == Arch::kOpt)
    cpu::layernorm(normed_.data(), R, H, w.final_norm_w, w.final_norm_b, c.norm_eps, normed_.data());
  else
    rms(c, normed_.data(), R, H, w.final_norm_w, normed_.data());
  cpu::linear(normed_.data(), R, H, w.lm_head, nullptr, logits, cpu::Epilogue::kStore);
  if (c.final_softcap > 0) cpu::softcap(logits, R * c.vocab_size, c.final_softcap);
}

void LayerCompute::head(const ModelConfig& c, const ModelWeights& w, const StepShape& s, const float* hidden,
                        std::vector<float>& logits) {
  const int64_t H = c.hidden, R = s.B * s.T;
  grow(normed_, R * H);
  std::copy_n(hidden, R * H, normed_.data());
  logits.resize(size_t(R * c.vocab_size));
  head_of_gathered(c, w, R, logits.data());
}

}  // namespace flexh2o
