// Cost model: step durations, list scheduling of the engine's schedule, bytes per link and
// memory per tier. Mirrors the engine (src/engine/offload_moves.cpp, offload_compute.cpp) step by step.
#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "engine/layer_compute.h"
#include "engine/kv_evict.h"
#include "engine/placement.h"
#include "model/weights.h"
#include "offload/aligned_buffer.h"
#include "policies/kv_policy.h"

namespace flexh2o {
namespace {

// Passes over a unit's activation rows (hidden wide) by its non-GEMM ops: attention half: a
// norm (read + write), a residual add (3), q/k/v/attention copies and KV writes (~3); MLP
// half: a norm and a residual add; the FFN's activation adds 2 passes over ffn_dim-wide rows.
constexpr double kAttnPasses = 8, kMlpPasses = 6;

// A weight's bytes as every tier holds it: placement's own formula (engine/placement.h).
size_t stored_bytes(const TensorView& v, bool compress, std::optional<DType> as = std::nullopt) {
  return held_bytes(v, held_dtype(v, compress, as));
}

}  // namespace

// ---- model shape and placement ---------------------------------------------------------

ModelShape ModelShape::from_config(const ModelConfig& c) {
  ModelShape s;
  s.config = c;
  TensorView embed;
  auto add = [&](UnitSizes& u, bool compress, const WeightSpec& w, const TensorView& v) {
    const size_t n = stored_bytes(v, compress);
    if (w.layer == 0) (w.part == LayerPart::kMlp ? u.mlp : u.attn).push_back(n);
    else if (w.name.find("embed_") != std::string::npos) u.embed.push_back(n);
    else u.head.push_back(n);
  };
  for (const WeightSpec& w : weight_specs(c)) {
    if (w.layer > 0) continue;
    const TensorView v{nullptr, c.dtype, w.shape};
    add(s, false, w, v);
    add(s.q4, true, w, v);
    if (w.name.find("embed_tokens") != std::string::npos) embed = v, s.token_index = s.embed.size() - 1;
  }
  for (bool q : {false, true}) {
    UnitSizes& u = q ? s.q4 : s;
    if (c.tie_embeddings) u.head.push_back(stored_bytes(embed, q));
    u.layer = u.attn;
    u.layer.insert(u.layer.end(), u.mlp.begin(), u.mlp.end());
  }
  return s;
}

ModelShape ModelShape::from_model(const Model& m, std::optional<DType> as) {
  ModelShape s;
  s.config = m.config();
  for (bool q : {false, true}) {
    UnitSizes& u = q ? s.q4 : s;
    for (const BoundTensor& t : m.tensors()) {
      const size_t n = stored_bytes(t.view, q, as);
      if (t.spec.layer == 0) (t.spec.part == LayerPart::kMlp ? u.mlp : u.attn).push_back(n);
      else if (t.spec.layer > 0) continue;
      else if (t.spec.name.find("embed_") != std::string::npos) u.embed.push_back(n);
      else u.head.push_back(n);
      if (t.view.data == m.weights().embed.data) s.token_index = u.embed.size() - 1;
    }
    if (s.config.tie_embeddings && m.stage_range().head()) u.head.push_back(stored_bytes(m.weights().embed, q, as));
    u.layer = u.attn;
    u.layer.insert(u.layer.end(), u.mlp.begin(), u.mlp.end());
  }
  return s;
}

ModelShape ModelShape::stage(int64_t layers, bool embed, bool head) const {
  FH_CHECK(layers >= 1, "a pipeline stage needs at least one layer, got ", layers);
  ModelShape s = *this;
  s.config.n_layers = layers;
  for (UnitSizes* u : {static_cast<UnitSizes*>(&s), &s.q4}) {
    if (!embed) u->embed.clear();
    if (!head) u->head.clear();
  }
  if (!embed) s.token_index = 0;
  return s;
}

uint64_t ModelShape::weight_bytes(const Policy& p) const {
  const UnitSizes& u = units(p);
  const bool tied = config.tie_embeddings && !u.embed.empty() && !u.head.empty();
  return u.total(config.n_layers) - (tied ? u.head.back() : 0);
}

uint64_t UnitSizes::total(int64_t n_layers) const {
  auto sum = [](const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), uint64_t(0)); };
  return sum(embed) + uint64_t(n_layers) * sum(layer) + sum(head);
}

DType kv_dtype_of(const Workload& w, const Policy& p) {
  OffloadOptions o;  // the engine's own decision (offload_kv_dtype), not a copy of it
  o.policy = p;
  o.kv_dtype = w.kv_dtype;
  return offload_kv_dtype(o);
}

std::array<uint64_t, 3> embed_moved(const ModelShape& m, const Policy& p, uint64_t rows) {
  // offload_moves.cpp load_weight_disk/load_weight: a streamed token table moves only the
  // step's rows (all of it when a step has >= vocab rows).
  std::array<uint64_t, 3> out{};
  const std::vector<size_t>& embed = m.units(p).embed;
  const std::vector<Tier> tiers = unit_tiers(embed, p);
  for (size_t i = 0; i < embed.size(); ++i) {
    const size_t b = embed[i];
    const Tier t = tiers[i];
    const uint64_t V = uint64_t(m.config.vocab_size);
    out[size_t(t)] += i == m.token_index && t != Tier::kDevice ? std::min(rows, V) * (b / V) : b;
  }
  return out;
}

// ---- construction, capacity, memory -----------------------------------------------------

CostModel::CostModel(ModelShape m, HardwareProfile hw, Workload w) : m_(std::move(m)), hw_(std::move(hw)), w_(std::move(w)) {
  FH_CHECK(w_.prompt_len >= 1 && w_.gen_len >= 1, "workload needs prompt_len >= 1 and gen_len >= 1, got ",
           w_.prompt_len, " and ", w_.gen_len);
  act_ = act_dtype_of(hw_.device);
  if (const int64_t max_len = w_.prompt_len + w_.gen_len; window_caps_full_cache(m_.config, max_len))
    w_.kv = window_kv_policy(m_.config, w_.kv.value_or(KvPolicyConfig{}), max_len);
  // The engine (offload_batch.cpp, kv_evict.cpp) with a bounded budget B per sequence: after
  // every step a sequence keeps min(len, B - 1) rows (room for the incoming token).
  const int64_t full = w_.prompt_len + w_.gen_len;
  keep_ = full;
  if (w_.kv && w_.kv->kind != KvPolicyKind::kFull) {
    const KvBudget b = make_policy(*w_.kv)->budget(w_.prompt_len);
    if (!b.unbounded) {
      keep_ = b.kept(full);
      budget_max_ = b.total();
    }
  }
  window_ = full_cache_window(m_.config, w_.kv && w_.kv->kind != KvPolicyKind::kFull, full);
  window_layers_ = window_ ? count_sliding_layers(m_.config) : 0;
  keep_window_ = window_ ? std::min(full, window_ - 1) : full;
  const MemoryPlan mp = plan(Policy{});
  cap_w_ = mp.cap_w;
  cap_h_ = mp.cap_h;
}

int64_t CostModel::capacity() const { return cap_h_; }

int64_t CostModel::kv_len(int64_t tokens) const {
  const int64_t L = m_.config.n_layers, lw = window_layers_;
  return ((L - lw) * std::min(tokens, keep_) + lw * std::min(tokens, keep_window_) + L / 2) / std::max<int64_t>(L, 1);
}

MemoryPlan CostModel::plan(const Policy& p) const {
  const ModelConfig& c = m_.config;
  const UnitSizes& us = m_.units(p);
  WeightBytes wb;
  auto add = [&](const UnitBytes& u, uint64_t times) {
    for (int i = 0; i < 3; ++i) wb.homed[size_t(i)] += times * u.tier[size_t(i)];
    wb.max_streamed = std::max(wb.max_streamed, u.slot);
    wb.max_disk = std::max(wb.max_disk, u.stage);
  };
  add(unit_bytes(us.embed, p), 1);
  if (p.sep_layer) {
    add(unit_bytes(us.attn, p), uint64_t(c.n_layers));
    add(unit_bytes(us.mlp, p), uint64_t(c.n_layers));
  } else {
    add(whole_layer_bytes(us.attn, us.mlp, p), uint64_t(c.n_layers));
  }
  add(unit_bytes(us.head, p), 1);
  if (c.tie_embeddings && !us.embed.empty() && !us.head.empty()) {  // the head shares the token table's home
    const Tier e = unit_tiers(us.embed, p)[m_.token_index], h = unit_tiers(us.head, p).back();
    wb.homed[size_t(h)] -= us.head.back() - tied_head_home_bytes(e, h, us.head.back());
  }
  BatchDims d;
  d.rows = w_.prompt_len;
  d.capacity = w_.prompt_len + w_.gen_len;
  d.budget_max = budget_max_;
  d.kv_policy = (w_.kv && w_.kv->kind != KvPolicyKind::kFull) || window_ > 0;
  d.scores = w_.kv && w_.kv->kind != KvPolicyKind::kFull && make_policy(*w_.kv)->needs_scores();
  d.window = window_;
  d.window_layers = window_layers_;
  return plan_memory(c, wb, p, d, {hw_.device, kv_dtype_of(w_, p), act_});
}

uint64_t CostModel::kv_token_bytes(const Policy& p) const {
  return uint64_t(m_.config.kv_bytes_per_token(kv_dtype_of(w_, p)));
}

std::array<uint64_t, 3> CostModel::memory(const Policy& p) const { return plan(p).bytes; }

std::array<uint64_t, 3> CostModel::memory(const Policy& p, int64_t groups) const {
  FH_CHECK(groups >= 1, "groups must be >= 1, got ", groups);
  if (groups == 1) return plan(p).bytes;
  Policy q = p;
  q.num_gpu_batches = p.num_gpu_batches * groups;
  return plan(q).bytes;
}

std::string CostModel::memory_breakdown(const Policy& p) const { return plan(p).breakdown(); }

// ---- bytes per link -----------------------------------------------------------------------

std::array<uint64_t, kNumLinks> CostModel::bytes(const Policy& p) const {
  // offload_moves.cpp: weights stream once per token step for every unit (disk-homed ones via
  // the host); hidden states on the host cross at every unit boundary; offloaded sequences'
  // KV: the prefill stores every prompt row (a policy compacts them on the host), each decode
  // step loads [0, len) and stores one row, or with cpu_cache_compute only q, k, v go down and
  // the attention output comes up; with a policy the scores of every sequence attended on the
  // device come down (and a prefill stores only the kept rows: the device compacts them).
  const ModelConfig& c = m_.config;
  std::array<uint64_t, kNumLinks> b{};
  auto add = [&](Link l, uint64_t n) { b[size_t(l)] += n; };
  const UnitSizes& us = m_.units(p);
  const auto h = place_unit(us.head, p);
  const std::array<uint64_t, 3> lay = whole_layer_bytes(us.attn, us.mlp, p).tier;  // either unit split
  const uint64_t L = uint64_t(c.n_layers), K = uint64_t(p.num_gpu_batches), B = uint64_t(p.block_size());
  const uint64_t n = uint64_t(p.gpu_batch_size);
  const uint64_t steps = uint64_t(w_.gen_len), s = uint64_t(w_.prompt_len);
  const uint64_t es_a = dtype_size(act_);
  add(Link::kDiskToHost, steps * (L * lay[2] + h[2]));
  add(Link::kHostToDevice, steps * (L * (lay[1] + lay[2]) + h[1] + h[2]));
  for (uint64_t i = 0; i < steps; ++i) {  // the embedding unit moves the step's rows
    const auto em = embed_moved(m_, p, B * (i == 0 ? s : 1));
    add(Link::kDiskToHost, em[2]);
    add(Link::kHostToDevice, em[1] + em[2]);
  }
  const uint64_t hid = uint64_t(c.hidden) * es_a;
  if (p.act_cpu_percent == 100) {
    const uint64_t units = L * (p.sep_layer ? 2 : 1) + 2;
    const uint64_t rows = B * (s + steps - 1);  // prefill s rows, then 1 per decode step
    add(Link::kHostToDevice, (units - 1) * rows * hid);
    add(Link::kDeviceToHost, (units - 1) * rows * hid);
  }
  const KvSplit sp = split_kv(p.gpu_batch_size, p);
  const uint64_t nd = uint64_t(sp.n_device), off = uint64_t(sp.n_host + sp.n_disk), nk = uint64_t(sp.n_disk);
  const uint64_t row = uint64_t(c.kv_layer_bytes_per_token(kv_dtype_of(w_, p)));
  const bool scores = w_.kv && w_.kv->kind != KvPolicyKind::kFull && make_policy(*w_.kv)->needs_scores();
  const uint64_t score_row = uint64_t(c.n_heads) * 4;  // per sequence and slot
  const bool host_attention = p.cpu_cache_compute && off > 0;
  // Each class of layers (every layer, or under a window cap the full and the sliding ones)
  // moves the rows it keeps.
  const uint64_t LW = uint64_t(window_layers_);
  for (const auto& [layers, kept] : {std::pair{L - LW, uint64_t(keep_)}, std::pair{LW, uint64_t(keep_window_)}}) {
    const uint64_t LK = layers * K;
    if (!LK) continue;
    add(Link::kDeviceToHost, LK * off * std::min(s, kept) * row);  // a policy compacts them on the device first
    add(Link::kHostToDisk, LK * nk * std::min(s, kept) * row);
    if (scores) add(Link::kDeviceToHost, LK * n * s * score_row);
    for (uint64_t i = 1; i < steps; ++i) {
      const uint64_t before = std::min(s + i - 1, kept), after = before + 1;
      add(Link::kDiskToHost, LK * nk * before * row);
      add(Link::kHostToDisk, LK * nk * row);
      if (host_attention) {
        add(Link::kDeviceToHost, LK * off * uint64_t(c.q_dim() + 2 * c.kv_dim()) * es_a);
        add(Link::kHostToDevice, LK * off * uint64_t(c.q_dim()) * es_a);
        if (scores) add(Link::kDeviceToHost, LK * nd * after * score_row);
      } else {
        add(Link::kHostToDevice, LK * off * before * row);
        add(Link::kDeviceToHost, LK * off * row);
        if (scores) add(Link::kDeviceToHost, LK * n * after * score_row);
      }
    }
  }
  return b;
}

// ---- time: step durations and list scheduling ---------------------------------------------

const Schedule& CostModel::schedule(const ScheduleShape& s, uint64_t key) {
  auto it = schedules_.find(key);
  if (it == schedules_.end()) it = schedules_.emplace(key, build_schedule(s)).first;
  return it->second;
}

CostModel::Sim CostModel::simulate(const Policy& p, bool prefill, int64_t len_before, int layers) {
  const ModelConfig& c = m_.config;
  const UnitSizes& us = m_.units(p);
  const auto pe = place_unit(us.embed, p), ph = place_unit(us.head, p);
  const auto pa = place_unit(us.attn, p), pm = place_unit(us.mlp, p), pl = whole_layer_bytes(us.attn, us.mlp, p).tier;
  const KvSplit sp = split_kv(p.gpu_batch_size, p);
  const int K = int(p.num_gpu_batches);
  ScheduleShape sh;
  sh.kinds = unit_kinds(layers, p.sep_layer);
  sh.micro_batches = K;
  auto streams = [](const std::array<uint64_t, 3>& t) { return t[1] + t[2] > 0; };
  auto unit_tier = [&](int u) -> const std::array<uint64_t, 3>& {
    switch (sh.kinds[size_t(u)]) {
      case UnitKind::kEmbed: return pe;
      case UnitKind::kHead: return ph;
      case UnitKind::kAttention: return pa;
      case UnitKind::kMlp: return pm;
      case UnitKind::kLayer: break;
    }
    return pl;
  };
  for (int u = 0; u < sh.units(); ++u) {
    sh.unit_streams.push_back(streams(unit_tier(u)));
    sh.unit_disk.push_back(unit_tier(u)[2] > 0);
  }
  const bool policy = w_.kv && w_.kv->kind != KvPolicyKind::kFull;
  const bool scores = policy && make_policy(*w_.kv)->needs_scores();
  sh.prefill = prefill;
  sh.kv_device = sp.n_device > 0;
  sh.kv_host = sp.n_host > 0;
  sh.kv_disk = sp.n_disk > 0;
  sh.cpu_attention = p.cpu_cache_compute;
  sh.act_on_host = p.act_cpu_percent == 100;
  sh.kv_policy = policy || window_ > 0;
  // The engine prefetches the next step's first layer at the end of each step (all but the
  // run's last), so decode steps start with it loaded.
  sh.first_layer_loaded = !prefill;
  sh.prefetch_next = true;
  uint64_t key = uint64_t(layers) | uint64_t(K) << 8 | uint64_t(prefill) << 40 | uint64_t(sh.kv_device) << 41 |
                 uint64_t(sh.kv_host) << 42 | uint64_t(sh.kv_disk) << 43 | uint64_t(sh.cpu_attention) << 44 |
                 uint64_t(sh.act_on_host) << 45 | uint64_t(sh.kv_policy) << 46 | uint64_t(p.sep_layer) << 47;
  for (int i = 0; i < 5; ++i) {
    const auto& t = i == 0 ? pe : i == 1 ? ph : i == 2 ? pa : i == 3 ? pm : pl;
    key |= uint64_t(streams(t)) << (48 + 2 * i) | uint64_t(t[2] > 0) << (49 + 2 * i);
  }
  const Schedule& sched = schedule(sh, key);

  const double es_a = double(dtype_size(act_));
  const double n = double(p.gpu_batch_size), T = prefill ? double(w_.prompt_len) : 1.0;
  const double row = double(c.kv_layer_bytes_per_token(kv_dtype_of(w_, p))), hid = double(c.hidden) * es_a;
  const double off = double(sp.n_host + sp.n_disk), nd = double(sp.n_disk), ndev = double(sp.n_device);
  const double before = double(len_before);
  const double kept = double(kv_len(w_.prompt_len));
  const bool kept_mode = prefill && sh.kv_policy;  // rows leave after the device compacted them (SK)
  const double after = prefill ? double(w_.prompt_len) : before + 1;
  const bool host_attn = sh.host_attention();
  // Compression's compute cost (HardwareProfile::device_dequant / host_dequant): seconds per
  // Q4 byte a kernel reads (or a KV row written compressed); 0 where the profile has no rate.
  auto per_byte = [](bool on, double rate) { return on && rate > 0 ? 1 / rate : 0.0; };
  const double w_dq = per_byte(p.compress_weight, hw_.device_dequant);
  const double kv_dq = per_byte(p.compress_cache, hw_.device_dequant);
  const double kv_dq_host = per_byte(p.compress_cache, hw_.host_dequant);
  auto gemm = [&](double flops, double wbytes, bool large_m) {
    const double dq = wbytes * w_dq;  // wbytes are Q4 bytes with compress_weight
    if (large_m) return flops / hw_.device_gemm_prefill + dq;
    const double t = flops / hw_.device_gemm_decode;
    if (hw_.device_weight_read <= 0) return t + dq;
    const double r = wbytes / hw_.device_weight_read;
    return (hw_.gemm_time_sum ? t + r : std::max(t, r)) + dq;
  };
  auto sum = [](const std::vector<size_t>& v) { return double(std::accumulate(v.begin(), v.end(), size_t(0))); };
  const double H = double(c.hidden), Q = double(c.q_dim()), KV = double(c.kv_dim()), F = double(c.ffn_dim);
  // A MoE row runs its chosen experts only (both devices group the rows by expert).
  const double attn_in_params = H * Q + 2 * H * KV, attn_out_params = H * Q, mlp_params = c.mlp_row_params();
  const double ffn_width = F * double(std::max<int64_t>(c.experts_per_token, 1));  // FFN values a row
  const double attn_w = sum(us.attn), mlp_w = sum(us.mlp), head_w = sum(us.head);
  const double qkv_share = attn_in_params / (attn_in_params + attn_out_params);
  const double rows_bytes = n * T * hid;
  auto elementwise = [&](double passes) {
    return hw_.device_elementwise > 0 ? rows_bytes * passes / hw_.device_elementwise : 0.0;
  };
  // Device attention of `seqs` sequences.
  // Compressed KV: a prefill encodes its T rows, a decode step reads `before` rows and encodes one.
  auto device_attention = [&](double seqs) {
    if (prefill) return 4 * seqs * Q * T * (T + 1) / 2 / hw_.device_attention_prefill + seqs * T * row * kv_dq;
    return 4 * seqs * Q * (before + 1) / hw_.device_attention_decode + seqs * (before + 1) * row * kv_dq;
  };
  const double attn_seqs_device = host_attn ? ndev : n;
  // attention half: q/k/v (+ attention on the device) in C; with host attention the output
  // projection runs in CR.
  const double c_attn_in = gemm(2 * n * T * attn_in_params, attn_w * qkv_share, prefill) +
                           device_attention(attn_seqs_device) + elementwise(kAttnPasses / 2);
  const double c_attn_out = gemm(2 * n * T * attn_out_params, attn_w * (1 - qkv_share), prefill) +
                            elementwise(kAttnPasses / 2);
  const double c_mlp = gemm(2 * n * T * mlp_params, mlp_w, prefill) + elementwise(kMlpPasses + 2 * ffn_width / H);
  double embed_c = hw_.device_weight_read > 0 ? n * T * hid / hw_.device_weight_read : 0;
  double head_c = gemm(2 * n * double(c.hidden * c.vocab_size), head_w, false);
  if (hw_.device_elementwise > 0) {
    embed_c += rows_bytes * 2 / hw_.device_elementwise;
    head_c += (n * hid * 2 + n * double(c.vocab_size) * 4) / hw_.device_elementwise;
  }
  if (us.embed.empty()) embed_c = 0;  // a pipeline stage without the embedding (ModelShape::stage)
  if (us.head.empty()) head_c = 0;
  double host_attn_t = 0;
  if (host_attn) {
    const double a = std::max(0.0, std::log2(64.0 / n)), b = std::max(0.0, std::log2(4096.0 / H));
    const double eff = std::max(0.1, 1 + hw_.host_eff_c1 * a * b - hw_.host_eff_c2 * a - hw_.host_eff_c3 * b);
    host_attn_t = 4 * off * Q * (before + 1) / (hw_.host_attention * eff) + off * (before + 1) * row * kv_dq_host;
  }
  const double score_bytes = (sh.kv_policy && scores) ? attn_seqs_device * double(c.n_heads) * after * 4 : 0;
  // The KV policy's decisions on the host queue (HardwareProfile::host_kv_policy), a call per
  // segment as the engine makes them: at a prefill one for every sequence (UpdateCache); at decode
  // the device's in UpdateCache, the host's and the disk's each in host attention or UpdateCache.
  // A row per (sequence, KV head) of each deciding layer: with a bounded policy every layer, its
  // rows `after` slots; else only the sliding-window layers, over their window.
  const double deciding = policy ? 1.0 : double(window_layers_) / double(std::max<int64_t>(c.n_layers, 1));
  const double slots = policy || prefill ? after : std::min(before, double(keep_window_)) + 1;
  auto decide = [&](double seqs) {
    if (seqs <= 0 || deciding <= 0 || hw_.host_kv_policy <= 0) return 0.0;
    const double par = std::min(hw_.host_kv_threads,
                                double(kv_decision_parallelism(int64_t(seqs), c.n_kv_heads, int64_t(slots))));
    const double slot = hw_.kv_slot_seconds(prefill, c.n_heads / c.n_kv_heads);
    return seqs * double(c.n_kv_heads) * deciding * (slots * slot + hw_.host_kv_policy_row) / par;
  };
  const double nh = double(sp.n_host);
  if (host_attn) host_attn_t += decide(nh) + decide(nd);
  const double update_t = prefill ? decide(n) : decide(ndev) + (host_attn ? 0.0 : decide(nh) + decide(nd));
  // The embedding unit moves only the block's rows of a streamed token table; from disk each
  // row is its own read request.
  const uint64_t em_rows = uint64_t(p.block_size()) * uint64_t(T);
  const auto em = embed_moved(m_, p, em_rows);
  const double em_disk_requests = em[2] < pe[2] ? double(em_rows) : 0.0;
  // KV disk I/O (OffloadEngine's disk_kv): one submission per (layer, micro-batch) of whole
  // 4096-byte pages of a packed file, page-rounded runs that touch merged into one request (split
  // at 1 MiB). A run per (sequence, KV head, K|V) stays apart where the slots between two runs'
  // rows span two pages; runs that merge move the whole file's pages. A decode step's new rows are
  // a page each (two where a row straddles one) once a head's slots span a page, else every page.
  // Windowed layers are priced at the full cache's slots, as the simulated layers are alike.
  const double runs = nd * double(c.n_kv_heads) * 2, head_row = row / (2 * double(c.n_kv_heads)), page = kIoAlign;
  const double head_slots = double(cap_h_) * head_row, file = nd * double(cap_h_) * row;
  auto requests = [&](double bytes, bool apart) { return bytes <= 0 ? 0.0 : apart ? runs : std::ceil(bytes / (1 << 20)); };
  // Rows [0, rows) of every head: a run each (and on average one page more than its bytes), or the file.
  auto prefix_pages = [&](double rows, double* req) {
    const bool apart = (double(cap_h_) - rows) * head_row >= 2 * page;
    const double bytes = rows <= 0 ? 0 : apart ? runs * (rows * head_row + page) : file;
    *req = requests(bytes, apart);
    return bytes;
  };
  double load_req = 0, store_req = 0;
  const double load_bytes = prefix_pages(before, &load_req);
  double store_bytes = 0;
  if (prefill) {
    store_bytes = prefix_pages(kept, &store_req);
  } else {
    store_bytes = head_slots >= page ? runs * (page + head_row) : file;
    store_req = requests(store_bytes, head_slots >= 2 * page);
  }

  std::vector<double> fin(sched.steps.size());
  std::array<double, kNumQueues> qfree{};
  Sim out;
  for (size_t i = 0; i < sched.steps.size(); ++i) {
    const Step& st = sched.steps[i];
    const UnitKind kind = st.u < sh.units() ? sh.kinds[size_t(st.u)] : sh.kinds[1];
    const auto& pu = st.u < sh.units() ? unit_tier(st.u) : unit_tier(1);
    const bool emb = kind == UnitKind::kEmbed;
    double d = 0;
    switch (st.kind) {
      case StepKind::kLoadWeightDisk:
        d = double(emb ? em[2] : pu[2]) / hw_.disk_to_host + (emb ? em_disk_requests * hw_.disk_read_request : 0);
        break;
      case StepKind::kLoadWeight: d = double(emb ? em[1] + em[2] : pu[1] + pu[2]) / hw_.host_to_device; break;
      case StepKind::kLoadCacheDisk:
        d = load_bytes / hw_.disk_to_host_cache + (before > 0 ? load_req * hw_.disk_read_request : 0);
        break;
      case StepKind::kLoadCache: d = off * before * row / hw_.host_to_device; break;
      case StepKind::kLoadHidden: d = rows_bytes / hw_.host_to_device; break;
      case StepKind::kCompute:
        switch (kind) {
          case UnitKind::kEmbed: d = embed_c; break;
          case UnitKind::kHead: d = head_c; break;
          case UnitKind::kMlp: d = c_mlp; break;
          case UnitKind::kAttention: d = c_attn_in + (host_attn ? 0 : c_attn_out); break;
          case UnitKind::kLayer: d = c_attn_in + (host_attn ? 0 : c_attn_out + c_mlp); break;
        }
        d += hw_.compute_step_overhead;
        break;
      case StepKind::kComputeRest:
        d = c_attn_out + (kind == UnitKind::kLayer ? c_mlp : 0) + hw_.compute_step_overhead;
        break;
      case StepKind::kStoreQkv: d = off * T * (Q + 2 * KV) * es_a / hw_.device_to_host; break;
      case StepKind::kHostAttention: d = host_attn_t; break;
      case StepKind::kLoadAttn: d = off * T * Q * es_a / hw_.host_to_device; break;
      case StepKind::kStoreHidden: d = rows_bytes / hw_.device_to_host; break;
      case StepKind::kStoreCache:
        d = (host_attn || kept_mode ? 0 : off * (prefill ? kept : 1.0) * row / hw_.device_to_host_cache) +
            score_bytes / hw_.device_to_host;
        break;
      case StepKind::kStoreKept: d = off * kept * row / hw_.device_to_host_cache; break;
      case StepKind::kUpdateCache: d = update_t; break;
      case StepKind::kGatherCache: d = hw_.compute_step_overhead; break;
      case StepKind::kStoreCacheDisk: d = store_bytes / hw_.host_to_disk_cache + store_req * hw_.disk_write_request; break;
    }
    if (st.kind != StepKind::kCompute && st.kind != StepKind::kComputeRest && st.kind != StepKind::kGatherCache)
      d += hw_.schedule_step_overhead;
    const size_t q = size_t(st.queue);
    out.busy[q] += d;
    if (!p.overlap) {
      out.t += d;
      continue;
    }
    // One disk for reads and writes: the two disk queues take turns.
    const size_t r = !hw_.disk_duplex && st.queue == Queue::kDiskWrite ? size_t(Queue::kDiskRead) : q;
    double start = qfree[r];
    for (int dep : st.deps) start = std::max(start, fin[size_t(dep)]);
    // A queue runs its steps in order.
    fin[i] = start + d;
    qfree[r] = fin[i];
    out.t = std::max(out.t, fin[i]);
  }
  return out;
}

CostModel::Sim CostModel::token_step(const Policy& p, bool prefill, int64_t len_before) {
  // The schedule is periodic in the layers: simulate 4 and 3 layers and extrapolate linearly.
  const int L = int(m_.config.n_layers);
  if (L <= 4) return simulate(p, prefill, len_before, L);
  const Sim a = simulate(p, prefill, len_before, 4), b = simulate(p, prefill, len_before, 3);
  Sim s;
  s.t = a.t + (L - 4) * (a.t - b.t);
  for (int q = 0; q < kNumQueues; ++q) s.busy[size_t(q)] = a.busy[size_t(q)] + (L - 4) * (a.busy[size_t(q)] - b.busy[size_t(q)]);
  return s;
}

Estimate CostModel::finish(const Policy& p, double prefill, const std::array<double, kNumQueues>& busy, double decode,
                           double pl, double dl) {
  Estimate e;
  e.policy = p;
  e.block = p.block_size();
  e.prefill_s = prefill;
  e.decode_s = decode;
  e.prefill_layer_s = pl;
  e.decode_layer_s = dl;
  e.busy = busy;
  e.throughput = double(e.block * w_.gen_len) / std::max(prefill + decode, 1e-12);
  const int top = int(std::max_element(busy.begin(), busy.end()) - busy.begin());
  e.bottleneck = queue_name(Queue(top));
  e.memory = memory(p);
  e.kv_tokens = keep_;
  e.fits = hw_.fits(e.memory);
  e.memory_note = hw_.overflow_note(e.memory);
  return e;
}

Estimate CostModel::estimate(const Policy& p) {
  p.validate();
  const int64_t s = w_.prompt_len, n = w_.gen_len, L = m_.config.n_layers;
  Sim pre = token_step(p, true, 0);
  pre.t += hw_.token_step_overhead;
  std::array<double, kNumQueues> busy = pre.busy;
  double decode = 0;
  // Decode step i (1..n-1) sees len_before = s + i - 1 cached tokens (capped by the KV budget);
  // the step time is piecewise linear in it, so a few sample points integrate it closely.
  std::vector<std::pair<int64_t, double>> pts;  // (step, weight)
  if (n - 1 <= 5) {
    for (int64_t i = 1; i < n; ++i) pts.push_back({i, 1.0});
  } else {
    const double w = double(n - 1) / 4;  // trapezoid over two halves
    pts = {{1, w}, {1 + (n - 2) / 2, 2 * w}, {n - 1, w}};
  }
  for (auto [i, w] : pts) {
    const Sim d = token_step(p, false, kv_len(s + i - 1));
    decode += w * (d.t + hw_.token_step_overhead);
    for (int q = 0; q < kNumQueues; ++q) busy[size_t(q)] += w * d.busy[size_t(q)];
  }
  double dl = 0;
  if (n > 1) {
    const Sim mid = token_step(p, false, kv_len(s + (n - 1) / 2));
    const Sim one = L > 4 ? simulate(p, false, kv_len(s + (n - 1) / 2), 4) : mid;
    const Sim two = L > 4 ? simulate(p, false, kv_len(s + (n - 1) / 2), 3) : mid;
    dl = L > 4 ? one.t - two.t : mid.t / double(L);
  }
  const double pl = L > 4 ? simulate(p, true, 0, 4).t - simulate(p, true, 0, 3).t : pre.t / double(L);
  Estimate e = finish(p, pre.t, busy, decode, pl, dl);
  e.bytes = bytes(p);
  return e;
}

Estimate CostModel::quick(const Policy& p) {
  const int64_t s = w_.prompt_len, n = w_.gen_len;
  Sim pre = token_step(p, true, 0);
  pre.t += hw_.token_step_overhead;
  std::array<double, kNumQueues> busy = pre.busy;
  double decode = 0;
  if (n > 1) {
    const Sim d = token_step(p, false, kv_len(s + (n - 1) / 2));
    decode = double(n - 1) * (d.t + hw_.token_step_overhead);
    for (int q = 0; q < kNumQueues; ++q) busy[size_t(q)] += double(n - 1) * d.busy[size_t(q)];
  }
  return finish(p, pre.t, busy, decode, 0, 0);
}

}  // namespace flexh2o
