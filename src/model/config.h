// ModelConfig: the architecture facts the engine needs, parsed from a Hugging Face config.json.
// Supported families: OPT (pre-LN, learned positions offset 2, ReLU FFN, tied lm_head) and
// LLaMA (RMSNorm, rotary, SwiGLU, GQA), which also serves model_type "mistral", "qwen2" (q/k/v
// biases without an o_proj bias), "qwen3" (RMSNorm over each head of q and k), "phi3" (q/k/v
// and gate/up stored fused) and the mixtures of experts "mixtral", "qwen2_moe" (with a shared
// expert), "qwen3_moe" and "olmoe" (q and k normalized over the whole projection), and Gemma: "gemma" (GeGLU,
// norms by 1 + weight, scaled embeddings), "gemma2" (norms after attention and MLP too, tanh soft caps)
// and "gemma3_text" (q/k norms, a rope of its own for the sliding-window layers; also the text model
// of a multimodal "gemma3" checkpoint). Parsing validates
// every field it uses and throws flexh2o::Error naming the file and the key. Plain value type.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/rope.h"

namespace flexh2o {

enum class Arch { kOpt, kLlama };

struct ModelConfig {
  Arch arch = Arch::kOpt;
  std::string model_type;  // "opt" | "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" | "mixtral" | "qwen2_moe" |
                           // "qwen3_moe" | "olmoe" | "gemma" | "gemma2" | "gemma3_text"
  std::string name;        // _name_or_path or the directory name, for reports
  int64_t vocab_size = 0;
  int64_t hidden = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // == n_heads for OPT
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;  // OPT ffn_dim / LLaMA intermediate_size / one expert's (MoE)
  // Mixture of experts (Mixtral, Qwen3-MoE): every layer's MLP is n_experts SwiGLU experts of
  // ffn_dim, of which a linear router picks experts_per_token for each row, weighting their
  // outputs by the softmax of its logits over all experts (renormalized over the chosen ones when
  // norm_topk_prob). n_experts == 0: a dense MLP.
  int64_t n_experts = 0, experts_per_token = 0;
  bool norm_topk_prob = true;
  // Qwen2-MoE: every row also passes a shared SwiGLU expert of this width, its output scaled by
  // sigmoid(shared_expert_gate . x) (0: none).
  int64_t shared_expert_dim = 0;
  // Positions a sequence may use: max_position_embeddings, changed where the rope scaling says
  // (model/detail/rope_parse.h).
  int64_t max_positions = 0;
  // The window of the sliding-window layers (sliding_layers): a query at position p attends to
  // positions (p - sliding_window, p]. 0 when no layer slides.
  int64_t sliding_window = 0;
  float norm_eps = 1e-5f;  // layer_norm eps (OPT) / rms_norm_eps (LLaMA)
  Rope rope;  // LLaMA family: rotary frequencies (rope_theta and any rope scaling)
  bool tie_embeddings = true;
  bool attention_bias = false;  // q/k/v biases (always true for OPT)
  bool o_bias = false;          // the attention output projection's bias (OPT; LLaMA attention_bias)
  bool mlp_bias = false;        // fc/gate/up/down biases (always true for OPT)
  // Phi-3: the checkpoint holds q/k/v as one qkv_proj and gate/up as one gate_up_proj, which the
  // engine reads as row ranges (weights.h: fused_part).
  bool fused_projections = false;
  bool qk_norm = false;  // Qwen3: q and k pass an RMSNorm over each head (q_norm, k_norm) before rotary
  bool qk_norm_whole = false;  // OLMoE: that RMSNorm is over the whole q / k projection, not each head
  // Gemma: the MLP's gate passes the tanh GELU (GeGLU) instead of SiLU; every RMSNorm multiplies
  // by norm_offset + weight (1; 0 elsewhere); token embeddings are multiplied by embed_scale
  // (sqrt(hidden) rounded to the checkpoint's dtype, as transformers does).
  bool gelu_gate = false;
  float norm_offset = 0.f;
  float embed_scale = 1.f;
  // Gemma 2/3: the attention output passes post_attention_layernorm and the MLP output
  // post_feedforward_layernorm before each residual add; the MLP's input norm is
  // pre_feedforward_layernorm (LayerWeights::post_attn_norm_w, ln2_w, post_ffn_norm_w).
  bool sandwich_norms = false;
  // Gemma 2/3: softmax(q.k / sqrt(query_pre_attn_scalar)) instead of / sqrt(head_dim) (0: head_dim).
  int64_t query_pre_attn_scalar = 0;
  // Gemma 2: attention scores and the final logits pass cap * tanh(x / cap) (0: no cap).
  float attn_softcap = 0.f, final_softcap = 0.f;
  // 1 for each layer whose attention is sliding-window (Mistral: all; Gemma 2/3 and Qwen: as
  // layer_types or the model type's rule says); Gemma 3 rotates those layers' q/k by rope_local.
  // Empty when no layer slides.
  std::vector<uint8_t> sliding_layers;
  Rope rope_local;
  bool has_local_rope = false;
  // Gemma 3's text model read from a multimodal (model_type gemma3) checkpoint: its weights are
  // named language_model.model.* (or model.language_model.*); the vision tower is not read.
  bool in_multimodal = false;
  std::optional<int32_t> bos_id, eos_id, pad_id;
  // Every id "eos_token_id" lists (eos_id is the first): LLaMA-3.1-Instruct ends a turn with
  // another than it ends a text with.
  std::vector<int32_t> eos_ids;
  DType dtype = DType::F16;  // torch_dtype: what dummy weights use

  // Parses `path` (a config.json). Throws naming the file and key on any problem.
  static ModelConfig from_file(const std::filesystem::path& path);
  // Parses JSON text; `source` names it in errors.
  static ModelConfig from_json_text(const std::string& text, const std::string& source);

  bool moe() const { return n_experts > 0; }
  // Weights the MLP multiplies one row by (its FLOPs are twice this): a MoE's router, the
  // experts_per_token experts a row runs and the shared expert with its gate, else the FFN.
  double mlp_row_params() const {
    const double H = double(hidden), F = double(ffn_dim);
    if (moe())
      return H * double(n_experts) + double(experts_per_token) * 3 * H * F +
             (shared_expert_dim ? H + 3 * H * double(shared_expert_dim) : 0);
    return (arch == Arch::kOpt ? 2 : 3) * H * F;
  }

  // The widest FFN an MLP runs: the scratch rows it needs.
  int64_t ffn_scratch_dim() const { return shared_expert_dim > ffn_dim ? shared_expert_dim : ffn_dim; }

  // The softmax scale of q.k.
  float attention_scale() const {
    return 1.0f / std::sqrt(float(query_pre_attn_scalar ? query_pre_attn_scalar : head_dim));
  }
  // Whether layer `layer` rotates by rope_local (Gemma 3's sliding-window layers); bind_weights
  // records it in LayerWeights::local_rope.
  bool local_rope_layer(int64_t layer) const {
    return has_local_rope && layer >= 0 && layer < int64_t(sliding_layers.size()) && sliding_layers[size_t(layer)];
  }

  // The attention window of layer `layer` (KvSegment::window): sliding_window for a sliding
  // layer, else 0 (full causal attention).
  int64_t attention_window(int64_t layer) const {
    const bool sliding = layer >= 0 && layer < int64_t(sliding_layers.size()) && sliding_layers[size_t(layer)];
    return sliding ? sliding_window : 0;
  }

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Bytes of one token's K and V rows in one layer, all KV heads, at `kv_dtype` (a Q4 row is a
  // record of row_nbytes: codes and group scales); times n_layers in kv_bytes_per_token.
  int64_t kv_layer_bytes_per_token(DType kv_dtype) const {
    return 2 * n_kv_heads * int64_t(row_nbytes(kv_dtype, head_dim));
  }
  int64_t kv_bytes_per_token(DType kv_dtype) const { return n_layers * kv_layer_bytes_per_token(kv_dtype); }
  // OPT learned positions are stored with an offset of 2.
  int64_t position_offset() const { return arch == Arch::kOpt ? 2 : 0; }
};

// Throws flexh2o::Error "<what> token id N is outside the vocabulary [0, V)" for the first id of
// `ids` outside c's table (a tokenizer of another model, a request's own ids).
void check_token_ids(std::span<const int32_t> ids, const ModelConfig& c, const char* what);

}  // namespace flexh2o
