// The weights a model family reads: a spec (every tensor with its HF name and shape), the
// bound views the forward pass uses, and the sources that provide them (a safetensors
// or PyTorch checkpoint, or deterministic dummy values for shapes no machine here can hold).
// Views point into memory owned by the Model (mapped files or dummy buffers).
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace flexh2o {

class TensorArchive;

// Which half of a transformer layer a tensor belongs to (FlexGen streams them separately).
enum class LayerPart : uint8_t { kNone, kAttention, kMlp };

struct WeightSpec {
  std::string name;  // Hugging Face parameter name, e.g. "model.decoder.layers.3.fc1.weight"
  Shape shape;
  int layer = -1;  // transformer layer index, or -1 for embeddings / final norm / lm_head
  LayerPart part = LayerPart::kNone;  // attention (first norm, q/k/v/o) or MLP (second norm, FFN)
};

// Every tensor the engine reads for `c`, in model order (embeddings, layers, head).
// A tied lm_head is not listed (it is the token embedding).
std::vector<WeightSpec> weight_specs(const ModelConfig& c);

// Where a tensor of a checkpoint with fused projections (ModelConfig::fused_projections, Phi-3)
// lives: rows [row0, row0 + the spec's rows) of the 2-D tensor `fused`, of fused_rows rows.
struct FusedPart {
  std::string fused;  // e.g. "model.layers.3.self_attn.qkv_proj.weight"
  int64_t row0 = 0, fused_rows = 0;
};
// The fused tensor a spec is a part of (q/k/v of qkv_proj, gate/up of gate_up_proj), or nullopt.
std::optional<FusedPart> fused_part(const ModelConfig& c, const WeightSpec& spec);

// One expert of a mixture-of-experts MLP: a SwiGLU without biases.
struct ExpertWeights {
  TensorView gate_w, up_w, down_w;  // Mixtral's w1, w3, w2
};

// One transformer layer. Unused fields stay empty (e.g. LLaMA has no biases or ln*_b;
// OPT has no gate/up/down; a MoE layer has router_w and experts instead of gate/up/down).
struct LayerWeights {
  TensorView ln1_w, ln1_b;  // self_attn_layer_norm / input_layernorm
  TensorView q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;
  TensorView ln2_w, ln2_b;  // final_layer_norm / post_attention_layernorm
  TensorView fc1_w, fc1_b, fc2_w, fc2_b;  // OPT: fc1 = up (ReLU), fc2 = down
  TensorView gate_w, up_w, down_w;        // LLaMA SwiGLU
  TensorView gate_b, up_b, down_b;
  TensorView q_norm_w, k_norm_w;  // Qwen3: [head_dim] gains of the per-head RMSNorm of q and k
  TensorView router_w;            // MoE: [n_experts, hidden]
  std::vector<ExpertWeights> experts;  // MoE: n_experts of them
  ExpertWeights shared_expert;         // Qwen2-MoE: of shared_expert_dim
  TensorView shared_gate_w;            // Qwen2-MoE: [1, hidden]
  // Gemma 2/3 (ModelConfig::sandwich_norms): post_attention_layernorm over the attention output
  // and post_feedforward_layernorm over the MLP's (ln2_w is then pre_feedforward_layernorm).
  TensorView post_attn_norm_w, post_ffn_norm_w;
  // Not a weight: this layer rotates q/k by ModelConfig::rope_local (Gemma 3's sliding-window
  // layers), set by bind_weights from ModelConfig::local_rope_layer.
  bool local_rope = false;

  // Every view of the layer, for code that rewrites or visits them all (compression, offload
  // remapping, hazard tracking), so a field added here is never missed there.
  std::vector<TensorView*> all() {
    std::vector<TensorView*> v{&ln1_w,
                               &ln1_b,
                               &q_w,
                               &q_b,
                               &k_w,
                               &k_b,
                               &v_w,
                               &v_b,
                               &o_w,
                               &o_b,
                               &ln2_w,
                               &ln2_b,
                               &fc1_w,
                               &fc1_b,
                               &fc2_w,
                               &fc2_b,
                               &gate_w,
                               &up_w,
                               &down_w,
                               &gate_b,
                               &up_b,
                               &down_b,
                               &q_norm_w,
                               &k_norm_w,
                               &router_w,
                               &shared_expert.gate_w,
                               &shared_expert.up_w,
                               &shared_expert.down_w,
                               &shared_gate_w,
                               &post_attn_norm_w,
                               &post_ffn_norm_w};
    for (ExpertWeights& e : experts) v.insert(v.end(), {&e.gate_w, &e.up_w, &e.down_w});
    return v;
  }
  std::vector<const TensorView*> all() const {
    const std::vector<TensorView*> mut = const_cast<LayerWeights*>(this)->all();
    return {mut.begin(), mut.end()};
  }
};

struct ModelWeights {
  TensorView embed;      // [vocab, hidden]
  TensorView pos_embed;  // OPT only: [max_positions + 2, hidden]
  std::vector<LayerWeights> layers;
  TensorView final_norm_w, final_norm_b;
  TensorView lm_head;  // [vocab, hidden]; the embedding when tied
};

// One bound tensor: its spec and where its bytes are.
struct BoundTensor {
  WeightSpec spec;
  TensorView view;
};

// Looks a tensor up for a spec; returns an empty view when absent.
using WeightLookup = std::function<TensorView(const WeightSpec&)>;

// Binds every spec through `lookup`, checking presence, float dtype and shape. Throws
// flexh2o::Error naming the tensor, the shape found and the shape config.json implies.
// `source` names the checkpoint in messages.
// When `bound` is given it receives every spec with its view, in weight_specs() order.
ModelWeights bind_weights(const ModelConfig& c, const WeightLookup& lookup, const std::string& source,
                          std::vector<BoundTensor>* bound = nullptr);

// Refuses (throws Error naming `source`) a config whose num_hidden_layers the checkpoint cannot
// hold: the last layer's tensors must all be found through `lookup`, and `tensors_held` (the
// checkpoint's tensor count) must cover every layer's. Cheap: builds one layer's specs only.
void check_layer_count(const ModelConfig& c, const WeightLookup& lookup, size_t tensors_held,
                       const std::string& source);

// The part of a model one pipeline stage runs: global layers [first, end) of `total`, plus
// the embedding on the first stage and the final norm + lm_head on the last.
struct StageRange {
  int64_t first = 0, end = 0, total = 0;
  bool embed() const { return first == 0; }
  bool head() const { return end == total; }
  bool whole() const { return embed() && head(); }
};

// A loaded model: config + bound weights + whatever owns the bytes. Move-only.
class Model {
 public:
  // Loads DIR/config.json and DIR's checkpoint (loader/checkpoint.h: safetensors preferred, else
  // pytorch_model.bin; single or sharded), mmapped, no copies.
  static Model load_dir(const std::filesystem::path& dir);
  // Deterministic random weights (not constant: constants hide indexing bugs) in c.dtype.
  // `on_progress(bytes made, bytes to make)`, when given, is called after each tensor.
  static Model dummy(const ModelConfig& c, uint64_t seed = 0,
                     const std::function<void(uint64_t done, uint64_t total)>& on_progress = {});
  // The host memory dummy(c) fills: every tensor, in c.dtype.
  static uint64_t dummy_bytes(const ModelConfig& c);

  // Layers [first, end) as a model of their own that shares this one's bytes (which stay owned
  // while either lives): config().n_layers = end - first, layer specs renumbered from 0 (HF names
  // unchanged), no embedding tensors unless first == 0, no final norm / lm_head unless end is
  // the last layer (a tied lm_head stays reachable as weights().embed for the head). Throws
  // Error when the range is empty or outside the model. Of a stage: the same as its range.
  Model stage(int64_t first, int64_t end) const;
  // The range this model is of the loaded one (the whole model unless made by stage()).
  const StageRange& stage_range() const { return stage_; }

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // Every tensor in weight_specs() order (a tied lm_head is not listed: it is the embedding).
  const std::vector<BoundTensor>& tensors() const { return tensors_; }
  bool is_dummy() const { return dummy_; }
  // Identifies the bytes (one shard_fingerprint() line per checkpoint file: name, size, inode,
  // mtime, ctime, header hash; or the dummy seed), so an offload store written from another
  // checkpoint is never reused. Unbounded length: the store keeps only its digest.
  const std::string& signature() const { return signature_; }
  // Names of the checkpoint's tensors that no weight of this config reads, sorted (load_dir;
  // empty for dummy weights): a checkpoint made for a variant this config does not describe.
  // Rotary frequency buffers and a multimodal checkpoint's vision tower are not listed. A stage
  // keeps the whole checkpoint's list.
  const std::vector<std::string>& unused_tensors() const { return unused_; }
  // Lets the resident pages of a weight go (MappedFile::release): for a caller that copied the
  // `bytes` at `p` elsewhere (the device, a converted copy, the offload store) and will not read
  // them here soon. A later read is still correct, only slower. Views outside the checkpoint's
  // mappings, and dummy weights, are left alone. Thread-safe.
  void release_pages(const void* p, size_t bytes) const noexcept;
  // Total bytes of the bound weights (tied lm_head counted once).
  size_t weight_bytes() const;
  int64_t parameter_count() const;

 private:
  ModelConfig config_;
  ModelWeights weights_;
  std::vector<BoundTensor> tensors_;
  std::shared_ptr<void> owner_;
  std::shared_ptr<const TensorArchive> archive_;  // the mapped checkpoint (null for dummy weights)
  bool dummy_ = false;
  std::string signature_;
  std::vector<std::string> unused_;
  StageRange stage_;
};

}  // namespace flexh2o
