// OffloadEngine transfers: weights (disk -> host staging -> device slot, a streamed token
// table's step rows only), KV rows between device staging, host homes and the disk, hidden
// states, and the host-attention rows. Every byte is counted on its link.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/offload_impl.h"
#include "offload/aligned_buffer.h"

namespace flexh2o {

void OffloadEngine::Impl::run(const Step& s) {
  switch (s.kind) {
    case StepKind::kLoadWeightDisk: return load_weight_disk(s.u);
    case StepKind::kLoadWeight: return load_weight(s.u);
    case StepKind::kLoadCacheDisk: return load_cache_disk(s.u, s.k);
    case StepKind::kLoadCache: return load_cache(s.u, s.k);
    case StepKind::kLoadHidden: return load_hidden(s.u, s.k);
    case StepKind::kCompute: return compute(s.u, s.k);
    case StepKind::kStoreQkv: return store_qkv(s.u, s.k);
    case StepKind::kHostAttention: return host_attention(s.u, s.k);
    case StepKind::kLoadAttn: return load_attn(s.u, s.k);
    case StepKind::kComputeRest: return compute_rest(s.u, s.k);
    case StepKind::kStoreHidden: return store_hidden(s.u, s.k);
    case StepKind::kStoreCache: return store_cache(s.u, s.k);
    case StepKind::kUpdateCache: return update_cache(s.u, s.k);
    case StepKind::kGatherCache: return gather_cache(s.u, s.k);
    case StepKind::kStoreKept: return store_kept(s.u, s.k);
    case StepKind::kStoreCacheDisk: return store_cache_disk(s.u, s.k);
  }
}

// ---- weights ---------------------------------------------------------------------------

void OffloadEngine::Impl::load_weight_disk(int u) {
  const size_t slot = size_t((u + slot_phase) % 2);
  if (u == int(units.size())) u = 1;  // the next step's first layer unit (schedule.h: prefetch_next)
  std::byte* stage = weight_stage[slot].data();
  const int32_t* ids = inputs_host.as<int32_t>();
  for (const WeightHome& h : units[size_t(u)]) {
    if (h.tier != Tier::kDisk) continue;
    if (h.token_table && gather_rows) {  // the step's rows only, in step order
      const size_t row = h.bytes / size_t(c.vocab_size), n = size_t(batch * T);
      dev.host_access(int(Queue::kDiskRead), stage + h.stage_offset, n * row, true);
      for (size_t i = 0; i < n; ++i)
        e.store_->read(h.store_name, uint64_t(ids[i]) * row, row, stage + h.stage_offset + i * row).throw_if_error();
      e.counters_.add(Link::kDiskToHost, n * row);
      continue;
    }
    dev.host_access(int(Queue::kDiskRead), stage + h.stage_offset, h.bytes, true);
    e.store_->read(h.store_name, 0, h.bytes, stage + h.stage_offset).throw_if_error();
    e.counters_.add(Link::kDiskToHost, h.bytes);
  }
}

void OffloadEngine::Impl::load_weight(int u) {
  const size_t s = size_t((u + slot_phase) % 2);
  if (u == int(units.size())) u = 1;
  std::byte* slot = weight_slot[s].data();
  for (const WeightHome& h : units[size_t(u)]) {
    if (h.tier == Tier::kDevice) continue;
    const bool staged = h.tier == Tier::kDisk;
    const std::byte* src = staged ? weight_stage[s].data() + h.stage_offset : h.host;
    if (h.token_table && gather_rows) {
      const size_t row = h.bytes / size_t(c.vocab_size), n = size_t(batch * T);
      if (staged)
        dev.copy(Queue::kHostToDevice, slot + h.slot_offset, src, n * row);  // already in step order
      else
        dev.gather_rows(Queue::kHostToDevice, slot + h.slot_offset, src, c.vocab_size, row, in_ids,
                        inputs_host.as<int32_t>(), int64_t(n));
      e.counters_.add(Link::kHostToDevice, n * row);
      continue;
    }
    dev.copy(Queue::kHostToDevice, slot + h.slot_offset, src, h.bytes);
    e.counters_.add(Link::kHostToDevice, h.bytes);
  }
}

// ---- KV rows -------------------------------------------------------------------------------

std::byte* OffloadEngine::Impl::kv_at(const Buffer& b, int64_t n, int64_t cap, int part, int64_t i) const {
  const size_t row = kv_row;
  return b.data() + (size_t(part) * size_t(n) + size_t(i)) * size_t(c.n_kv_heads * cap) * row;
}

uint64_t OffloadEngine::Impl::copy_kv_rows(Queue q, const Buffer& dst, int64_t dst_n, int64_t dst_cap,
                                           int64_t dst_first, const Buffer& src, int64_t src_n, int64_t src_cap,
                                           int64_t src_first, int64_t count, const int32_t* lo, const int32_t* hi) {
  const size_t row = kv_row;
  uint64_t moved = 0;
  for (int part = 0; part < 2; ++part) {
    for (int64_t i = 0; i < count;) {
      int64_t j = i;  // a run of sequences with the same slot range: one 2-D copy
      while (j + 1 < count && lo[j + 1] == lo[i] && hi[j + 1] == hi[i]) ++j;
      if (hi[i] > lo[i]) {
        const size_t width = size_t(hi[i] - lo[i]) * row, height = size_t((j - i + 1) * c.n_kv_heads);
        dev.copy_2d(q, kv_at(dst, dst_n, dst_cap, part, dst_first + i) + size_t(lo[i]) * row, size_t(dst_cap) * row,
                    kv_at(src, src_n, src_cap, part, src_first + i) + size_t(lo[i]) * row, size_t(src_cap) * row,
                    width, height);
        moved += width * height;
      }
      i = j + 1;
    }
  }
  return moved;
}

void OffloadEngine::Impl::disk_kv(int l, int k, const Buffer& stage, bool write, const std::vector<int32_t>& lo,
                                  const std::vector<int32_t>& hi, int64_t seq0) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvClass& kc = kv_class(l);
  const int64_t nk = mb.split.n_disk, kvh = c.n_kv_heads, cap = kc.cap_h;
  const size_t row = kv_row, block = size_t(cap) * row;
  // Whole 4096-byte pages holding the rows, merged where they touch. The staging slot has the
  // file's layout, and every page of it that holds a cached row of any sequence or head was read
  // by this step's load (or is written whole at the prefill), so a page's other rows are current
  // or unused, and a write needs no read-modify-write. Offsets rise with (part, sequence, head).
  std::vector<StoreRange> ranges;
  uint64_t moved = 0;
  for (int part = 0; part < 2; ++part) {
    for (int64_t i = 0; i < nk; ++i) {
      const size_t seq = size_t(kv_at(stage, nk, cap, part, i) - stage.data());
      for (int64_t h = 0; h < kvh; ++h) {
        const int64_t a = lo[size_t((seq0 + i) * kvh + h)], z = hi[size_t((seq0 + i) * kvh + h)];
        if (z <= a) continue;
        const size_t at = seq + size_t(h) * block, p0 = align_down(at + size_t(a) * row),
                     p1 = align_up(at + size_t(z) * row);
        if (!ranges.empty() && p0 <= ranges.back().offset + ranges.back().length)
          ranges.back().length = std::max(p1, size_t(ranges.back().offset) + ranges.back().length) - ranges.back().offset;
        else
          ranges.push_back({p0, p1 - p0, stage.data() + p0});
        moved += size_t(z - a) * row;
      }
    }
  }
  if (ranges.empty()) return;  // also a micro-batch with no disk sequences (and no KV files)
  const std::string& name = mb.kv_disk[size_t(l)];
  dev.host_access(int(write ? Queue::kDiskWrite : Queue::kDiskRead), stage.data(), kv_disk_stage_bytes(nk, kc.home_seq),
                  !write);
  Status s = write ? e.store_->write_ranges(name, ranges) : e.store_->read_ranges(name, ranges);
  s.throw_if_error();
  e.counters_.add(write ? Link::kHostToDisk : Link::kDiskToHost, moved);
  e.counters_.add_kv(moved);
}

void OffloadEngine::Impl::load_cache_disk(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const int64_t kvh = c.n_kv_heads, seq0 = mb.first + mb.split.n_device + mb.split.n_host;
  const std::vector<int32_t>& len_before = kv_class(layer(u)).len_before;
  std::vector<int32_t> lo(size_t(batch * kvh), 0), hi(size_t(batch * kvh), 0);
  for (int64_t b = seq0; b < mb.first + mb.n; ++b)
    for (int64_t h = 0; h < kvh; ++h) hi[size_t(b * kvh + h)] = len_before[size_t(b)];
  disk_kv(layer(u), k, kv_stage_host[size_t(pair(u, k) % 2)], false, lo, hi, seq0);
}

// Slots [lo[i], hi[i]) of the offloaded sequences of (u, k) between the device staging slot and
// their host homes (host sequences) or the disk rows' host staging (disk sequences); lo / hi
// are indexed from the first offloaded sequence. q: kHostToDevice loads, kDeviceToHost stores.
void OffloadEngine::Impl::move_offloaded(int u, int k, Queue q, const int32_t* lo, const int32_t* hi) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvSplit& sp = mb.split;
  const int64_t off = sp.n_host + sp.n_disk;
  const size_t slot = size_t(pair(u, k) % 2);
  const Buffer& stage = kv_stage_device[slot];
  const Buffer& home = mb.kv_host[size_t(layer(u))];
  const Buffer& disk = kv_stage_host[slot];
  const KvClass& kc = kv_class(layer(u));
  const int64_t cap_w = kc.cap_w, cap_h = kc.cap_h;
  const bool load = q == Queue::kHostToDevice;
  uint64_t moved = load ? copy_kv_rows(q, stage, off, cap_w, 0, home, sp.n_host, cap_h, 0, sp.n_host, lo, hi)
                        : copy_kv_rows(q, home, sp.n_host, cap_h, 0, stage, off, cap_w, 0, sp.n_host, lo, hi);
  if (sp.n_disk)
    moved += load ? copy_kv_rows(q, stage, off, cap_w, sp.n_host, disk, sp.n_disk, cap_h, 0, sp.n_disk, lo + sp.n_host,
                                 hi + sp.n_host)
                  : copy_kv_rows(q, disk, sp.n_disk, cap_h, 0, stage, off, cap_w, sp.n_host, sp.n_disk, lo + sp.n_host,
                                 hi + sp.n_host);
  e.counters_.add(load ? Link::kHostToDevice : Link::kDeviceToHost, moved);
  e.counters_.add_kv(moved);
}

void OffloadEngine::Impl::load_cache(int u, int k) {  // rows [0, len) before this step
  const MicroBatch& mb = mbs[size_t(k)];
  const int64_t host0 = mb.first + mb.split.n_device;
  const std::vector<int32_t> zero(size_t(mb.n), 0);
  move_offloaded(u, k, Queue::kHostToDevice, zero.data(), kv_class(layer(u)).len_before.data() + host0);
}

void OffloadEngine::Impl::store_cache(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const KvSplit& sp = mb.split;
  const int64_t off = sp.n_host + sp.n_disk, host0 = mb.first + sp.n_device;
  const KvClass& kc = kv_class(layer(u));
  const std::vector<int32_t>&len_before = kc.len_before, &len_after = kc.len_after;
  const size_t slot = size_t(pair(u, k) % 2);
  if (off > 0 && !split() && !kept_mode())  // the new rows (kept mode: store_kept, after the compaction)
    move_offloaded(u, k, Queue::kDeviceToHost, len_before.data() + host0, len_after.data() + host0);
  if (scores_device[slot]) {  // the attention scores of every sequence attended on the device
    const int64_t n = split() ? sp.n_device : mb.n;
    int64_t longest = 0;
    for (int64_t b = mb.first; b < mb.first + n; ++b) longest = std::max<int64_t>(longest, len_after[size_t(b)]);
    if (n > 0 && longest > 0) {
      const size_t pitch = size_t(kc.cap_w) * 4, width = size_t(longest) * 4, height = size_t(n * c.n_heads);
      dev.copy_2d(Queue::kDeviceToHost, scores_host[slot].data(), pitch, scores_device[slot].data(), pitch, width,
                  height);
      e.counters_.add(Link::kDeviceToHost, width * height);
    }
  }
}

void OffloadEngine::Impl::store_kept(int u, int k) {  // rows [0, kept) after the compaction
  const MicroBatch& mb = mbs[size_t(k)];
  const std::vector<int32_t> zero(size_t(mb.n), 0);
  move_offloaded(u, k, Queue::kDeviceToHost, zero.data(), kv_class(layer(u)).len_final.data() + mb.first + mb.split.n_device);
}

void OffloadEngine::Impl::store_cache_disk(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const int l = layer(u);
  const int64_t kvh = c.n_kv_heads, seq0 = mb.first + mb.split.n_device + mb.split.n_host;
  const KvClass& kc = kv_class(l);
  const std::vector<int32_t>&len_before = kc.len_before, &len_after = kc.len_after;
  if (!kv_policy) {  // the new rows
    for (int64_t b = seq0; b < mb.first + mb.n; ++b)
      for (int64_t h = 0; h < kvh; ++h) {
        dirty_lo[size_t(l)][size_t(b * kvh + h)] = len_before[size_t(b)];
        dirty_hi[size_t(l)][size_t(b * kvh + h)] = len_after[size_t(b)];
      }
  }
  disk_kv(l, k, kv_stage_host[size_t(pair(u, k) % 2)], true, dirty_lo[size_t(l)], dirty_hi[size_t(l)], seq0);
}

// ---- hidden states and host-attention rows ------------------------------------------------

std::byte* OffloadEngine::Impl::device_hidden(int u, int k) const {
  if (p.act_cpu_percent == 100) return hidden_slot[size_t((u * int(mbs.size()) + k) % 2)].data();
  return mbs[size_t(k)].hidden_device.data();
}

void OffloadEngine::Impl::load_hidden(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const size_t bytes = size_t(mb.n * T * c.hidden) * es_a;
  dev.copy(Queue::kHostToDevice, device_hidden(u, k), mb.hidden_host.data(), bytes);
  e.counters_.add(Link::kHostToDevice, bytes);
}

void OffloadEngine::Impl::store_hidden(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const size_t bytes = size_t(mb.n * T * c.hidden) * es_a;
  dev.copy(Queue::kDeviceToHost, mb.hidden_host.data(), device_hidden(u, k), bytes);
  e.counters_.add(Link::kDeviceToHost, bytes);
}

std::byte* OffloadEngine::Impl::qkv_slot(int p) const {
  return split() ? qkv_pipe[size_t(p % 2)].data() : qkv_step.data();
}
std::byte* OffloadEngine::Impl::attn_slot(int p) const {
  return split() ? attn_pipe[size_t(p % 2)].data() : attn_step.data();
}

void OffloadEngine::Impl::store_qkv(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const int64_t n = mb.n, nd = mb.split.n_device, off = n - nd, Q = c.q_dim(), KV = c.kv_dim();
  const size_t slot = size_t(pair(u, k) % 2);
  const std::byte* src = qkv_slot(pair(u, k));
  std::byte* dst = qkv_host[slot].data();
  const size_t r = size_t(T) * es_a;
  // q | k | v of all n sequences on the device -> of the `off` offloaded ones on the host
  dev.copy(Queue::kDeviceToHost, dst, src + size_t(nd * Q) * r, size_t(off * Q) * r);
  dev.copy(Queue::kDeviceToHost, dst + size_t(off * Q) * r, src + size_t(n * Q + nd * KV) * r, size_t(off * KV) * r);
  dev.copy(Queue::kDeviceToHost, dst + size_t(off * (Q + KV)) * r, src + size_t(n * (Q + KV) + nd * KV) * r,
           size_t(off * KV) * r);
  e.counters_.add(Link::kDeviceToHost, size_t(off * (Q + 2 * KV)) * r);
}

void OffloadEngine::Impl::load_attn(int u, int k) {
  const MicroBatch& mb = mbs[size_t(k)];
  const int64_t nd = mb.split.n_device, off = mb.n - nd, Q = c.q_dim();
  const size_t r = size_t(T * Q) * es_a;
  dev.copy(Queue::kHostToDevice, attn_slot(pair(u, k)) + size_t(nd) * r, attn_host[size_t(pair(u, k) % 2)].data(),
           size_t(off) * r);
  e.counters_.add(Link::kHostToDevice, size_t(off) * r);
}

}  // namespace flexh2o
