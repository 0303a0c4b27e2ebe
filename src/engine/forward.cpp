// Forward pass of OPT and LLaMA on the CPU kernels: embed, layers, final norm, lm_head.
#include "engine/forward.h"

#include <cmath>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace flexh2o {
namespace {

void grow(std::vector<float>& v, int64_t n) {
  if (v.size() < size_t(n)) v.resize(size_t(n));
}

const TensorView* opt_bias(const TensorView& b) { return b.empty() ? nullptr : &b; }

}  // namespace

void Forward::step(const int32_t* ids, const int32_t* positions, int64_t T, KvCache& cache, LogitsRows rows,
                   std::vector<float>& logits) {
  const ModelConfig& c = model_.config();
  const ModelWeights& w = model_.weights();
  const int64_t B = cache.batch(), H = c.hidden, M = B * T;
  FH_CHECK(T > 0, "step needs at least one token");
  FH_CHECK(cache.length() + T <= cache.capacity(), "KV cache full: length ", cache.length(), " + ", T,
           " > capacity ", cache.capacity());
  for (int64_t i = 0; i < M; ++i) {
    FH_CHECK(positions[i] >= 0 && positions[i] < c.max_positions, "position ", positions[i],
             " outside the model's ", c.max_positions, " positions");
  }
  grow(hidden_, M * H);
  dev_.run([&] {
    cpu::embedding(ids, M, w.embed, hidden_.data());
    if (c.arch == Arch::kOpt) {
      std::vector<int32_t> rows_pos(positions, positions + M);
      for (auto& p : rows_pos) p += int32_t(c.position_offset());
      cpu::add_embedding(rows_pos.data(), M, w.pos_embed, hidden_.data());
    }
    for (int i = 0; i < c.n_layers; ++i) layer(i, B, T, positions, cache);

    // Final norm and lm_head over the requested rows only.
    const int64_t R = rows == LogitsRows::kAll ? M : B;
    grow(last_, R * H);
    if (rows == LogitsRows::kAll) {
      std::copy(hidden_.begin(), hidden_.begin() + M * H, last_.begin());
    } else {
      for (int64_t b = 0; b < B; ++b)
        std::copy_n(hidden_.data() + ((b * T) + T - 1) * H, H, last_.data() + b * H);
    }
    if (c.arch == Arch::kOpt)
      cpu::layernorm(last_.data(), R, H, w.final_norm_w, w.final_norm_b, c.norm_eps, last_.data());
    else
      cpu::rmsnorm(last_.data(), R, H, w.final_norm_w, c.norm_eps, last_.data());
    logits.resize(size_t(R * c.vocab_size));
    cpu::linear(last_.data(), R, H, w.lm_head, nullptr, logits.data(), cpu::Epilogue::kStore);
  });
  cache.set_length(cache.length() + T);
}

void Forward::layer(int i, int64_t B, int64_t T, const int32_t* positions, KvCache& cache) {
  const ModelConfig& c = model_.config();
  const LayerWeights& L = model_.weights().layers[size_t(i)];
  const int64_t H = c.hidden, M = B * T, Q = c.q_dim(), KV = c.kv_dim(), F = c.ffn_dim;
  const bool opt = c.arch == Arch::kOpt;
  grow(normed_, M * H);
  grow(q_, M * Q);
  grow(k_, M * KV);
  grow(v_, M * KV);
  grow(attn_, M * Q);

  // --- attention block ---
  if (opt)
    cpu::layernorm(hidden_.data(), M, H, L.ln1_w, L.ln1_b, c.norm_eps, normed_.data());
  else
    cpu::rmsnorm(hidden_.data(), M, H, L.ln1_w, c.norm_eps, normed_.data());
  cpu::linear(normed_.data(), M, H, L.q_w, opt_bias(L.q_b), q_.data(), cpu::Epilogue::kStore);
  cpu::linear(normed_.data(), M, H, L.k_w, opt_bias(L.k_b), k_.data(), cpu::Epilogue::kStore);
  cpu::linear(normed_.data(), M, H, L.v_w, opt_bias(L.v_b), v_.data(), cpu::Epilogue::kStore);
  if (!opt) {
    cpu::rotary(q_.data(), M, c.n_heads, c.head_dim, Q, positions, c.rope_theta);
    cpu::rotary(k_.data(), M, c.n_kv_heads, c.head_dim, KV, positions, c.rope_theta);
  }
  const int64_t slot0 = cache.length();
  cpu::write_kv(k_.data(), KV, B, T, c.n_kv_heads, c.head_dim, cache.k(i), cache.capacity(), slot0);
  cpu::write_kv(v_.data(), KV, B, T, c.n_kv_heads, c.head_dim, cache.v(i), cache.capacity(), slot0);

  cpu::AttentionArgs a;
  a.q = q_.data();
  a.q_stride = Q;
  a.k = cache.k(i);
  a.v = cache.v(i);
  a.batch = B;
  a.tq = T;
  a.n_heads = c.n_heads;
  a.kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.capacity = cache.capacity();
  a.n_keys = slot0 + T;
  a.key_start = cache.key_start().data();
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  a.out = attn_.data();
  a.out_stride = Q;
  cpu::attention(a);
  cpu::linear(attn_.data(), M, Q, L.o_w, opt_bias(L.o_b), hidden_.data(), cpu::Epilogue::kAccumulate);

  // --- MLP block ---
  if (opt)
    cpu::layernorm(hidden_.data(), M, H, L.ln2_w, L.ln2_b, c.norm_eps, normed_.data());
  else
    cpu::rmsnorm(hidden_.data(), M, H, L.ln2_w, c.norm_eps, normed_.data());
  grow(ffn_a_, M * F);
  if (opt) {
    cpu::linear(normed_.data(), M, H, L.fc1_w, opt_bias(L.fc1_b), ffn_a_.data(), cpu::Epilogue::kRelu);
    cpu::linear(ffn_a_.data(), M, F, L.fc2_w, opt_bias(L.fc2_b), hidden_.data(), cpu::Epilogue::kAccumulate);
  } else {
    grow(ffn_b_, M * F);
    cpu::linear(normed_.data(), M, H, L.gate_w, opt_bias(L.gate_b), ffn_a_.data(), cpu::Epilogue::kStore);
    cpu::linear(normed_.data(), M, H, L.up_w, opt_bias(L.up_b), ffn_b_.data(), cpu::Epilogue::kStore);
    cpu::silu_mul(ffn_a_.data(), ffn_b_.data(), M * F);
    cpu::linear(ffn_a_.data(), M, F, L.down_w, opt_bias(L.down_b), hidden_.data(), cpu::Epilogue::kAccumulate);
  }
}

}  // namespace flexh2o
