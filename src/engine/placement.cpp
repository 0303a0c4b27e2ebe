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

WeightPlacement place_weights(const Model& m, const Policy& p) {
  const ModelConfig& c = m.config();
  WeightPlacement wp;
  wp.units.resize(size_t(c.n_layers + 2));
  for (const BoundTensor& t : m.tensors()) {
    const std::string& n = t.spec.name;
    size_t unit;
    if (t.spec.layer >= 0) unit = size_t(t.spec.layer) + 1;
    else if (n.find("embed_") != std::string::npos) unit = 0;
    else unit = size_t(c.n_layers) + 1;  // final norm, untied lm_head
    wp.units[unit].tensors.push_back({n, t.view, Tier::kDevice, t.view.nbytes()});
  }
  if (c.tie_embeddings) {
    const TensorView& e = m.weights().embed;
    wp.units.back().tensors.push_back({"lm_head.weight (tied)", e, Tier::kDevice, e.nbytes()});
  }
  for (UnitPlacement& u : wp.units) {
    size_t total = 0;
    for (const PlacedTensor& t : u.tensors) total += t.bytes;
    size_t cum = 0;
    for (PlacedTensor& t : u.tensors) {
      const double mid = total ? (double(cum) + double(t.bytes) / 2) / double(total) * 100 : 0;
      cum += t.bytes;
      t.tier = midpoint_tier(mid, p.w_gpu_percent, p.w_cpu_percent);
      u.bytes[size_t(t.tier)] += t.bytes;
    }
    for (int i = 0; i < 3; ++i) wp.bytes[size_t(i)] += u.bytes[size_t(i)];
    wp.max_streamed = std::max(wp.max_streamed, u.streamed_bytes());
    wp.max_disk = std::max(wp.max_disk, u.bytes[2]);
  }
  return wp;
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
