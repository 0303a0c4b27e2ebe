// Midpoint-rule weight placement per unit and the KV split by whole sequences.
#include "engine/placement.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace flexh2o {

Tier midpoint_tier(double mid_percent, double w_gpu_percent, double w_cpu_percent) {
  const double disk = 100 - w_gpu_percent - w_cpu_percent;
  if (mid_percent < disk) return Tier::kDisk;
  if (mid_percent < disk + w_cpu_percent) return Tier::kHost;
  return Tier::kDevice;
}

DType held_dtype(const TensorView& v, bool compress, std::optional<DType> as) {
  if (compress && v.shape.ndim == 2) return DType::Q4;
  return as ? *as : v.dtype;
}

size_t held_bytes(const TensorView& v, DType dt) {
  TensorView h = v;
  h.dtype = dt;
  return h.nbytes();
}

WeightPlacement place_weights(const Model& m, const Policy& p, std::optional<DType> as) {
  const ModelConfig& c = m.config();
  WeightPlacement wp;
  const std::vector<UnitKind> kinds = unit_kinds(c.n_layers, p.sep_layer);
  wp.units.resize(kinds.size());
  for (size_t u = 0; u < kinds.size(); ++u) {
    wp.units[u].kind = kinds[u];
    if (u > 0 && u + 1 < kinds.size()) wp.units[u].layer = int(p.sep_layer ? (u - 1) / 2 : u - 1);
  }
  auto held = [&](std::string name, const TensorView& v) {
    const DType dt = held_dtype(v, p.compress_weight, as);
    return PlacedTensor{std::move(name), v, Tier::kDevice, dt, held_bytes(v, dt)};
  };
  // [unit] whether each tensor is of an MLP: a whole layer's two parts are placed apart.
  std::vector<std::vector<bool>> mlp(wp.units.size());
  for (const BoundTensor& t : m.tensors()) {
    const std::string& n = t.spec.name;
    const bool is_mlp = t.spec.layer >= 0 && t.spec.part == LayerPart::kMlp;
    size_t unit;
    if (t.spec.layer >= 0)
      unit = p.sep_layer ? size_t(1 + 2 * t.spec.layer + (is_mlp ? 1 : 0)) : size_t(t.spec.layer) + 1;
    else if (n.find("embed_") != std::string::npos) unit = 0;
    else unit = wp.units.size() - 1;  // final norm, untied lm_head
    wp.units[unit].tensors.push_back(held(n, t.view));
    mlp[unit].push_back(is_mlp);
  }
  if (c.tie_embeddings && m.stage_range().head()) {
    const TensorView& e = m.weights().embed;
    wp.units.back().tensors.push_back(held("lm_head.weight (tied)", e));
    mlp.back().push_back(false);
  }
  for (size_t k = 0; k < wp.units.size(); ++k) {
    UnitPlacement& u = wp.units[k];
    std::array<std::vector<size_t>, 2> sizes;  // [not MLP, MLP]
    for (size_t i = 0; i < u.tensors.size(); ++i) sizes[mlp[k][i]].push_back(u.tensors[i].bytes);
    const UnitBytes ub = whole_layer_bytes(sizes[0], sizes[1], p);  // a unit of one part: that part alone
    const std::array<std::vector<Tier>, 2> tiers = {unit_tiers(sizes[0], p), unit_tiers(sizes[1], p)};
    std::array<size_t, 2> next{};
    for (size_t i = 0; i < u.tensors.size(); ++i) u.tensors[i].tier = tiers[mlp[k][i]][next[mlp[k][i]]++];
    for (int i = 0; i < 3; ++i) u.bytes[size_t(i)] = size_t(ub.tier[size_t(i)]);
    u.slot_bytes = size_t(ub.slot);
    u.stage_bytes = size_t(ub.stage);
    for (int i = 0; i < 3; ++i) wp.bytes[size_t(i)] += u.bytes[size_t(i)];
    wp.max_streamed = std::max(wp.max_streamed, u.slot_bytes);
    wp.max_disk = std::max(wp.max_disk, u.stage_bytes);
  }
  if (c.tie_embeddings && m.stage_range().head() && m.stage_range().embed()) {
    const PlacedTensor& head = wp.units.back().tensors.back();
    for (const PlacedTensor& t : wp.units.front().tensors)
      if (t.source.data == head.source.data)
        wp.bytes[size_t(head.tier)] -= head.bytes - tied_head_home_bytes(t.tier, head.tier, head.bytes);
  }
  return wp;
}

size_t tied_head_home_bytes(Tier embed, Tier head, size_t bytes) { return embed == head ? 0 : bytes; }

std::vector<Tier> unit_tiers(const std::vector<size_t>& tensor_bytes, const Policy& p) {
  size_t total = 0;
  for (size_t b : tensor_bytes) total += b;
  std::vector<Tier> tiers;
  size_t cum = 0;
  for (size_t b : tensor_bytes) {
    const double mid = total ? (double(cum) + double(b) / 2) / double(total) * 100 : 0;
    cum += b;
    tiers.push_back(midpoint_tier(mid, p.w_gpu_percent, p.w_cpu_percent));
  }
  return tiers;
}

UnitBytes unit_bytes(const std::vector<size_t>& tensor_bytes, const Policy& p) {
  UnitBytes out;
  const std::vector<Tier> tiers = unit_tiers(tensor_bytes, p);
  for (size_t i = 0; i < tiers.size(); ++i) {
    const size_t b = tensor_bytes[i];
    const Tier t = tiers[i];
    out.tier[size_t(t)] += b;
    if (t != Tier::kDevice) out.slot += (b + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
    if (t == Tier::kDisk) out.stage += (b + kStageAlign - 1) / kStageAlign * kStageAlign;
  }
  return out;
}

UnitBytes whole_layer_bytes(const std::vector<size_t>& attn_bytes, const std::vector<size_t>& mlp_bytes,
                            const Policy& p) {
  UnitBytes out = unit_bytes(attn_bytes, p);
  const UnitBytes m = unit_bytes(mlp_bytes, p);
  for (size_t i = 0; i < 3; ++i) out.tier[i] += m.tier[i];
  out.slot += m.slot;
  out.stage += m.stage;
  return out;
}

std::array<uint64_t, 3> place_unit(const std::vector<size_t>& tensor_bytes, const Policy& p) {
  return unit_bytes(tensor_bytes, p).tier;
}

KvSplit split_kv(int64_t gpu_batch_size, const Policy& p) {
  KvSplit s;
  s.n_device = int64_t(std::floor(double(gpu_batch_size) * p.cache_gpu_percent / 100 + 1e-9));
  s.n_host = int64_t(std::floor(double(gpu_batch_size) * p.cache_cpu_percent / 100 + 1e-9));
  s.n_host = std::min(s.n_host, gpu_batch_size - s.n_device);
  s.n_disk = gpu_batch_size - s.n_device - s.n_host;
  // FlexGen gives the remainder to the last tier with a non-zero share.
  if (s.n_disk > 0 && p.cache_disk_percent() <= 1e-9) {
    if (p.cache_cpu_percent > 0) s.n_host += s.n_disk;
    else s.n_device += s.n_disk;
    s.n_disk = 0;
  }
  return s;
}

}  // namespace flexh2o
