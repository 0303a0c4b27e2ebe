// OffloadEngine step actions: per-batch buffers, weight/KV/hidden loads and stores between
// tiers (counted per link), and the compute of one unit on one micro-batch.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/offload_impl.h"

namespace flexh2o {

void OffloadEngine::Impl::begin_batch(int64_t B, int64_t cap) {
  // Free the previous batch's buffers before charging the new ones.
  mbs.clear();
  for (auto* slots : {&kv_stage_device, &kv_stage_host, &kv_bounce, &hidden_slot})
    for (auto& b : *slots) b = TierBuffer();
  scratch_charge = TierCharge();
  const int64_t a = kv_capacity_align(c);
  batch = B;
  capacity = (cap + a - 1) / a * a;
  s_max = 0;
  ++batch_no;
  const size_t per_seq = size_t(2 * region(1)) * sizeof(float);
  int64_t max_off = 0, max_disk = 0;
  for (int64_t first = 0, k = 0; first < B; first += p.gpu_batch_size, ++k) {
    MicroBatch mb;
    mb.first = first;
    mb.n = std::min(p.gpu_batch_size, B - first);
    mb.split = split_kv(mb.n, p);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string tag = "KV layer " + std::to_string(l) + " micro-batch " + std::to_string(k);
      mb.kv_device.emplace_back();
      alloc(Tier::kDevice, size_t(mb.split.n_device) * per_seq, tag, mb.kv_device.back());
      mb.kv_host.emplace_back();
      alloc(Tier::kHost, size_t(mb.split.n_host) * per_seq, tag, mb.kv_host.back());
      if (mb.split.n_disk > 0) {
        const uint64_t bytes = uint64_t(mb.split.n_disk) * per_seq;
        mb.kv_disk_charge.emplace_back();
        Status s = TierCharge::reserve(*e.budgets_[2], bytes, tag, &mb.kv_disk_charge.back());
        if (!s.ok()) FH_FAIL(s.message());
        mb.kv_disk.push_back("kv.L" + std::to_string(l) + ".mb" + std::to_string(k));
        e.store_->create(mb.kv_disk.back(), bytes).throw_if_error();
      }
    }
    max_off = std::max(max_off, mb.split.n_host + mb.split.n_disk);
    max_disk = std::max(max_disk, mb.split.n_disk);
    mbs.push_back(std::move(mb));
  }
  for (int s = 0; s < 2; ++s) {
    alloc(Tier::kDevice, size_t(max_off) * per_seq, "KV staging", kv_stage_device[size_t(s)]);
    alloc(Tier::kHost, size_t(max_disk) * per_seq, "KV disk staging", kv_stage_host[size_t(s)]);
    alloc(Tier::kHost, size_t(max_disk) * per_seq, "KV disk bounce", kv_bounce[size_t(s)]);
  }
  len_before.assign(size_t(B), 0);
  len_after.assign(size_t(B), 0);
}

void OffloadEngine::Impl::prepare_step(const int32_t* step_ids, const int32_t* step_pos, int64_t steps_T,
                                       const int32_t* real_rows) {
  FH_CHECK(!mbs.empty(), "step before begin_batch");
  ids = step_ids;
  positions = step_pos;
  T = steps_T;
  prefill = std::all_of(len_before.begin(), len_before.end(), [](int32_t n) { return n == 0; });
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t add = real_rows ? real_rows[b] : T;
    len_after[size_t(b)] = int32_t(len_before[size_t(b)] + add);
    FH_CHECK(len_after[size_t(b)] <= capacity, "KV cache full: sequence ", b, " needs ", len_after[size_t(b)],
             " slots, capacity ", capacity);
  }
  for (int64_t i = 0; i < batch * T; ++i)
    FH_CHECK(positions[i] >= 0 && positions[i] < c.max_positions, "position ", positions[i], " out of range");
  if (T > s_max) {  // (re)size hidden states and scratch for the longest step (the prefill)
    s_max = T;
    const size_t rows = size_t(p.gpu_batch_size * T), row_bytes = size_t(c.hidden) * sizeof(float);
    const bool act_host = p.act_cpu_percent == 100;
    for (MicroBatch& mb : mbs) {
      mb.hidden_device = TierBuffer();
      mb.hidden_host = TierBuffer();
      alloc(act_host ? Tier::kHost : Tier::kDevice, size_t(mb.n * T) * row_bytes, "hidden states",
            act_host ? mb.hidden_host : mb.hidden_device);
      mb.logits.resize(size_t(mb.n * c.vocab_size));
    }
    for (auto& h : hidden_slot) {
      h = TierBuffer();
      if (act_host) alloc(Tier::kDevice, rows * row_bytes, "hidden state slot", h);
    }
    scratch_charge = TierCharge();
    Status s = TierCharge::reserve(*e.budgets_[0], uint64_t(LayerCompute::scratch_bytes(c, int64_t(rows))),
                                   "compute scratch", &scratch_charge);
    if (!s.ok()) FH_FAIL(s.message());
  }
}

void OffloadEngine::Impl::finish_step(std::vector<float>& logits) {
  logits.resize(size_t(batch * c.vocab_size));
  for (const MicroBatch& mb : mbs)
    std::copy(mb.logits.begin(), mb.logits.end(), logits.begin() + mb.first * c.vocab_size);
  len_before = len_after;
}

void OffloadEngine::Impl::run(const Step& s) {
  switch (s.kind) {
    case StepKind::kLoadWeightDisk: return load_weight_disk(s.u);
    case StepKind::kLoadWeight: return load_weight(s.u);
    case StepKind::kLoadCacheDisk: return load_cache_disk(s.u, s.k);
    case StepKind::kLoadCache: return load_cache(s.u, s.k);
    case StepKind::kLoadHidden: return load_hidden(s.u, s.k);
    case StepKind::kCompute: return compute(s.u, s.k);
    case StepKind::kStoreHidden: return store_hidden(s.u, s.k);
    case StepKind::kStoreCache: return store_cache(s.u, s.k);
    case StepKind::kStoreCacheDisk: return store_cache_disk(s.u, s.k);
  }
}

// ---- weights ---------------------------------------------------------------------------

void OffloadEngine::Impl::load_weight_disk(int u) {
  std::byte* stage = weight_stage[size_t(u % 2)].data();
  for (const WeightHome& h : units[size_t(u)]) {
    if (h.tier != Tier::kDisk) continue;
    e.store_->read(h.store_name, 0, h.bytes, stage + h.stage_offset).throw_if_error();
    e.counters_.add(Link::kDiskToHost, h.bytes);
  }
}

void OffloadEngine::Impl::load_weight(int u) {
  std::byte* slot = weight_slot[size_t(u % 2)].data();
  for (const WeightHome& h : units[size_t(u)]) {
    if (h.tier == Tier::kDevice) continue;
    const std::byte* src = h.tier == Tier::kHost ? h.home.data() : weight_stage[size_t(u % 2)].data() + h.stage_offset;
    std::memcpy(slot + h.slot_offset, src, h.bytes);
    e.counters_.add(Link::kHostToDevice, h.bytes);
  }
}

ModelWeights OffloadEngine::Impl::unit_weights(int u) const {
  const ModelWeights& mw = e.model_.weights();
  ModelWeights w;
  auto remap = [&](TensorView& v) {
    for (const WeightHome& h : units[size_t(u)]) {
      if (h.source.data != v.data) continue;
      v.data = h.tier == Tier::kDevice ? static_cast<const void*>(h.home.data())
                                       : static_cast<const void*>(weight_slot[size_t(u % 2)].data() + h.slot_offset);
      return;
    }
    FH_CHECK(v.empty(), "unit ", u, " has no home for a tensor it uses");
  };
  if (u == 0) {
    w.embed = mw.embed;
    w.pos_embed = mw.pos_embed;
    remap(w.embed);
    remap(w.pos_embed);
  } else if (u == c.n_layers + 1) {
    w.final_norm_w = mw.final_norm_w;
    w.final_norm_b = mw.final_norm_b;
    w.lm_head = mw.lm_head;
    remap(w.final_norm_w);
    remap(w.final_norm_b);
    remap(w.lm_head);
  } else {
    LayerWeights L = mw.layers[size_t(u - 1)];
    for (TensorView* v : {&L.ln1_w, &L.ln1_b, &L.q_w, &L.q_b, &L.k_w, &L.k_b, &L.v_w, &L.v_b, &L.o_w, &L.o_b,
                          &L.ln2_w, &L.ln2_b, &L.fc1_w, &L.fc1_b, &L.fc2_w, &L.fc2_b, &L.gate_w, &L.up_w,
                          &L.down_w, &L.gate_b, &L.up_b, &L.down_b})
      remap(*v);
    w.layers.push_back(L);
  }
  return w;
}

// ---- KV cache --------------------------------------------------------------------------

void OffloadEngine::Impl::copy_rows(float* dst, int64_t dst_n, int64_t dst_first, const float* src, int64_t src_n,
                                    int64_t src_first, int64_t count, const std::vector<int32_t>& r0,
                                    const std::vector<int32_t>& r1, int64_t seq0, Link link) {
  const int64_t hd = c.head_dim, kvh = c.n_kv_heads;
  uint64_t moved = 0;
  for (int part = 0; part < 2; ++part) {  // K then V
    float* d = dst + part * region(dst_n);
    const float* s = src + part * region(src_n);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t a = r0[size_t(seq0 + i)], b = r1[size_t(seq0 + i)];
      if (b <= a) continue;
      for (int64_t h = 0; h < kvh; ++h) {
        std::memcpy(d + (((dst_first + i) * kvh + h) * capacity + a) * hd,
                    s + (((src_first + i) * kvh + h) * capacity + a) * hd, size_t((b - a) * hd) * sizeof(float));
        moved += uint64_t((b - a) * hd) * sizeof(float);
      }
    }
  }
  e.counters_.add(link, moved);
}

void OffloadEngine::Impl::disk_rows(int layer, int k, float* host, bool write, const std::vector<int32_t>& r0,
                                    const std::vector<int32_t>& r1) {
  const MicroBatch& mb = mbs[size_t(k)];
  const int64_t nd = mb.split.n_disk, hd = c.head_dim, kvh = c.n_kv_heads;
  const int64_t seq0 = mb.first + mb.split.n_device + mb.split.n_host;
  const std::string& name = mb.kv_disk[size_t(layer)];
  uint64_t moved = 0;
  for (int part = 0; part < 2; ++part) {
    for (int64_t i = 0; i < nd; ++i) {
      const int64_t a = r0[size_t(seq0 + i)], b = r1[size_t(seq0 + i)];
      if (b <= a) continue;
      for (int64_t h = 0; h < kvh; ++h) {
        const int64_t off = part * region(nd) + ((i * kvh + h) * capacity + a) * hd;
        const size_t len = size_t((b - a) * hd) * sizeof(float);
        Status s = write ? e.store_->write(name, uint64_t(off) * sizeof(float), len, host + off)
                         : e.store_->read(name, uint64_t(off) * sizeof(float), len, host + off);
        s.throw_if_error();
        moved += len;
      }
    }
  }
  e.counters_.add(write ? Link::kHostToDisk : Link::kDiskToHost, moved);
}

void OffloadEngine::Impl::load_cache_disk(int u, int k) {
  const std::vector<int32_t> zero(size_t(batch), 0);
  disk_rows(u - 1, k, kv_stage_host[size_t(pair(u, k) % 2)].floats(), false, zero, len_before);
}

void OffloadEngine::Impl::load_cache(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvSplit& sp = mb.split;
  const std::vector<int32_t> zero(size_t(batch), 0);
  float* stage = kv_stage_device[size_t(pair(u, k) % 2)].floats();
  const int64_t off = sp.n_host + sp.n_disk;
  const int64_t host0 = mb.first + sp.n_device;
  copy_rows(stage, off, 0, mb.kv_host[size_t(u - 1)].floats(), sp.n_host, 0, sp.n_host, zero, len_before, host0,
            Link::kHostToDevice);
  if (sp.n_disk)
    copy_rows(stage, off, sp.n_host, kv_stage_host[size_t(pair(u, k) % 2)].floats(), sp.n_disk, 0, sp.n_disk, zero,
              len_before, host0 + sp.n_host, Link::kHostToDevice);
}

void OffloadEngine::Impl::store_cache(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvSplit& sp = mb.split;
  const float* stage = kv_stage_device[size_t(pair(u, k) % 2)].floats();
  const int64_t off = sp.n_host + sp.n_disk;
  const int64_t host0 = mb.first + sp.n_device;
  copy_rows(mb.kv_host[size_t(u - 1)].floats(), sp.n_host, 0, stage, off, 0, sp.n_host, len_before, len_after,
            host0, Link::kDeviceToHost);
  if (sp.n_disk)
    copy_rows(kv_bounce[size_t(pair(u, k) % 2)].floats(), sp.n_disk, 0, stage, off, sp.n_host, sp.n_disk, len_before,
              len_after, host0 + sp.n_host, Link::kDeviceToHost);
}

void OffloadEngine::Impl::store_cache_disk(int u, int k) {
  const bool host_path = !prefill && p.cpu_cache_compute;
  auto& src = host_path ? kv_stage_host : kv_bounce;
  disk_rows(u - 1, k, src[size_t(pair(u, k) % 2)].floats(), true, len_before, len_after);
}

// ---- hidden states and compute --------------------------------------------------------

float* OffloadEngine::Impl::device_hidden(int u, int k) {
  if (p.act_cpu_percent == 100) return hidden_slot[size_t((u * int(mbs.size()) + k) % 2)].floats();
  return mbs[size_t(k)].hidden_device.floats();
}

void OffloadEngine::Impl::load_hidden(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const size_t bytes = size_t(mb.n * T * c.hidden) * sizeof(float);
  std::memcpy(device_hidden(u, k), mb.hidden_host.data(), bytes);
  e.counters_.add(Link::kHostToDevice, bytes);
}

void OffloadEngine::Impl::store_hidden(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const size_t bytes = size_t(mb.n * T * c.hidden) * sizeof(float);
  std::memcpy(mb.hidden_host.data(), device_hidden(u, k), bytes);
  e.counters_.add(Link::kDeviceToHost, bytes);
}

void OffloadEngine::Impl::compute(int u, int k) {
  MicroBatch& mb = mbs[size_t(k)];
  const StepShape s{mb.n, T, positions + mb.first * T, len_after.data() + mb.first};
  float* hidden = device_hidden(u, k);
  const ModelWeights w = unit_weights(u);
  e.dev_.run([&] {
    if (u == 0) {
      compute_.embed(c, w, ids + mb.first * T, s, hidden);
    } else if (u == c.n_layers + 1) {
      compute_.head(c, w, s, hidden, /*last_only=*/true, mb.logits);
    } else {
      const int l = u - 1;
      const KvSplit& sp = mb.split;
      const bool host_attn = p.cpu_cache_compute && !prefill;
      const int slot = pair(u, k) % 2;
      std::vector<KvSegment> segs;
      float* kd = mb.kv_device[size_t(l)].floats();
      segs.push_back({kd, kd + region(sp.n_device), 0, sp.n_device, capacity});
      const int64_t off = sp.n_host + sp.n_disk;
      float* st = kv_stage_device[size_t(slot)].floats();
      if (host_attn) {
        float* kh = mb.kv_host[size_t(l)].floats();
        float* ks = kv_stage_host[size_t(slot)].floats();
        segs.push_back({kh, kh + region(sp.n_host), sp.n_device, sp.n_host, capacity});
        segs.push_back({ks, ks + region(sp.n_disk), sp.n_device + sp.n_host, sp.n_disk, capacity});
        // q and the new K/V rows go to the host, the attention output comes back.
        const uint64_t rows = uint64_t(off * T) * sizeof(float);
        e.counters_.add(Link::kDeviceToHost, rows * uint64_t(c.q_dim() + 2 * c.kv_dim()));
        e.counters_.add(Link::kHostToDevice, rows * uint64_t(c.q_dim()));
      } else {
        segs.push_back({st, st + region(off), sp.n_device, sp.n_host, capacity});
        segs.push_back({st + region(sp.n_host), st + region(off) + region(sp.n_host), sp.n_device + sp.n_host,
                        sp.n_disk, capacity});
      }
      compute_.layer(c, w.layers[0], s, hidden, segs);
    }
  });
}

}  // namespace flexh2o
