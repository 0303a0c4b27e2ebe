// OffloadEngine step actions: per-batch buffers, weight/KV/hidden loads and stores between
// tiers (counted per link), and the compute of one unit on one micro-batch.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/offload_impl.h"

namespace flexh2o {

void OffloadEngine::Impl::begin_batch(int64_t B, int64_t cap) {
  // Free the previous batch's buffers; the new ones are sized at the prefill, when the prompt
  // lengths (and so the KV budgets) are known.
  mbs.clear();
  for (auto* slots : {&kv_stage_device, &kv_stage_host, &kv_bounce, &hidden_slot})
    for (auto& b : *slots) b = TierBuffer();
  scratch_charge = TierCharge();
  batch = B;
  capacity = cap;
  allocated = false;
  s_max = 0;
  ++batch_no;
  len_before.assign(size_t(B), 0);
  len_after.assign(size_t(B), 0);
  len_final.assign(size_t(B), 0);
  seen.assign(size_t(B), 0);
}

void OffloadEngine::Impl::allocate_batch(const int32_t* real_rows) {
  const KvPolicy* policy = e.opts_.kv_policy;
  const int64_t a = kv_capacity_align(c), B = batch;
  auto up = [&](int64_t n) { return (n + a - 1) / a * a; };
  int64_t budget_max = 0;
  bool bounded = policy != nullptr;
  budgets.clear();
  for (int64_t b = 0; b < B && policy; ++b) {
    budgets.push_back(policy->budget(real_rows ? real_rows[b] : T));
    if (budgets.back().unbounded) bounded = false;
    else budget_max = std::max(budget_max, budgets.back().total());
  }
  cap_w = up(bounded ? std::min(capacity, std::max(T, budget_max)) : capacity);
  cap_h = up(bounded ? std::min(capacity, std::max<int64_t>(budget_max, 1)) : capacity);
  const size_t per_w = size_t(2 * region(1, cap_w)) * sizeof(float), per_h = size_t(2 * region(1, cap_h)) * sizeof(float);
  int64_t max_off = 0, max_disk = 0;
  for (int64_t first = 0, k = 0; first < B; first += p.gpu_batch_size, ++k) {
    MicroBatch mb;
    mb.first = first;
    mb.n = std::min(p.gpu_batch_size, B - first);
    mb.split = split_kv(mb.n, p);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string tag = "KV layer " + std::to_string(l) + " micro-batch " + std::to_string(k);
      mb.kv_device.emplace_back();
      alloc(Tier::kDevice, size_t(mb.split.n_device) * per_w, tag, mb.kv_device.back());
      mb.kv_host.emplace_back();
      alloc(Tier::kHost, size_t(mb.split.n_host) * per_h, tag, mb.kv_host.back());
      if (mb.split.n_disk > 0) {
        const uint64_t bytes = uint64_t(mb.split.n_disk) * per_h;
        mb.kv_disk_charge.emplace_back();
        Status s = TierCharge::reserve(*e.budgets_[2], bytes, tag, &mb.kv_disk_charge.back());
        if (!s.ok()) FH_FAIL(s.message());
        mb.kv_disk.push_back("kv.L" + std::to_string(l) + ".mb" + std::to_string(k));
        e.store_->create(mb.kv_disk.back(), bytes).throw_if_error();
      }
      if (policy) {
        mb.policy_state.emplace_back();
        mb.policy_state.back().reset(mb.n, c.n_kv_heads, cap_w);
      }
    }
    max_off = std::max(max_off, mb.split.n_host + mb.split.n_disk);
    max_disk = std::max(max_disk, mb.split.n_disk);
    mbs.push_back(std::move(mb));
  }
  for (int s = 0; s < 2; ++s) {
    alloc(Tier::kDevice, size_t(max_off) * per_w, "KV staging", kv_stage_device[size_t(s)]);
    alloc(Tier::kHost, size_t(max_disk) * per_h, "KV disk staging", kv_stage_host[size_t(s)]);
    alloc(Tier::kHost, size_t(max_disk) * per_h, "KV disk bounce", kv_bounce[size_t(s)]);
  }
  dirty_lo.assign(size_t(c.n_layers), std::vector<int32_t>(size_t(B * c.n_kv_heads), 0));
  dirty_hi = dirty_lo;
  // Hidden states and scratch for the longest step (the prefill).
  s_max = T;
  const size_t rows = size_t(p.gpu_batch_size * T), row_bytes = size_t(c.hidden) * sizeof(float);
  const bool act_host = p.act_cpu_percent == 100;
  for (MicroBatch& mb : mbs) {
    alloc(act_host ? Tier::kHost : Tier::kDevice, size_t(mb.n * T) * row_bytes, "hidden states",
          act_host ? mb.hidden_host : mb.hidden_device);
    mb.logits.resize(size_t(mb.n * c.vocab_size));
  }
  for (auto& h : hidden_slot)
    if (act_host) alloc(Tier::kDevice, rows * row_bytes, "hidden state slot", h);
  Status s = TierCharge::reserve(*e.budgets_[0], uint64_t(LayerCompute::scratch_bytes(c, int64_t(rows))),
                                 "compute scratch", &scratch_charge);
  if (!s.ok()) FH_FAIL(s.message());
  allocated = true;
}

void OffloadEngine::Impl::prepare_step(const int32_t* step_ids, const int32_t* step_pos, int64_t steps_T,
                                       const int32_t* real_rows) {
  ids = step_ids;
  positions = step_pos;
  T = steps_T;
  prefill = !allocated;
  if (prefill) allocate_batch(real_rows);
  FH_CHECK(T <= s_max, "step of ", T, " rows after a prefill of ", s_max);
  const int64_t kvh = c.n_kv_heads;
  load_lo.assign(size_t(batch * kvh), 0);
  load_hi.resize(size_t(batch * kvh));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t add = real_rows ? real_rows[b] : T;
    len_after[size_t(b)] = int32_t(len_before[size_t(b)] + add);
    FH_CHECK(len_after[size_t(b)] <= cap_w, "KV cache full: sequence ", b, " needs ", len_after[size_t(b)],
             " slots, capacity ", cap_w);
    int64_t keep = len_after[size_t(b)];
    if (!budgets.empty() && !budgets[size_t(b)].unbounded)
      keep = std::min<int64_t>(keep, std::max<int64_t>(budgets[size_t(b)].total() - 1, 0));
    FH_CHECK(keep <= cap_h, "KV home holds ", cap_h, " slots, sequence keeps ", keep);
    len_final[size_t(b)] = int32_t(keep);
    for (int64_t h = 0; h < kvh; ++h) load_hi[size_t(b * kvh + h)] = len_before[size_t(b)];
  }
  for (int64_t i = 0; i < batch * T; ++i) {
    FH_CHECK(positions[i] >= 0 && positions[i] < c.max_positions, "position ", positions[i], " out of range");
    FH_CHECK(ids[i] >= 0 && ids[i] < c.vocab_size, "token id ", ids[i], " outside the vocabulary [0, ", c.vocab_size,
             ")");
  }
  gather_rows = batch * T < c.vocab_size;
  local_ids.resize(size_t(batch * T));
  for (int64_t i = 0; i < batch * T; ++i) local_ids[size_t(i)] = int32_t(i);
}

void OffloadEngine::Impl::finish_step(std::vector<float>& logits) {
  logits.resize(size_t(batch * c.vocab_size));
  for (const MicroBatch& mb : mbs)
    std::copy(mb.logits.begin(), mb.logits.end(), logits.begin() + mb.first * c.vocab_size);
  for (int64_t b = 0; b < batch; ++b) seen[size_t(b)] += len_after[size_t(b)] - len_before[size_t(b)];
  len_before = len_final;
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
  const size_t slot = size_t((u + slot_phase) % 2);
  if (u == c.n_layers + 2) u = 1;  // the next step's first layer (schedule.h: prefetch_next)
  std::byte* stage = weight_stage[slot].data();
  for (const WeightHome& h : units[size_t(u)]) {
    if (h.tier != Tier::kDisk) continue;
    if (h.token_table && gather_rows) {  // the step's rows only, in step order
      const size_t row = h.bytes / size_t(c.vocab_size);
      for (int64_t i = 0; i < batch * T; ++i)
        e.store_->read(h.store_name, uint64_t(ids[i]) * row, row, stage + h.stage_offset + size_t(i) * row)
            .throw_if_error();
      e.counters_.add(Link::kDiskToHost, uint64_t(batch * T) * row);
      continue;
    }
    e.store_->read(h.store_name, 0, h.bytes, stage + h.stage_offset).throw_if_error();
    e.counters_.add(Link::kDiskToHost, h.bytes);
  }
}

void OffloadEngine::Impl::load_weight(int u) {
  const size_t s = size_t((u + slot_phase) % 2);
  if (u == c.n_layers + 2) u = 1;
  std::byte* slot = weight_slot[s].data();
  for (const WeightHome& h : units[size_t(u)]) {
    if (h.tier == Tier::kDevice) continue;
    const bool staged = h.tier == Tier::kDisk;
    const std::byte* src = staged ? weight_stage[s].data() + h.stage_offset : h.home.data();
    if (h.token_table && gather_rows) {
      const size_t row = h.bytes / size_t(c.vocab_size), n = size_t(batch * T);
      if (staged) {
        std::memcpy(slot + h.slot_offset, src, n * row);  // already in step order
      } else {
        for (size_t i = 0; i < n; ++i) std::memcpy(slot + h.slot_offset + i * row, src + size_t(ids[i]) * row, row);
      }
      e.counters_.add(Link::kHostToDevice, n * row);
      continue;
    }
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
                                       : static_cast<const void*>(weight_slot[size_t((u + slot_phase) % 2)].data() +
                                                                  h.slot_offset);
      if (h.token_table && h.tier != Tier::kDevice && gather_rows) v.shape = Shape({batch * T, c.hidden});
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

void OffloadEngine::Impl::copy_rows(KvBuf dst, int64_t dst_first, KvBuf src, int64_t src_first, int64_t count,
                                    const int32_t* lo, const int32_t* hi, int64_t seq0, Link link) {
  const int64_t hd = c.head_dim, kvh = c.n_kv_heads;
  uint64_t moved = 0;
  for (int part = 0; part < 2; ++part) {  // K then V
    float* d = dst.data + part * region(dst.n, dst.cap);
    const float* s = src.data + part * region(src.n, src.cap);
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t h = 0; h < kvh; ++h) {
        const int64_t a = lo[(seq0 + i) * kvh + h], b = hi[(seq0 + i) * kvh + h];
        if (b <= a) continue;
        std::memcpy(d + (((dst_first + i) * kvh + h) * dst.cap + a) * hd,
                    s + (((src_first + i) * kvh + h) * src.cap + a) * hd, size_t((b - a) * hd) * sizeof(float));
        moved += uint64_t((b - a) * hd) * sizeof(float);
      }
    }
  }
  e.counters_.add(link, moved);
  e.counters_.add_kv(moved);
}

void OffloadEngine::Impl::disk_rows(int layer, int k, float* host, bool write, const int32_t* lo, const int32_t* hi) {
  const MicroBatch& mb = mbs[size_t(k)];
  const int64_t nd = mb.split.n_disk, hd = c.head_dim, kvh = c.n_kv_heads;
  const int64_t seq0 = mb.first + mb.split.n_device + mb.split.n_host;
  const std::string& name = mb.kv_disk[size_t(layer)];
  uint64_t moved = 0;
  for (int part = 0; part < 2; ++part) {
    for (int64_t i = 0; i < nd; ++i) {
      for (int64_t h = 0; h < kvh; ++h) {
        const int64_t a = lo[(seq0 + i) * kvh + h], b = hi[(seq0 + i) * kvh + h];
        if (b <= a) continue;
        const int64_t off = part * region(nd, cap_h) + ((i * kvh + h) * cap_h + a) * hd;
        const size_t len = size_t((b - a) * hd) * sizeof(float);
        Status s = write ? e.store_->write(name, uint64_t(off) * sizeof(float), len, host + off)
                         : e.store_->read(name, uint64_t(off) * sizeof(float), len, host + off);
        s.throw_if_error();
        moved += len;
      }
    }
  }
  e.counters_.add(write ? Link::kHostToDisk : Link::kDiskToHost, moved);
  e.counters_.add_kv(moved);
}

void OffloadEngine::Impl::load_cache_disk(int u, int k) {
  disk_rows(u - 1, k, kv_stage_host[size_t(pair(u, k) % 2)].floats(), false, load_lo.data(), load_hi.data());
}

void OffloadEngine::Impl::load_cache(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvSplit& sp = mb.split;
  const int slot = pair(u, k) % 2;
  const KvBuf stage{kv_stage_device[size_t(slot)].floats(), sp.n_host + sp.n_disk, cap_w};
  const int64_t host0 = mb.first + sp.n_device;
  copy_rows(stage, 0, {mb.kv_host[size_t(u - 1)].floats(), sp.n_host, cap_h}, 0, sp.n_host, load_lo.data(),
            load_hi.data(), host0, Link::kHostToDevice);
  if (sp.n_disk)
    copy_rows(stage, sp.n_host, {kv_stage_host[size_t(slot)].floats(), sp.n_disk, cap_h}, 0, sp.n_disk,
              load_lo.data(), load_hi.data(), host0 + sp.n_host, Link::kHostToDevice);
}

void OffloadEngine::Impl::store_cache(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvSplit& sp = mb.split;
  const int slot = pair(u, k) % 2;
  const KvBuf stage{kv_stage_device[size_t(slot)].floats(), sp.n_host + sp.n_disk, cap_w};
  const int64_t host0 = mb.first + sp.n_device;
  const int32_t* lo = dirty_lo[size_t(u - 1)].data();
  const int32_t* hi = dirty_hi[size_t(u - 1)].data();
  copy_rows({mb.kv_host[size_t(u - 1)].floats(), sp.n_host, cap_h}, 0, stage, 0, sp.n_host, lo, hi, host0,
            Link::kDeviceToHost);
  if (sp.n_disk)
    copy_rows({kv_bounce[size_t(slot)].floats(), sp.n_disk, cap_h}, 0, stage, sp.n_host, sp.n_disk, lo, hi,
              host0 + sp.n_host, Link::kDeviceToHost);
}

void OffloadEngine::Impl::store_cache_disk(int u, int k) {
  const bool host_path = !prefill && p.cpu_cache_compute;
  auto& src = host_path ? kv_stage_host : kv_bounce;
  disk_rows(u - 1, k, src[size_t(pair(u, k) % 2)].floats(), true, dirty_lo[size_t(u - 1)].data(),
            dirty_hi[size_t(u - 1)].data());
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
      const bool local = gather_rows && token_streamed;
      compute_.embed(c, w, (local ? local_ids.data() : ids) + mb.first * T, s, hidden);
      return;
    }
    if (u == c.n_layers + 1) {
      compute_.head(c, w, s, hidden, /*last_only=*/true, mb.logits);
      return;
    }
    const int l = u - 1;
    const KvSplit& sp = mb.split;
    const bool host_attn = p.cpu_cache_compute && !prefill;
    const int slot = pair(u, k) % 2;
    const int64_t off = sp.n_host + sp.n_disk;
    std::vector<KvSegment> segs;
    float* kd = mb.kv_device[size_t(l)].floats();
    segs.push_back({kd, kd + region(sp.n_device, cap_w), 0, sp.n_device, cap_w});
    if (host_attn) {
      float* kh = mb.kv_host[size_t(l)].floats();
      float* ks = kv_stage_host[size_t(slot)].floats();
      segs.push_back({kh, kh + region(sp.n_host, cap_h), sp.n_device, sp.n_host, cap_h});
      segs.push_back({ks, ks + region(sp.n_disk, cap_h), sp.n_device + sp.n_host, sp.n_disk, cap_h});
      // q and the new K/V rows go to the host, the attention output comes back.
      const uint64_t rows = uint64_t(off * T) * sizeof(float);
      e.counters_.add(Link::kDeviceToHost, rows * uint64_t(c.q_dim() + 2 * c.kv_dim()));
      e.counters_.add(Link::kHostToDevice, rows * uint64_t(c.q_dim()));
    } else {
      float* st = kv_stage_device[size_t(slot)].floats();
      segs.push_back({st, st + region(off, cap_w), sp.n_device, sp.n_host, cap_w});
      segs.push_back({st + region(sp.n_host, cap_w), st + region(off, cap_w) + region(sp.n_host, cap_w),
                      sp.n_device + sp.n_host, sp.n_disk, cap_w});
    }
    const KvPolicy* policy = e.opts_.kv_policy;
    std::vector<std::vector<float>> scores(segs.size());
    if (policy && policy->needs_scores()) {
      for (size_t i = 0; i < segs.size(); ++i) {
        scores[i].assign(size_t(segs[i].n_seq * c.n_heads * segs[i].capacity), 0.f);
        segs[i].key_scores = scores[i].data();
      }
    }
    compute_.layer(c, w.layers[0], s, hidden, segs);
    const int64_t kvh = c.n_kv_heads;
    std::vector<int32_t>& dlo = dirty_lo[size_t(l)];
    std::vector<int32_t>& dhi = dirty_hi[size_t(l)];
    if (!policy) {
      for (int64_t b = mb.first; b < mb.first + mb.n; ++b)
        for (int64_t h = 0; h < kvh; ++h) {
          dlo[size_t(b * kvh + h)] = len_before[size_t(b)];
          dhi[size_t(b * kvh + h)] = len_after[size_t(b)];
        }
      return;
    }
    std::vector<int32_t> after, lo, hi;
    for (const KvSegment& seg : segs) {
      if (seg.n_seq == 0) continue;
      const int64_t g0 = mb.first + seg.first_seq;
      after.assign(len_after.begin() + g0, len_after.begin() + g0 + seg.n_seq);
      EvictArgs ea;
      ea.policy = policy;
      ea.config = &c;
      ea.seg = seg;
      ea.state_first = seg.first_seq;
      ea.state = &mb.policy_state[size_t(l)];
      ea.len_before = len_before.data() + g0;
      ea.len_after = after.data();
      ea.seen_before = seen.data() + g0;
      ea.budgets = budgets.data() + g0;
      ea.prefill = prefill;
      ea.salt = uint64_t(l);
      ea.dirty_lo = &lo;
      ea.dirty_hi = &hi;
      apply_kv_policy(ea);
      for (int64_t i = 0; i < seg.n_seq; ++i) {
        FH_CHECK(after[size_t(i)] == len_final[size_t(g0 + i)], "eviction kept ", after[size_t(i)], " tokens, expected ",
                 len_final[size_t(g0 + i)]);
        for (int64_t h = 0; h < kvh; ++h) {
          dlo[size_t((g0 + i) * kvh + h)] = lo[size_t(i * kvh + h)];
          dhi[size_t((g0 + i) * kvh + h)] = hi[size_t(i * kvh + h)];
        }
      }
    }
  });
}

}  // namespace flexh2o
