// OffloadEngine compute steps: a unit on the device (embedding, attention with its KV segments,
// MLP, head), the host attention over host-homed and disk-staged KV (cpu_cache_compute), and
// the KV policy's decisions on the host with their effect on host homes, disk staging and the
// device-homed cache.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/layer_compute.h"
#include "engine/offload_impl.h"
#include "kernels/cpu/ops.h"

namespace flexh2o {

void OffloadEngine::Impl::compute(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const UnitKind kind = e.placement_.units[size_t(u)].kind;
  std::byte* hidden = device_hidden(u, k);
  const StepRows r = rows(k, layer(u));
  if (kind == UnitKind::kEmbed && hidden_in) {  // a later pipeline stage: the previous stage's rows
    const size_t bytes = size_t(mb.n * T * c.hidden) * es_a;
    return dev.copy(Queue::kCompute, hidden, hidden_in_device.data() + size_t(mb.first * T * c.hidden) * es_a, bytes);
  }
  if (kind == UnitKind::kHead && hidden_out) {
    const size_t bytes = size_t(mb.n * T * c.hidden) * es_a;
    return dev.copy(Queue::kCompute, hidden_out_device.data() + size_t(mb.first * T * c.hidden) * es_a, hidden, bytes);
  }
  if (kind == UnitKind::kEmbed) {
    ModelWeights w = weights(u);
    if (gather_rows && token_streamed) w.embed.shape = Shape({batch * T, c.hidden});
    return dev.embed(c, w, r, hidden);
  }
  if (kind == UnitKind::kHead) {
    const int64_t R = step_logit_rows, V = c.vocab_size;
    if (R == 1) return dev.head(c, weights(u), r, hidden, T - 1, 1, logits_device.as<float>() + mb.first * V);
    // Many rows (scoring): plan.head_rows rows of each sequence a call through the device slot
    // ([rows, n, V]), copied out to their blocks of the host logits [R, batch, V]. The compute
    // queue orders the copy before the next call writes the slot.
    const float* out = logits_device.as<float>();
    const size_t row = size_t(mb.n * V) * 4;
    for (int64_t i = 0; i < R; i += plan.head_rows) {
      const int64_t g = std::min(plan.head_rows, R - i);
      dev.head(c, weights(u), r, hidden, T - R + i, g, logits_device.as<float>());
      dev.copy_2d(Queue::kCompute, logits_host.as<float>() + (i * batch + mb.first) * V, size_t(batch * V) * 4, out,
                  row, row, size_t(g));
    }
    return;
  }
  const LayerWeights& L = weights(u).layers[0];
  if (kind == UnitKind::kMlp) return dev.mlp(c, L, r, hidden);
  const int l = layer(u), p_ = pair(u, k);
  const size_t slot = size_t(p_ % 2);
  const KvSplit& sp = mb.split;
  const int64_t n = mb.n, off = sp.n_host + sp.n_disk, M = n * T;
  std::byte* q = qkv_slot(p_);
  std::byte* kk = q + size_t(M * c.q_dim()) * es_a;
  std::byte* vv = kk + size_t(M * c.kv_dim()) * es_a;
  std::byte* attn = attn_slot(p_);
  dev.attention_in(c, L, r, hidden, q, kk, vv);
  float* scores = scores_device[slot] ? scores_device[slot].as<float>() : nullptr;
  const int64_t cap_w = kv_class(l).cap_w, srow = c.n_heads * cap_w;
  std::vector<KvSegment> segs;
  const Buffer& home = mb.kv_device[size_t(l)];
  if (sp.n_device > 0)
    segs.push_back({kv_at(home, sp.n_device, cap_w, 0, 0), kv_at(home, sp.n_device, cap_w, 1, 0), kvdt, 0, sp.n_device,
                    cap_w, scores});
  if (off > 0 && !split()) {
    const Buffer& st = kv_stage_device[slot];
    segs.push_back({kv_at(st, off, cap_w, 0, 0), kv_at(st, off, cap_w, 1, 0), kvdt, sp.n_device, sp.n_host, cap_w,
                    scores ? scores + sp.n_device * srow : nullptr});
    segs.push_back({kv_at(st, off, cap_w, 0, sp.n_host), kv_at(st, off, cap_w, 1, sp.n_host), kvdt,
                    sp.n_device + sp.n_host, sp.n_disk, cap_w, scores ? scores + (sp.n_device + sp.n_host) * srow : nullptr});
  }
  std::erase_if(segs, [](const KvSegment& s) { return s.n_seq == 0; });
  for (KvSegment& s : segs) s.window = c.attention_window(l);
  if (scores && !segs.empty()) {
    const int64_t attended = segs.back().first_seq + segs.back().n_seq;
    dev.fill_zero(Queue::kCompute, scores, size_t(attended * srow) * 4);
  }
  if (!segs.empty()) dev.attend(c, r, q, kk, vv, segs, attn);
  if (split()) return;  // the host attends the offloaded sequences; compute_rest() finishes
  dev.attention_out(c, L, r, attn, hidden);
  if (kind == UnitKind::kLayer) dev.mlp(c, L, r, hidden);
}

void OffloadEngine::Impl::compute_rest(int u, int k) {
  const LayerWeights& L = weights(u).layers[0];
  const StepRows r = rows(k, layer(u));
  std::byte* hidden = device_hidden(u, k);
  dev.attention_out(c, L, r, attn_slot(pair(u, k)), hidden);
  if (e.placement_.units[size_t(u)].kind == UnitKind::kLayer) dev.mlp(c, L, r, hidden);
}

EvictArgs OffloadEngine::Impl::evict_args(int l, int k, const KvSegment& seg, int64_t mb_seq, int64_t score_cap,
                                          std::vector<int32_t>& after, std::vector<int32_t>& dlo,
                                          std::vector<int32_t>& dhi) {
  MicroBatch& mb = mbs[size_t(k)];
  const KvClass& kc = kv_class(l);
  const int64_t g0 = mb.first + mb_seq;
  after.assign(kc.len_after.begin() + g0, kc.len_after.begin() + g0 + seg.n_seq);
  EvictArgs ea;
  ea.policy = kv_policy;
  ea.config = &c;
  ea.seg = seg;
  ea.seg.window = c.attention_window(l);
  ea.score_capacity = score_cap;
  ea.state_first = mb_seq;
  KvPolicyState& state = mb.policy_state[size_t(l)];
  ea.state = state.capacity ? &state : nullptr;
  ea.len_before = kc.len_before.data() + g0;
  ea.len_after = after.data();
  ea.seen_before = seen.data() + g0;
  ea.budgets = kc.budgets.data() + g0;
  ea.prefill = prefill;
  ea.salt = uint64_t(l);
  ea.dirty_lo = &dlo;
  ea.dirty_hi = &dhi;
  return ea;
}

namespace {
void check_kept(const std::vector<int32_t>& after, const std::vector<int32_t>& want, int64_t g0) {
  for (size_t i = 0; i < after.size(); ++i)
    FH_CHECK(after[i] == want[size_t(g0) + i], "eviction kept ", after[i], " tokens, expected ", want[size_t(g0) + i]);
}
}  // namespace

void OffloadEngine::Impl::host_attention(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvSplit& sp = mb.split;
  const int l = layer(u);
  const KvClass& kc = kv_class(l);
  const int64_t cap_h = kc.cap_h;
  const std::vector<int32_t>&len_before = kc.len_before, &len_after = kc.len_after, &len_final = kc.len_final;
  const size_t slot = size_t(pair(u, k) % 2);
  const int64_t nd = sp.n_device, off = sp.n_host + sp.n_disk, rows = off * T, Q = c.q_dim(), KV = c.kv_dim();
  const int64_t g0 = mb.first + nd, kvh = c.n_kv_heads;
  const Buffer& home = mb.kv_host[size_t(l)];
  const Buffer& stage = kv_stage_host[slot];
  const std::byte* qh = qkv_host[slot].data();
  const int agent = int(Queue::kHost);
  dev.host_access(agent, qh, size_t(rows * (Q + 2 * KV)) * es_a, false);
  dev.host_access(agent, home.data(), home.size(), true);
  if (sp.n_disk) dev.host_access(agent, stage.data(), size_t(sp.n_disk) * kc.home_seq, true);
  dev.host_access(agent, attn_host[slot].data(), size_t(rows * Q) * es_a, true);
  dev.host_run([&] {
    std::vector<float> q32, k32, v32, a32(size_t(rows * Q));
    auto f32 = [&](const std::byte* src, int64_t count, std::vector<float>& tmp) -> const float* {
      if (adt == DType::F32) return reinterpret_cast<const float*>(src);
      tmp.resize(size_t(count));
      cpu::to_f32(adt, src, count, tmp.data());
      return tmp.data();
    };
    const float* qf = f32(qh, rows * Q, q32);
    const float* kf = f32(qh + size_t(rows * Q) * es_a, rows * KV, k32);
    const float* vf = f32(qh + size_t(rows * (Q + KV)) * es_a, rows * KV, v32);
    const StepShape s{off, T, inputs_host.as<int32_t>() + batch * T + g0 * T, len_after.data() + g0};
    const bool scores = kv_policy && kv_policy->needs_scores();
    KvSegment segs[2] = {
        {kv_at(home, sp.n_host, cap_h, 0, 0), kv_at(home, sp.n_host, cap_h, 1, 0), kvdt, 0, sp.n_host, cap_h, nullptr},
        {kv_at(stage, sp.n_disk, cap_h, 0, 0), kv_at(stage, sp.n_disk, cap_h, 1, 0), kvdt, sp.n_host, sp.n_disk, cap_h,
         nullptr}};
    std::vector<float> sc[2];
    LayerCompute lc;
    for (int i = 0; i < 2; ++i) {
      if (segs[i].n_seq == 0) continue;
      segs[i].window = c.attention_window(l);
      if (scores) {
        sc[i].assign(size_t(segs[i].n_seq * c.n_heads * segs[i].capacity), 0.f);
        segs[i].key_scores = sc[i].data();
      }
      lc.attend(c, s, qf, kf, vf, segs[i], a32.data());
    }
    if (adt == DType::F32) std::memcpy(attn_host[slot].data(), a32.data(), a32.size() * 4);
    else cpu::from_f32(a32.data(), rows * Q, adt, attn_host[slot].data());
    // The policy where the rows live; the disk rows it changed are stored next (SCD).
    std::vector<int32_t> after, dlo, dhi;
    for (int i = 0; i < 2; ++i) {
      const KvSegment& seg = segs[i];
      if (seg.n_seq == 0) continue;
      const int64_t mb_seq = nd + seg.first_seq, gs = mb.first + mb_seq;
      const bool disk = i == 1;
      if (!kv_policy) {
        if (disk)
          for (int64_t b = gs; b < gs + seg.n_seq; ++b)
            for (int64_t h = 0; h < kvh; ++h) {
              dirty_lo[size_t(l)][size_t(b * kvh + h)] = len_before[size_t(b)];
              dirty_hi[size_t(l)][size_t(b * kvh + h)] = len_after[size_t(b)];
            }
        continue;
      }
      apply_kv_policy(evict_args(l, k, seg, mb_seq, 0, after, dlo, dhi));
      check_kept(after, len_final, gs);
      if (disk)
        for (int64_t i2 = 0; i2 < seg.n_seq * kvh; ++i2) {
          dirty_lo[size_t(l)][size_t(gs * kvh + i2)] = dlo[size_t(i2)];
          dirty_hi[size_t(l)][size_t(gs * kvh + i2)] = dhi[size_t(i2)];
        }
    }
  });
}

void OffloadEngine::Impl::update_cache(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvSplit& sp = mb.split;
  const int l = layer(u);
  const KvClass& kc = kv_class(l);
  const int64_t cap_w = kc.cap_w;
  const std::vector<int32_t>& len_final = kc.len_final;
  const size_t slot = size_t(pair(u, k) % 2);
  const int64_t kvh = c.n_kv_heads, off = sp.n_host + sp.n_disk;
  const int agent = int(Queue::kHost);
  float* scores = scores_host[slot] ? scores_host[slot].as<float>() : nullptr;
  const int64_t srow = c.n_heads * cap_w;
  if (scores) dev.host_access(agent, scores, size_t(mb.n * srow) * 4, false);
  // Sequences whose rows the device compacts (gather_cache): the device-homed ones, and at a
  // prefill the offloaded ones in the staging slot too; their keep lists go to the keep slot.
  const int64_t listed = sp.n_device + (kept_mode() ? off : 0);
  dev.host_run([&] {
    std::vector<int32_t> after, dlo, dhi;
    if (listed > 0) {
      int32_t* lists = keep_host[slot].as<int32_t>();
      int32_t* counts = lists + mb.n * kvh * cap_w;
      dev.host_access(agent, lists, keep_host[slot].size(), true);
      std::fill(counts, counts + listed * kvh, 0);
      const KvSegment seg{nullptr, nullptr, kvdt, 0, listed, cap_w, scores};
      EvictArgs ea = evict_args(l, k, seg, 0, cap_w, after, dlo, dhi);
      KvPolicyState* kept_state = ea.state;
      if (prefill && kept_state) ea.state = &prefill_state;  // the whole prompt, then its kept rows
      decide_kv_policy(ea, [&](int64_t b, int64_t h, std::span<const int32_t> keep) {
        const int64_t r = b * kvh + h;
        std::copy(keep.begin(), keep.end(), lists + r * cap_w);
        counts[r] = int32_t(keep.size());
      });
      check_kept(after, len_final, mb.first);
      if (ea.state != kept_state) keep_prefill_state(*kept_state, listed, after);
      if (kept_mode())  // the disk rows store_kept() brings to the host: all of them
        for (int64_t b = mb.first + sp.n_device + sp.n_host; b < mb.first + mb.n; ++b)
          for (int64_t h = 0; h < kvh; ++h) {
            dirty_lo[size_t(l)][size_t(b * kvh + h)] = 0;
            dirty_hi[size_t(l)][size_t(b * kvh + h)] = len_final[size_t(b)];
          }
    }
    if (off == 0 || split() || kept_mode()) return;
    // Decode, offloaded sequences attended on the device: their new rows are in the host home
    // (or the disk rows' staging) already; the policy moves them there.
    for (int part = 0; part < 2; ++part) {
      const bool disk = part == 1;
      const int64_t n_seg = disk ? sp.n_disk : sp.n_host;
      if (n_seg == 0) continue;
      const Buffer& home = disk ? kv_stage_host[slot] : mb.kv_host[size_t(l)];
      const int64_t mb_seq = sp.n_device + (disk ? sp.n_host : 0), gs = mb.first + mb_seq;
      const int64_t cap = kc.cap_h;
      dev.host_access(agent, home.data(), size_t(n_seg) * kc.home_seq, true);
      const KvSegment seg{kv_at(home, n_seg, cap, 0, 0), kv_at(home, n_seg, cap, 1, 0), kvdt, mb_seq, n_seg, cap,
                          scores ? scores + mb_seq * srow : nullptr};
      apply_kv_policy(evict_args(l, k, seg, mb_seq, cap_w, after, dlo, dhi));
      check_kept(after, len_final, gs);
      if (disk)
        for (int64_t i = 0; i < n_seg * kvh; ++i) {
          dirty_lo[size_t(l)][size_t(gs * kvh + i)] = dlo[size_t(i)];
          dirty_hi[size_t(l)][size_t(gs * kvh + i)] = dhi[size_t(i)];
        }
    }
  });
}

void OffloadEngine::Impl::keep_prefill_state(KvPolicyState& to, int64_t n_seq, const std::vector<int32_t>& kept) {
  const int64_t kvh = c.n_kv_heads, from_cap = prefill_state.capacity, to_cap = to.capacity;
  for (int64_t b = 0; b < n_seq; ++b) {
    FH_CHECK(kept[size_t(b)] <= to_cap, "policy state holds ", to_cap, " slots, sequence keeps ", kept[size_t(b)]);
    for (int64_t h = 0; h < kvh; ++h) {
      const size_t src = size_t((b * kvh + h) * from_cap), dst = size_t((b * kvh + h) * to_cap);
      std::copy_n(prefill_state.acc.begin() + src, kept[size_t(b)], to.acc.begin() + dst);
      std::copy_n(prefill_state.pos.begin() + src, kept[size_t(b)], to.pos.begin() + dst);
    }
  }
}

void OffloadEngine::Impl::gather_cache(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvSplit& sp = mb.split;
  const int64_t kvh = c.n_kv_heads, nd = sp.n_device, off = sp.n_host + sp.n_disk;
  const int64_t listed = nd + (kept_mode() ? off : 0);
  const int64_t cap_w = kv_class(layer(u)).cap_w;
  const size_t slot = size_t(pair(u, k) % 2);
  const size_t lists_bytes = size_t(mb.n * kvh * cap_w) * 4;
  // The keep lists of the listed rows, and their counts.
  dev.copy(Queue::kCompute, keep_device[slot].data(), keep_host[slot].data(), size_t(listed * kvh * cap_w) * 4);
  dev.copy(Queue::kCompute, keep_device[slot].data() + lists_bytes, keep_host[slot].data() + lists_bytes,
           size_t(listed * kvh) * 4);
  const int32_t* lists = keep_device[slot].as<int32_t>();
  const int32_t* counts = lists + mb.n * kvh * cap_w;
  for (int part = 0; part < 2; ++part) {
    if (nd > 0)
      dev.kv_gather(kv_at(mb.kv_device[size_t(layer(u))], nd, cap_w, part, 0), kvdt, nd * kvh, cap_w, c.head_dim, lists,
                    cap_w, counts);
    if (kept_mode() && off > 0)
      dev.kv_gather(kv_at(kv_stage_device[slot], off, cap_w, part, 0), kvdt, off * kvh, cap_w, c.head_dim,
                    lists + nd * kvh * cap_w, cap_w, counts + nd * kvh);
  }
}

}  // namespace flexh2o
