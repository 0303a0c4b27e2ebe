// Weight specs per family, binding with shape checks, and the checkpoint / dummy sources.
#include "model/weights.h"

#include <tbb/parallel_for.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string_view>

#include "core/error.h"
#include "loader/checkpoint.h"
#include "offload/store_identity.h"

namespace flexh2o {
namespace {

// Where the transformer's tensors live: OPT's model.decoder., LLaMA's model., and the text model of
// a multimodal Gemma 3 checkpoint (as transformers saves it; load_dir also accepts the layout it
// uses in memory, model.language_model.).
std::string base_prefix(const ModelConfig& c) {
  return c.arch == Arch::kOpt ? "model.decoder." : c.in_multimodal ? "language_model.model." : "model.";
}
std::string layer_prefix(const ModelConfig& c, int i) { return base_prefix(c) + "layers." + std::to_string(i) + "."; }

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

}  // namespace

namespace {

// The token table's and an untied head's names in a checkpoint.
std::string embed_name(const ModelConfig& c) {
  return c.arch == Arch::kOpt ? "model.decoder.embed_tokens.weight" : base_prefix(c) + "embed_tokens.weight";
}
std::string head_name(const ModelConfig& c) {
  return c.in_multimodal ? "language_model.lm_head.weight" : "lm_head.weight";
}

// Appends the specs of layer `i` (i >= 0) or, for i == -1, of the tensors outside the layers
// that come before them (embeddings), for i == -2 those after them (final norm, lm_head).
void append_specs(const ModelConfig& c, int i, std::vector<WeightSpec>& s) {
  const int64_t H = c.hidden, V = c.vocab_size, F = c.ffn_dim, Q = c.q_dim(), KV = c.kv_dim();
  const int layer = i >= 0 ? i : -1;
  auto add = [&](std::string name, Shape shape) {
    LayerPart part = LayerPart::kNone;
    if (layer >= 0) {
      const bool mlp = name.find(".fc1.") != std::string::npos || name.find(".fc2.") != std::string::npos ||
                       name.find("final_layer_norm") != std::string::npos || name.find(".mlp.") != std::string::npos ||
                       name.find(".block_sparse_moe.") != std::string::npos ||
                       name.find("feedforward_layernorm") != std::string::npos ||
                       (name.find("post_attention_layernorm") != std::string::npos && !c.sandwich_norms);
      part = mlp ? LayerPart::kMlp : LayerPart::kAttention;
    }
    s.push_back({std::move(name), shape, layer, part});
  };
  if (i == -1) {
    add(embed_name(c), {V, H});
    if (c.arch == Arch::kOpt) add("model.decoder.embed_positions.weight", {c.max_positions + 2, H});
    return;
  }
  if (i == -2) {
    if (c.arch == Arch::kOpt) {
      add("model.decoder.final_layer_norm.weight", {H});
      add("model.decoder.final_layer_norm.bias", {H});
    } else {
      add(base_prefix(c) + "norm.weight", {H});
    }
    if (!c.tie_embeddings) add(head_name(c), {V, H});
    return;
  }
  const std::string p = layer_prefix(c, i);
  if (c.arch == Arch::kOpt) {
    add(p + "self_attn_layer_norm.weight", {H});
    add(p + "self_attn_layer_norm.bias", {H});
    for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
      add(p + "self_attn." + n + ".weight", {H, H});
      add(p + "self_attn." + n + ".bias", {H});
    }
    add(p + "self_attn.out_proj.weight", {H, H});
    add(p + "self_attn.out_proj.bias", {H});
    add(p + "final_layer_norm.weight", {H});
    add(p + "final_layer_norm.bias", {H});
    add(p + "fc1.weight", {F, H});
    add(p + "fc1.bias", {F});
    add(p + "fc2.weight", {H, F});
    add(p + "fc2.bias", {H});
    return;
  }
  add(p + "input_layernorm.weight", {H});
  const std::pair<const char*, Shape> proj[] = {
      {"q_proj", {Q, H}}, {"k_proj", {KV, H}}, {"v_proj", {KV, H}}, {"o_proj", {H, Q}}};
  for (const auto& [n, shape] : proj) {
    add(p + "self_attn." + n + ".weight", shape);
    if (std::string_view(n) == "o_proj" ? c.o_bias : c.attention_bias) add(p + "self_attn." + n + ".bias", {shape[0]});
  }
  if (c.qk_norm) {  // per head (Qwen3) or over the whole projection (OLMoE)
    add(p + "self_attn.q_norm.weight", {c.qk_norm_whole ? Q : c.head_dim});
    add(p + "self_attn.k_norm.weight", {c.qk_norm_whole ? KV : c.head_dim});
  }
  add(p + "post_attention_layernorm.weight", {H});
  if (c.sandwich_norms) {  // Gemma 2/3: the MLP's input norm and its output's
    add(p + "pre_feedforward_layernorm.weight", {H});
    add(p + "post_feedforward_layernorm.weight", {H});
  }
  if (c.moe()) {  // the names each family's checkpoints use
    const bool mixtral = c.model_type == "mixtral";
    const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
    add(moe + "gate.weight", {c.n_experts, H});
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const std::string x = moe + "experts." + std::to_string(e) + ".";
      add(x + (mixtral ? "w1" : "gate_proj") + ".weight", {F, H});
      add(x + (mixtral ? "w3" : "up_proj") + ".weight", {F, H});
      add(x + (mixtral ? "w2" : "down_proj") + ".weight", {H, F});
    }
    if (const int64_t S = c.shared_expert_dim) {
      add(moe + "shared_expert.gate_proj.weight", {S, H});
      add(moe + "shared_expert.up_proj.weight", {S, H});
      add(moe + "shared_expert.down_proj.weight", {H, S});
      add(moe + "shared_expert_gate.weight", {1, H});
    }
    return;
  }
  const std::pair<const char*, Shape> mlp[] = {{"gate_proj", {F, H}}, {"up_proj", {F, H}}, {"down_proj", {H, F}}};
  for (const auto& [n, shape] : mlp) {
    add(p + "mlp." + n + ".weight", shape);
    if (c.mlp_bias) add(p + "mlp." + n + ".bias", {shape[0]});
  }
}

}  // namespace

std::optional<FusedPart> fused_part(const ModelConfig& c, const WeightSpec& spec) {
  if (!c.fused_projections || spec.layer < 0) return std::nullopt;
  const std::string p = layer_prefix(c, spec.layer);
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), F = c.ffn_dim;
  const std::string qkv = p + "self_attn.qkv_proj.weight", gate_up = p + "mlp.gate_up_proj.weight";
  if (spec.name == p + "self_attn.q_proj.weight") return FusedPart{qkv, 0, Q + 2 * KV};
  if (spec.name == p + "self_attn.k_proj.weight") return FusedPart{qkv, Q, Q + 2 * KV};
  if (spec.name == p + "self_attn.v_proj.weight") return FusedPart{qkv, Q + KV, Q + 2 * KV};
  if (spec.name == p + "mlp.gate_proj.weight") return FusedPart{gate_up, 0, 2 * F};
  if (spec.name == p + "mlp.up_proj.weight") return FusedPart{gate_up, F, 2 * F};
  return std::nullopt;
}

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  std::vector<WeightSpec> s;
  append_specs(c, -1, s);
  for (int i = 0; i < c.n_layers; ++i) append_specs(c, i, s);
  append_specs(c, -2, s);
  return s;
}

void check_layer_count(const ModelConfig& c, const WeightLookup& lookup, size_t tensors_held,
                       const std::string& source) {
  std::vector<WeightSpec> last;
  append_specs(c, int(c.n_layers - 1), last);
  auto stored_name = [&](const WeightSpec& spec) {  // as the checkpoint names it
    const std::optional<FusedPart> part = fused_part(c, spec);
    return part ? part->fused : spec.name;
  };
  std::set<std::string> held;
  for (const WeightSpec& spec : last) held.insert(stored_name(spec));
  const size_t needed = held.size() * size_t(c.n_layers);
  std::string missing;
  for (const WeightSpec& spec : last)
    if (missing.empty() && lookup(spec).empty()) missing = stored_name(spec);
  if (missing.empty() && tensors_held >= needed) return;
  FH_FAIL(source, ": config.json says num_hidden_layers = ", c.n_layers, " (", needed,
          " layer tensors) but the checkpoint holds ", tensors_held, " tensors",
          missing.empty() ? std::string() : " and tensor \"" + missing + "\" is missing",
          "; config.json and the weights disagree.");
}

namespace {

// The slot of a MoE tensor named `n` (append_specs' names: the router "...gate.weight",
// "...experts.E.{w1,w3,w2|gate_proj,up_proj,down_proj}.weight" and Qwen2-MoE's
// "...shared_expert.{gate,up,down}_proj.weight" and "...shared_expert_gate.weight"), or nullptr.
TensorView* moe_slot(const ModelConfig& c, const std::string& n, LayerWeights& L) {
  if (!c.moe()) return nullptr;
  if (n.ends_with(".gate.weight")) return &L.router_w;
  if (n.ends_with(".shared_expert_gate.weight")) return &L.shared_gate_w;
  const size_t shared = n.find(".shared_expert."), at = n.find(".experts.");
  if (shared == std::string::npos && at == std::string::npos) return nullptr;
  ExpertWeights* xp = &L.shared_expert;
  size_t end = shared + 15;
  if (shared == std::string::npos) {
    end = at + 9;
    const size_t e = size_t(std::stoll(n.substr(end)));
    end = n.find('.', end) + 1;
    FH_CHECK(e < L.experts.size(), "expert index of ", n, " out of range");
    xp = &L.experts[e];
  }
  ExpertWeights& x = *xp;
  const std::string_view what = std::string_view(n).substr(end);
  if (what == "w1.weight" || what == "gate_proj.weight") return &x.gate_w;
  if (what == "w3.weight" || what == "up_proj.weight") return &x.up_w;
  if (what == "w2.weight" || what == "down_proj.weight") return &x.down_w;
  FH_FAIL("weight spec ", n, " has no slot");
}

}  // namespace

ModelWeights bind_weights(const ModelConfig& c, const WeightLookup& lookup, const std::string& source,
                          std::vector<BoundTensor>* bound) {
  ModelWeights w;
  w.layers.resize(size_t(c.n_layers));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    w.layers[i].experts.resize(size_t(c.n_experts));
    w.layers[i].local_rope = c.local_rope_layer(int64_t(i));
  }
  for (const WeightSpec& spec : weight_specs(c)) {
    TensorView v = lookup(spec);
    if (v.empty()) {
      const std::optional<FusedPart> part = fused_part(c, spec);  // name it as the checkpoint would
      FH_FAIL(source, ": tensor \"", part ? part->fused : spec.name, "\" is missing (required by config.json)");
    }
    if (!is_float(v.dtype))
      FH_FAIL(source, ": tensor \"", spec.name, "\" has dtype ", dtype_name(v.dtype),
              "; weights must be F32, F16 or BF16");
    if (v.shape != spec.shape)
      FH_FAIL(source, ": tensor \"", spec.name, "\" has shape ", v.shape.str(), " but config.json implies ",
              spec.shape.str());
    if (bound) bound->push_back({spec, v});
    const std::string& n = spec.name;
    auto ends = [&](const char* suffix) {
      size_t len = std::char_traits<char>::length(suffix);
      return n.size() >= len && n.compare(n.size() - len, len, suffix) == 0;
    };
    if (spec.layer < 0) {
      if (ends("embed_tokens.weight")) w.embed = v;
      else if (ends("embed_positions.weight")) w.pos_embed = v;
      else if (ends("norm.weight") || ends("final_layer_norm.weight")) w.final_norm_w = v;
      else if (ends("final_layer_norm.bias")) w.final_norm_b = v;
      else if (ends("lm_head.weight")) w.lm_head = v;
      continue;
    }
    LayerWeights& L = w.layers[size_t(spec.layer)];
    if (TensorView* slot = moe_slot(c, n, L)) {
      *slot = v;
      continue;
    }
    if (c.sandwich_norms && (ends("post_attention_layernorm.weight") || ends("feedforward_layernorm.weight"))) {
      (ends("post_attention_layernorm.weight")    ? L.post_attn_norm_w
       : ends("pre_feedforward_layernorm.weight") ? L.ln2_w
                                                  : L.post_ffn_norm_w) = v;
      continue;
    }
    const std::pair<const char*, TensorView*> table[] = {{"self_attn_layer_norm.weight", &L.ln1_w},
                                                         {"self_attn_layer_norm.bias", &L.ln1_b},
                                                         {"input_layernorm.weight", &L.ln1_w},
                                                         {"post_attention_layernorm.weight", &L.ln2_w},
                                                         {"final_layer_norm.weight", &L.ln2_w},
                                                         {"final_layer_norm.bias", &L.ln2_b},
                                                         {"q_proj.weight", &L.q_w},
                                                         {"q_proj.bias", &L.q_b},
                                                         {"k_proj.weight", &L.k_w},
                                                         {"k_proj.bias", &L.k_b},
                                                         {"v_proj.weight", &L.v_w},
                                                         {"v_proj.bias", &L.v_b},
                                                         {"out_proj.weight", &L.o_w},
                                                         {"out_proj.bias", &L.o_b},
                                                         {"o_proj.weight", &L.o_w},
                                                         {"o_proj.bias", &L.o_b},
                                                         {"fc1.weight", &L.fc1_w},
                                                         {"fc1.bias", &L.fc1_b},
                                                         {"fc2.weight", &L.fc2_w},
                                                         {"fc2.bias", &L.fc2_b},
                                                         {"gate_proj.weight", &L.gate_w},
                                                         {"gate_proj.bias", &L.gate_b},
                                                         {"up_proj.weight", &L.up_w},
                                                         {"up_proj.bias", &L.up_b},
                                                         {"down_proj.weight", &L.down_w},
                                                         {"down_proj.bias", &L.down_b},
                                                         {"q_norm.weight", &L.q_norm_w},
                                                         {"k_norm.weight", &L.k_norm_w}};
    bool bound = false;
    for (const auto& [suffix, slot] : table) {
      if (ends(suffix)) {
        *slot = v;
        bound = true;
        break;
      }
    }
    FH_CHECK(bound, "weight spec ", n, " has no slot");
  }
  if (c.tie_embeddings) w.lm_head = w.embed;
  return w;
}

namespace {
// Tensors a checkpoint may hold that no text model reads: old LLaMA checkpoints' rotary
// frequency buffers, and a multimodal checkpoint's vision tower and projector (its text model
// is what runs).
bool expected_unread(std::string_view name) {
  if (name.ends_with("rotary_emb.inv_freq")) return true;
  for (std::string_view part : {"vision_tower.", "multi_modal_projector.", "vision_model."})
    if (name.starts_with(part) || name.find(std::string(".") + std::string(part)) != std::string_view::npos)
      return true;
  return false;
}
}  // namespace

Model Model::load_dir(const std::filesystem::path& dir) {
  Model m;
  m.config_ = ModelConfig::from_file(dir / "config.json");
  auto archive = std::make_shared<TensorArchive>(open_checkpoint_dir(dir));
  // Some OPT checkpoints drop the "model." prefix, and a multimodal Gemma 3's text model may be
  // saved as model.language_model.* (transformers' names in memory); accept either spelling.
  std::set<const TensorEntry*> read;  // every tensor a weight (or the tie check) reads
  auto find = [&](const std::string& name) -> const TensorEntry* {
    const TensorEntry* e = archive->find(name);
    static constexpr std::string_view kSaved = "language_model.model.";
    if (!e && name.starts_with(kSaved)) e = archive->find("model.language_model." + name.substr(kSaved.size()));
    else if (!e && name.rfind("model.", 0) == 0) e = archive->find(name.substr(6));
    if (e) read.insert(e);
    return e;
  };
  auto lookup = [&](const WeightSpec& spec) -> TensorView {
    if (const TensorEntry* e = find(spec.name)) return e->view;
    const std::optional<FusedPart> part = fused_part(m.config_, spec);
    const TensorEntry* e = part ? find(part->fused) : nullptr;
    if (!e) return {};
    if (!is_float(e->view.dtype)) return e->view;  // bind_weights names the dtype
    const Shape want{part->fused_rows, spec.shape[1]};
    if (e->view.shape != want)
      FH_FAIL(dir.string(), ": tensor \"", part->fused, "\" has shape ", e->view.shape.str(),
              " but config.json implies ", want.str());
    TensorView v = e->view;  // rows are contiguous: a row range is a view at an offset
    v.data = static_cast<const std::byte*>(v.data) + size_t(part->row0 * want[1]) * dtype_size(v.dtype);
    v.shape = spec.shape;
    return v;
  };
  // As transformers' tie_weights(): a config that ties the head to the token table, over a
  // checkpoint holding a head of its own with other values, is wrong; that head is used.
  if (m.config_.tie_embeddings) {
    const TensorEntry *head = find(head_name(m.config_)), *embed = find(embed_name(m.config_));
    if (head && embed &&
        (head->view.dtype != embed->view.dtype || head->view.shape != embed->view.shape ||
         std::memcmp(head->view.data, embed->view.data, head->view.nbytes()) != 0))
      m.config_.tie_embeddings = false;
  }
  // Before bind_weights builds per-layer specs and slots: a small checkpoint whose config.json
  // claims a million layers is refused here, not after gigabytes of bookkeeping.
  check_layer_count(m.config_, lookup, archive->tensors().size(), dir.string());
  m.weights_ = bind_weights(m.config_, lookup, dir.string(), &m.tensors_);
  m.stage_ = {0, m.config_.n_layers, m.config_.n_layers};
  m.owner_ = archive;
  m.archive_ = archive;
  for (const MappedFile& f : archive->files()) m.signature_ += shard_fingerprint(f) + "\n";
  for (const TensorEntry& t : archive->tensors())
    if (!read.contains(&t) && !expected_unread(t.name)) m.unused_.push_back(t.name);
  return m;
}

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Fills `n` elements of `dtype` at `out` with center + U(-amp, amp), deterministic in (seed, name).
void fill_uniform(void* out, DType dtype, int64_t n, uint64_t seed, float center, float amp) {
  constexpr int64_t kChunk = 1 << 20;
  tbb::parallel_for(int64_t(0), (n + kChunk - 1) / kChunk, [&](int64_t chunk) {
    uint64_t s = seed ^ (uint64_t(chunk) * 0xd1b54a32d192ed03ull);
    int64_t lo = chunk * kChunk, hi = std::min(n, lo + kChunk);
    for (int64_t i = lo; i < hi; ++i) {
      float u = float(splitmix64(s) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      float v = center + amp * (2.f * u - 1.f);
      switch (dtype) {
        case DType::F32: static_cast<float*>(out)[i] = v; break;
        case DType::F16: static_cast<uint16_t*>(out)[i] = f32_to_f16(v); break;
        case DType::BF16: static_cast<uint16_t*>(out)[i] = f32_to_bf16(v); break;
        default: break;
      }
    }
  });
}

}  // namespace

uint64_t Model::dummy_bytes(const ModelConfig& c) {
  uint64_t total = 0;
  for (const WeightSpec& spec : weight_specs(c)) total += TensorView{nullptr, c.dtype, spec.shape}.nbytes();
  return total;
}

Model Model::dummy(const ModelConfig& c, uint64_t seed, const std::function<void(uint64_t, uint64_t)>& on_progress) {
  Model m;
  m.config_ = c;
  m.dummy_ = true;
  auto buffers = std::make_shared<std::vector<std::unique_ptr<std::byte[]>>>();
  const uint64_t total = on_progress ? dummy_bytes(c) : 0;
  uint64_t done = 0;
  auto lookup = [&](const WeightSpec& spec) -> TensorView {
    TensorView v{nullptr, c.dtype, spec.shape};
    // Not value-initialised: zeroing first would touch every page on this one thread (60 GB of
    // OPT-30B at about 1 GB/s); the parallel fill touches them first instead.
    auto buf = std::make_unique_for_overwrite<std::byte[]>(v.nbytes());
    // Norm gains near 1, everything else small and centred: activations stay finite.
    bool norm = spec.shape.ndim == 1 && spec.name.find("norm.weight") != std::string::npos;
    bool bias = spec.shape.ndim == 1 && !norm;
    float amp = norm ? 0.05f : bias ? 0.01f : std::sqrt(3.f) * 0.02f;
    fill_uniform(buf.get(), c.dtype, v.numel(), fnv1a(spec.name) ^ seed, norm ? 1.f : 0.f, amp);
    v.data = buf.get();
    buffers->push_back(std::move(buf));
    if (on_progress) on_progress(done += v.nbytes(), total);
    return v;
  };
  m.weights_ = bind_weights(c, lookup, "dummy weights", &m.tensors_);
  m.stage_ = {0, c.n_layers, c.n_layers};
  m.signature_ = "dummy:" + std::to_string(seed);
  m.owner_ = buffers;
  return m;
}

Model Model::stage(int64_t first, int64_t end) const {
  const int64_t base = stage_.first, total = stage_.total;
  if (first < 0 || end <= first || end > config_.n_layers)
    FH_FAIL("stage layers [", first, ", ", end, ") are not a non-empty range of the model's ", config_.n_layers,
            " layers");
  Model m;
  m.config_ = config_;
  m.config_.n_layers = end - first;
  if (!config_.sliding_layers.empty())
    m.config_.sliding_layers.assign(config_.sliding_layers.begin() + first, config_.sliding_layers.begin() + end);
  m.owner_ = owner_;
  m.archive_ = archive_;
  m.unused_ = unused_;
  m.dummy_ = dummy_;
  m.stage_ = {base + first, base + end, total};
  m.signature_ = signature_ + "stage " + std::to_string(m.stage_.first) + "-" + std::to_string(m.stage_.end) + " of " +
                 std::to_string(total) + "\n";
  const bool embed = m.stage_.embed(), head = m.stage_.head();
  m.weights_.layers.assign(weights_.layers.begin() + first, weights_.layers.begin() + end);
  if (embed) m.weights_.pos_embed = weights_.pos_embed;
  if (embed || (head && config_.tie_embeddings)) m.weights_.embed = weights_.embed;
  if (head) {
    m.weights_.final_norm_w = weights_.final_norm_w;
    m.weights_.final_norm_b = weights_.final_norm_b;
    m.weights_.lm_head = weights_.lm_head;
  }
  for (const BoundTensor& t : tensors_) {
    const bool layer = t.spec.layer >= 0;
    if (layer ? (t.spec.layer < first || t.spec.layer >= end)
              : t.spec.name.find("embed_") != std::string::npos ? !embed : !head)
      continue;
    m.tensors_.push_back(t);
    if (layer) m.tensors_.back().spec.layer -= int(first);
  }
  return m;
}

void Model::release_pages(const void* p, size_t bytes) const noexcept {
  if (!archive_) return;
  for (const MappedFile& f : archive_->files())
    if (f.release(p, bytes)) return;
}

size_t Model::weight_bytes() const {
  size_t total = 0;
  for (const BoundTensor& t : tensors_) total += t.view.nbytes();
  return total;
}

int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const WeightSpec& s : weight_specs(config_)) n += s.shape.numel();
  return n;
}

}  // namespace flexh2o
