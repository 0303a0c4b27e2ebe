// Building the zig-zag step list with its data and write-after-read dependencies, and the
// table of what each step touches.
#include "engine/schedule.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace flexh2o {

const char* unit_kind_name(UnitKind k) {
  switch (k) {
    case UnitKind::kEmbed: return "embed";
    case UnitKind::kLayer: return "layer";
    case UnitKind::kAttention: return "attention";
    case UnitKind::kMlp: return "mlp";
    case UnitKind::kHead: return "head";
  }
  return "?";
}

const char* step_name(StepKind k) {
  switch (k) {
    case StepKind::kLoadWeightDisk: return "LWD";
    case StepKind::kLoadWeight: return "LW";
    case StepKind::kLoadCacheDisk: return "LCD";
    case StepKind::kLoadCache: return "LC";
    case StepKind::kLoadHidden: return "LH";
    case StepKind::kCompute: return "C";
    case StepKind::kStoreQkv: return "SQ";
    case StepKind::kHostAttention: return "HA";
    case StepKind::kLoadAttn: return "LA";
    case StepKind::kComputeRest: return "CR";
    case StepKind::kStoreHidden: return "SH";
    case StepKind::kStoreCache: return "SC";
    case StepKind::kUpdateCache: return "KU";
    case StepKind::kGatherCache: return "KG";
    case StepKind::kStoreKept: return "SK";
    case StepKind::kStoreCacheDisk: return "SCD";
  }
  return "?";
}

const char* queue_name(Queue q) {
  switch (q) {
    case Queue::kCompute: return "compute";
    case Queue::kHostToDevice: return "host->device";
    case Queue::kDeviceToHost: return "device->host";
    case Queue::kDiskRead: return "disk->host";
    case Queue::kDiskWrite: return "host->disk";
    case Queue::kHost: return "host";
  }
  return "?";
}

std::vector<UnitKind> unit_kinds(int64_t n_layers, bool sep_layer) {
  std::vector<UnitKind> k{UnitKind::kEmbed};
  for (int64_t l = 0; l < n_layers; ++l) {
    if (sep_layer) {
      k.push_back(UnitKind::kAttention);
      k.push_back(UnitKind::kMlp);
    } else {
      k.push_back(UnitKind::kLayer);
    }
  }
  k.push_back(UnitKind::kHead);
  return k;
}

int Schedule::find(StepKind kind, int u, int k) const {
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].kind == kind && steps[i].u == u && steps[i].k == k) return int(i);
  return -1;
}

std::string Schedule::label(int i) const {
  const Step& s = steps[size_t(i)];
  std::ostringstream l;
  if (units > 0 && s.u == units) {
    l << step_name(s.kind) << "(1 next)";
    return l.str();
  }
  l << step_name(s.kind) << "(" << s.u;
  if (s.kind != StepKind::kLoadWeight && s.kind != StepKind::kLoadWeightDisk) l << "," << s.k;
  l << ")";
  return l.str();
}

std::string Schedule::str() const {
  std::ostringstream os;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    os << label(int(i)) << " [" << queue_name(s.queue) << "]";
    if (!s.deps.empty()) {
      os << " <-";
      for (int d : s.deps) os << " " << label(d);
    }
    os << "\n";
  }
  return os.str();
}

int kv_pair(const ScheduleShape& shape, int u, int k) {
  if (u <= 0 || u >= shape.units() || !shape.has_kv(u)) return -1;
  int ordinal = 0;
  for (int v = 1; v < u; ++v) ordinal += shape.has_kv(v) ? 1 : 0;
  return ordinal * shape.micro_batches + k;
}

namespace {

class Builder {
 public:
  explicit Builder(const ScheduleShape& s) : s_(s), K_(s.micro_batches), U_(s.units()) {
    for (int u = 0; u < U_; ++u)
      if (s_.has_kv(u)) kv_units_.push_back(u);
    pending_gather_.assign(kv_units_.size() * size_t(std::max(K_, 0)), false);
  }

  Schedule build() {
    FH_CHECK(U_ >= 3 && K_ >= 1, "schedule needs >= 3 units and >= 1 micro-batch");
    FH_CHECK(s_.kinds.front() == UnitKind::kEmbed && s_.kinds.back() == UnitKind::kHead,
             "schedule: units must start with the embedding and end with the head");
    load_weights(0);
    prefetch_pair(0, 0);
    for (int u = 0; u < U_; ++u) {
      for (int k = 0; k < K_; ++k) {
        // Queues run in emission order: the next micro-batch's KV goes first, so it never
        // waits behind the next unit's weights (which may be waiting on the disk).
        if (k + 1 < K_) prefetch_pair(u, k + 1);
        if (k == 0 && u + 1 < U_) load_weights(u + 1);
        if (k + 1 == K_ && u + 1 < U_) prefetch_pair(u + 1, 0);
        compute(u, k);
        if (!split(u)) {
          stores(u, k);
        } else if (k > 0) {
          // Host attention pipeline: micro-batch k's q/k/v are on the way to the host before
          // the device finishes micro-batch k-1, so the host attends while the device computes.
          rest(u, k - 1);
          stores(u, k - 1);
        }
      }
      if (split(u)) {
        rest(u, K_ - 1);
        stores(u, K_ - 1);
      }
    }
    prefetch_next_first_layer();  // last in its queues: nothing of this step waits behind it
    for (int p = 0; p < int(pending_gather_.size()); ++p)  // the last KV pairs' compaction
      if (pending_gather_[size_t(p)]) gather(p);
    out_.units = U_;
    return std::move(out_);
  }

 private:
  bool has_kv(int u) const { return u >= 0 && u < U_ && s_.has_kv(u); }
  bool split(int u) const { return has_kv(u) && s_.host_attention(); }
  int pair(int u, int k) const { return kv_pair(s_, u, k); }
  int flat(int u, int k) const { return u * K_ + k; }
  bool load_cache() const { return !s_.prefill && s_.offloaded() && !s_.cpu_attention; }
  bool store_cache() const { return (s_.offloaded() && !s_.host_attention()) || (s_.kv_policy && s_.kv_device); }
  bool update_cache() const {
    return s_.kv_policy && (s_.kv_device || (s_.offloaded() && !s_.host_attention()));
  }
  // A prefill with a policy compacts the offloaded sequences' rows on the device before storing.
  bool store_kept() const { return s_.prefill && s_.kv_policy && s_.offloaded(); }
  bool gather_cache() const { return s_.kv_policy && (s_.kv_device || store_kept()); }

  int id(StepKind kind, int u, int k) const {
    auto it = index_.find({kind, u, k});
    return it == index_.end() ? -1 : it->second;
  }
  void dep(std::vector<int>& d, StepKind kind, int u, int k) const {
    if (int i = id(kind, u, k); i >= 0) d.push_back(i);
  }
  int last_compute(int u, int k) const {
    const int r = id(StepKind::kComputeRest, u, k);
    return r >= 0 ? r : id(StepKind::kCompute, u, k);
  }
  void dep_last_compute(std::vector<int>& d, int u, int k) const {
    if (u < 0) return;
    if (int i = last_compute(u, k); i >= 0) d.push_back(i);
  }
  // Steps `kinds` of the KV pair `back` pairs before (u, k) (the previous user of its slot).
  void dep_pair_back(std::vector<int>& d, int u, int k, int back, std::initializer_list<StepKind> kinds) const {
    const int p = pair(u, k) - back;
    if (p < 0) return;
    const int pu = kv_units_[size_t(p / K_)], pk = p % K_;
    for (StepKind kind : kinds) dep(d, kind, pu, pk);
  }
  int emit(StepKind kind, Queue q, int u, int k, std::vector<int> deps) {
    const int i = int(out_.steps.size());
    out_.steps.push_back({kind, q, u, k, std::move(deps)});
    index_[{kind, u, k}] = i;
    return i;
  }

  void load_weights(int u) {
    if (!s_.unit_streams[size_t(u)]) return;
    if (u == 1 && s_.first_layer_loaded) return;
    if (s_.unit_disk[size_t(u)]) {
      std::vector<int> d;
      dep(d, StepKind::kLoadWeight, u - 2, 0);  // host staging slot u%2 was read by LW(u-2)
      emit(StepKind::kLoadWeightDisk, Queue::kDiskRead, u, 0, d);
    }
    std::vector<int> d;
    dep(d, StepKind::kLoadWeightDisk, u, 0);
    dep_last_compute(d, u - 2, K_ - 1);  // device slot u%2 was read by unit u-2
    emit(StepKind::kLoadWeight, Queue::kHostToDevice, u, 0, d);
  }

  // Next step's unit 1 as unit index U_: it takes the slot of the same parity, the one the
  // last layer unit (U_ - 2) uses, never the head's (still computing at the end of the step);
  // the engine shifts the next step's slot parity to match. It waits for the last step here
  // that reads that device slot and that host staging slot.
  void prefetch_next_first_layer() {
    if (!s_.prefetch_next || !s_.unit_streams[1]) return;
    int last_dev = -1, last_stage = -1;
    for (int v = 2 - U_ % 2; v < U_; v += 2) {
      if (s_.unit_streams[size_t(v)]) last_dev = v;
      if (s_.unit_disk[size_t(v)] && id(StepKind::kLoadWeight, v, 0) >= 0) last_stage = v;
    }
    if (s_.unit_disk[1]) {
      std::vector<int> d;
      if (last_stage >= 0) dep(d, StepKind::kLoadWeight, last_stage, 0);
      emit(StepKind::kLoadWeightDisk, Queue::kDiskRead, U_, 0, d);
    }
    std::vector<int> d;
    dep(d, StepKind::kLoadWeightDisk, U_, 0);
    if (last_dev >= 0) dep_last_compute(d, last_dev, K_ - 1);
    emit(StepKind::kLoadWeight, Queue::kHostToDevice, U_, 0, d);
  }

  void prefetch_pair(int u, int k) {
    if (has_kv(u) && !s_.prefill && s_.kv_disk) {
      // The host KV staging slot: every user of pair p-2 is done with it. With host attention
      // pair p-2's disk store is emitted after this point: load later (after that store).
      const int p = pair(u, k) - 2;
      if (p >= 0 && id(StepKind::kStoreCacheDisk, kv_units_[size_t(p / K_)], p % K_) < 0) {
        deferred_cache_.push_back({u, k});  // with its device load below
      } else {
        load_cache_disk(u, k);
        load_cache_device(u, k);
      }
    } else if (has_kv(u)) {
      load_cache_device(u, k);
    }
    prefetch_hidden(u, k);
  }

  void load_cache_device(int u, int k) {
    if (load_cache()) {
      std::vector<int> d;
      dep(d, StepKind::kLoadCacheDisk, u, k);
      dep_pair_back(d, u, k, 2, {StepKind::kCompute, StepKind::kStoreCache});  // device KV staging slot
      emit(StepKind::kLoadCache, Queue::kHostToDevice, u, k, d);
    }
  }

  void prefetch_hidden(int u, int k) {
    if (!s_.act_on_host || u == 0) return;
    if (!hidden_ready(u, k)) {
      deferred_hidden_.push_back({u, k});  // its input, or its slot's previous user, comes later
      return;
    }
    load_hidden(u, k);
  }

  // LH(u,k) can be emitted: its input is stored, and the previous user of its device slot
  // (two (u,k) steps back) has computed and stored.
  bool hidden_ready(int u, int k) const {
    if (id(StepKind::kStoreHidden, u - 1, k) < 0) return false;
    const int r = flat(u, k) - 2;
    if (r < 0) return true;
    if (r / K_ + 1 == U_) return last_compute(r / K_, r % K_) >= 0;  // the head stores no hidden state
    return id(StepKind::kStoreHidden, r / K_, r % K_) >= 0;
  }

  void load_cache_disk(int u, int k) {
    std::vector<int> d;
    dep_pair_back(d, u, k, 2,
                  {StepKind::kLoadCache, StepKind::kStoreCache, StepKind::kUpdateCache, StepKind::kHostAttention,
                   StepKind::kStoreCacheDisk, StepKind::kStoreKept});
    emit(StepKind::kLoadCacheDisk, Queue::kDiskRead, u, k, d);
  }

  void load_hidden(int u, int k) {
    std::vector<int> d;
    dep(d, StepKind::kStoreHidden, u - 1, k);  // data
    FH_CHECK(!d.empty(), "schedule: hidden state of unit ", u - 1, " is loaded before it is stored");
    const int r = flat(u, k) - 2;  // device hidden slot reuse
    if (r >= 0) {
      dep_last_compute(d, r / K_, r % K_);
      dep(d, StepKind::kStoreHidden, r / K_, r % K_);
    }
    emit(StepKind::kLoadHidden, Queue::kHostToDevice, u, k, d);
  }

  void flush_deferred_hidden() {
    for (size_t i = 0; i < deferred_hidden_.size();) {
      auto [u, k] = deferred_hidden_[i];
      if (hidden_ready(u, k)) {
        load_hidden(u, k);
        deferred_hidden_.erase(deferred_hidden_.begin() + long(i));
      } else {
        ++i;
      }
    }
  }

  void compute(int u, int k) {
    // Pair p-2's compaction goes just before this compute: its decision had the host for the
    // compute of pair p-1, and this compute reuses its staging and keep-list slots.
    if (has_kv(u) && pair(u, k) >= 2 && pending_gather_[size_t(pair(u, k) - 2)]) gather(pair(u, k) - 2);
    std::vector<int> d;
    dep(d, StepKind::kLoadWeight, u, 0);
    if (has_kv(u)) {
      dep(d, StepKind::kLoadCache, u, k);
      // Slots this compute writes that pair p-2's steps still read: device KV staging and
      // scores (its StoreCache, StoreKept), q/k/v (its StoreQkv).
      dep_pair_back(d, u, k, 2, {StepKind::kStoreCache, StepKind::kStoreKept, StepKind::kStoreQkv});
    }
    if (s_.act_on_host) {
      dep(d, StepKind::kLoadHidden, u, k);
      const int r = flat(u, k) - 2;  // the device hidden slot's previous writer's store
      if (r >= 0) dep(d, StepKind::kStoreHidden, r / K_, r % K_);
    } else {
      dep_last_compute(d, u - 1, k);
    }
    emit(StepKind::kCompute, Queue::kCompute, u, k, d);
    if (!split(u)) return;
    {
      std::vector<int> q{id(StepKind::kCompute, u, k)};
      dep_pair_back(q, u, k, 2, {StepKind::kHostAttention});  // host q/k/v slot
      emit(StepKind::kStoreQkv, Queue::kDeviceToHost, u, k, q);
    }
    {
      std::vector<int> h{id(StepKind::kStoreQkv, u, k)};
      dep(h, StepKind::kLoadCacheDisk, u, k);
      dep_pair_back(h, u, k, 2, {StepKind::kLoadAttn});  // host attention output slot
      emit(StepKind::kHostAttention, Queue::kHost, u, k, h);
    }
    {
      std::vector<int> a{id(StepKind::kHostAttention, u, k)};
      dep_pair_back(a, u, k, 2, {StepKind::kComputeRest});  // device attention output slot
      emit(StepKind::kLoadAttn, Queue::kHostToDevice, u, k, a);
    }
  }

  void rest(int u, int k) {
    emit(StepKind::kComputeRest, Queue::kCompute, u, k, {id(StepKind::kCompute, u, k), id(StepKind::kLoadAttn, u, k)});
  }

  void stores(int u, int k) {
    if (s_.act_on_host && u + 1 < U_) {
      emit(StepKind::kStoreHidden, Queue::kDeviceToHost, u, k, {last_compute(u, k)});
      flush_deferred_hidden();
    }
    if (!has_kv(u)) return;
    if (store_cache()) {
      std::vector<int> d{last_compute(u, k)};
      // Host-side destinations pair p-2 may still use: the disk rows' staging (its disk
      // store; at decode LoadCacheDisk already waited for it) and the score slot (its
      // UpdateCache).
      dep_pair_back(d, u, k, 2, {StepKind::kStoreCacheDisk, StepKind::kUpdateCache});
      emit(StepKind::kStoreCache, Queue::kDeviceToHost, u, k, d);
    }
    if (update_cache()) {
      std::vector<int> d;
      dep(d, StepKind::kStoreCache, u, k);
      dep(d, StepKind::kLoadCacheDisk, u, k);
      dep_pair_back(d, u, k, 2, {StepKind::kGatherCache});  // keep-list slot
      emit(StepKind::kUpdateCache, Queue::kHost, u, k, d);
    }
    if (gather_cache()) pending_gather_[size_t(pair(u, k))] = true;
    if (!store_kept()) store_disk(u, k);  // else after the kept rows reach the host
  }

  // The compaction of pair p, then (prefill) its kept rows to the host and the disk.
  void gather(int p) {
    pending_gather_[size_t(p)] = false;
    const int u = kv_units_[size_t(p / K_)], k = p % K_;
    emit(StepKind::kGatherCache, Queue::kCompute, u, k, {id(StepKind::kUpdateCache, u, k), last_compute(u, k)});
    if (store_kept()) {
      std::vector<int> d{id(StepKind::kGatherCache, u, k)};
      dep_pair_back(d, u, k, 2, {StepKind::kStoreCacheDisk});  // the disk rows' host staging
      emit(StepKind::kStoreKept, Queue::kDeviceToHost, u, k, d);
      store_disk(u, k);
    }
  }

  void store_disk(int u, int k) {
    if (!s_.kv_disk) return;
    std::vector<int> d;
    for (StepKind kind : {StepKind::kStoreCache, StepKind::kUpdateCache, StepKind::kHostAttention, StepKind::kStoreKept})
      dep(d, kind, u, k);
    emit(StepKind::kStoreCacheDisk, Queue::kDiskWrite, u, k, d);
    // A disk load that waited for this store to free the staging slot.
    const int next = pair(u, k) + 2;
    for (size_t i = 0; i < deferred_cache_.size(); ++i) {
      if (pair(deferred_cache_[i].first, deferred_cache_[i].second) != next) continue;
      load_cache_disk(deferred_cache_[i].first, deferred_cache_[i].second);
      load_cache_device(deferred_cache_[i].first, deferred_cache_[i].second);
      deferred_cache_.erase(deferred_cache_.begin() + long(i));
      break;
    }
  }

  const ScheduleShape& s_;
  const int K_, U_;
  std::vector<int> kv_units_;
  Schedule out_;
  std::vector<std::pair<int, int>> deferred_hidden_, deferred_cache_;
  std::vector<bool> pending_gather_;  // [KV pair]: its compaction is not emitted yet
  std::map<std::tuple<StepKind, int, int>, int> index_;
};

}  // namespace

Schedule build_schedule(const ScheduleShape& s) {
  FH_CHECK(int(s.unit_streams.size()) == s.units() && int(s.unit_disk.size()) == s.units(),
           "schedule shape: per-unit flags missing");
  return Builder(s).build();
}

// ---- accesses ------------------------------------------------------------------------------

std::vector<Access> schedule_accesses(const ScheduleShape& sh, const Schedule& s, int i) {
  const Step& st = s.steps[size_t(i)];
  const int u = st.u, k = st.k, K = sh.micro_batches;
  const int p = (u < sh.units()) ? kv_pair(sh, u, k) : -1, ps = p >= 0 ? p % 2 : 0;
  const int hslot = (u * K + k) % 2;
  std::vector<Access> a;
  auto r = [&](Buf b, int id) { a.push_back({b, id, false}); };
  auto w = [&](Buf b, int id) { a.push_back({b, id, true}); };
  auto hidden_rw = [&] {
    if (sh.act_on_host) r(Buf::kHiddenSlot, hslot), w(Buf::kHiddenSlot, hslot);
    else r(Buf::kHiddenDevice, k), w(Buf::kHiddenDevice, k);
  };
  const bool device_attn_offloaded = sh.offloaded() && !sh.host_attention();
  const bool scores = sh.kv_policy && (sh.kv_device || device_attn_offloaded);
  const bool kept = sh.prefill && sh.kv_policy && sh.offloaded();  // rows stored after compaction
  switch (st.kind) {
    case StepKind::kLoadWeightDisk: w(Buf::kWeightStage, u % 2); break;
    case StepKind::kLoadWeight:
      if (sh.unit_disk[size_t(u == sh.units() ? 1 : u)]) r(Buf::kWeightStage, u % 2);
      w(Buf::kWeightSlot, u % 2);
      break;
    case StepKind::kLoadCacheDisk: w(Buf::kKvStageHost, ps); break;
    case StepKind::kLoadCache:
      if (sh.kv_host) r(Buf::kKvHomeHost, p);
      if (sh.kv_disk) r(Buf::kKvStageHost, ps);
      w(Buf::kKvStageDevice, ps);
      break;
    case StepKind::kLoadHidden: r(Buf::kHiddenHost, k), w(Buf::kHiddenSlot, hslot); break;
    case StepKind::kStoreHidden: r(Buf::kHiddenSlot, hslot), w(Buf::kHiddenHost, k); break;
    case StepKind::kCompute:
      if (sh.unit_streams[size_t(u)]) r(Buf::kWeightSlot, u % 2);
      if (sh.kinds[size_t(u)] == UnitKind::kEmbed) {
        if (sh.act_on_host) w(Buf::kHiddenSlot, hslot);
        else w(Buf::kHiddenDevice, k);
        break;
      }
      if (sh.kinds[size_t(u)] == UnitKind::kHead) {
        if (sh.act_on_host) r(Buf::kHiddenSlot, hslot);
        else r(Buf::kHiddenDevice, k);
        w(Buf::kLogits, k);
        break;
      }
      hidden_rw();
      if (!sh.has_kv(u)) break;
      w(Buf::kQkvDevice, ps), r(Buf::kQkvDevice, ps);
      if (sh.kv_device) r(Buf::kKvHomeDevice, p), w(Buf::kKvHomeDevice, p);
      if (device_attn_offloaded) r(Buf::kKvStageDevice, ps), w(Buf::kKvStageDevice, ps);
      if (scores) w(Buf::kScoresDevice, ps);
      if (sh.kv_device || device_attn_offloaded) w(Buf::kAttnDevice, ps), r(Buf::kAttnDevice, ps);
      break;
    case StepKind::kStoreQkv: r(Buf::kQkvDevice, ps), w(Buf::kQkvHost, ps); break;
    case StepKind::kHostAttention:
      r(Buf::kQkvHost, ps), w(Buf::kAttnHost, ps);
      if (sh.kv_host) r(Buf::kKvHomeHost, p), w(Buf::kKvHomeHost, p);
      if (sh.kv_disk) r(Buf::kKvStageHost, ps), w(Buf::kKvStageHost, ps);
      break;
    case StepKind::kLoadAttn: r(Buf::kAttnHost, ps), w(Buf::kAttnDevice, ps); break;
    case StepKind::kComputeRest:
      if (sh.unit_streams[size_t(u)]) r(Buf::kWeightSlot, u % 2);
      r(Buf::kAttnDevice, ps);
      hidden_rw();
      break;
    case StepKind::kStoreCache:
      if (device_attn_offloaded && !kept) {
        r(Buf::kKvStageDevice, ps);
        if (sh.kv_host) w(Buf::kKvHomeHost, p);
        if (sh.kv_disk) w(Buf::kKvStageHost, ps);
      }
      if (scores) r(Buf::kScoresDevice, ps), w(Buf::kScoresHost, ps);
      break;
    case StepKind::kUpdateCache:
      r(Buf::kScoresHost, ps);
      if (device_attn_offloaded && !kept) {
        if (sh.kv_host) r(Buf::kKvHomeHost, p), w(Buf::kKvHomeHost, p);
        if (sh.kv_disk) r(Buf::kKvStageHost, ps), w(Buf::kKvStageHost, ps);
      }
      if (sh.kv_device || kept) w(Buf::kKeep, ps);
      break;
    case StepKind::kGatherCache:
      r(Buf::kKeep, ps);
      if (sh.kv_device) r(Buf::kKvHomeDevice, p), w(Buf::kKvHomeDevice, p);
      if (kept) r(Buf::kKvStageDevice, ps), w(Buf::kKvStageDevice, ps);
      break;
    case StepKind::kStoreKept:
      r(Buf::kKvStageDevice, ps);
      if (sh.kv_host) w(Buf::kKvHomeHost, p);
      if (sh.kv_disk) w(Buf::kKvStageHost, ps);
      break;
    case StepKind::kStoreCacheDisk: r(Buf::kKvStageHost, ps); break;
  }
  return a;
}

}  // namespace flexh2o
