// Building the zig-zag step list with its data and write-after-read dependencies.
#include "engine/schedule.h"

#include <map>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace flexh2o {

const char* step_name(StepKind k) {
  switch (k) {
    case StepKind::kLoadWeightDisk: return "LWD";
    case StepKind::kLoadWeight: return "LW";
    case StepKind::kLoadCacheDisk: return "LCD";
    case StepKind::kLoadCache: return "LC";
    case StepKind::kLoadHidden: return "LH";
    case StepKind::kCompute: return "C";
    case StepKind::kStoreHidden: return "SH";
    case StepKind::kStoreCache: return "SC";
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
  }
  return "?";
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

namespace {

class Builder {
 public:
  explicit Builder(const ScheduleShape& s) : s_(s), K_(s.micro_batches) {}

  Schedule build() {
    FH_CHECK(s_.units >= 3 && K_ >= 1, "schedule needs >= 3 units and >= 1 micro-batch");
    load_weights(0);
    prefetch_pair(0, 0);
    for (int u = 0; u < s_.units; ++u) {
      for (int k = 0; k < K_; ++k) {
        // Queues run in emission order: the next micro-batch's KV goes first, so it never
        // waits behind the next unit's weights (which may be waiting on the disk).
        if (k + 1 < K_) prefetch_pair(u, k + 1);
        if (k == 0 && u + 1 < s_.units) load_weights(u + 1);
        if (k + 1 == K_ && u + 1 < s_.units) prefetch_pair(u + 1, 0);
        compute(u, k);
        store_pair(u, k);
        if (deferred_hidden_ >= 0) {  // its input was stored just now (one micro-batch)
          load_hidden(deferred_hidden_, 0);
          deferred_hidden_ = -1;
        }
      }
    }
    prefetch_next_first_layer();  // last in every queue: nothing of this step waits behind it
    out_.units = s_.units;
    return std::move(out_);
  }

 private:
  bool is_layer(int u) const { return u >= 1 && u + 1 < s_.units; }
  // Position of (u,k) in layer-pair order, for KV slot double-buffering.
  int pair(int u, int k) const { return (u - 1) * K_ + k; }
  int flat(int u, int k) const { return u * K_ + k; }
  bool gpu_kv_load() const { return !s_.prefill && (s_.kv_host || s_.kv_disk) && !s_.cpu_attention; }
  bool host_kv_staging_used_by_compute() const { return !s_.prefill && s_.kv_disk && s_.cpu_attention; }

  int id(StepKind kind, int u, int k) const {
    auto it = index_.find({kind, u, k});
    return it == index_.end() ? -1 : it->second;
  }
  void dep(std::vector<int>& d, StepKind kind, int u, int k) const {
    if (int i = id(kind, u, k); i >= 0) d.push_back(i);
  }
  // Step that used (u, k) `back` pairs earlier in layer-pair order.
  void dep_pair_back(std::vector<int>& d, StepKind kind, int u, int k, int back) const {
    const int p = pair(u, k) - back;
    if (p < 0) return;
    dep(d, kind, p / K_ + 1, p % K_);
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
    dep(d, StepKind::kCompute, u - 2, K_ - 1);  // device slot u%2 was read by unit u-2
    emit(StepKind::kLoadWeight, Queue::kHostToDevice, u, 0, d);
  }

  // Next step's unit 1 as unit index s_.units: it takes the slot of the same parity, the one
  // the last layer (units - 2) uses, never the head's (still computing at the end of the step);
  // the engine shifts the next step's slot parity to match (OffloadEngine::Impl::slot_phase). It
  // waits for the last step here that reads that device slot (a compute of a streamed unit of
  // that parity) and that host staging slot (an LW of a disk-homed one).
  void prefetch_next_first_layer() {
    if (!s_.prefetch_next || s_.units < 3 || !s_.unit_streams[1]) return;
    int last_dev = -1, last_stage = -1;
    for (int v = 2 - s_.units % 2; v < s_.units; v += 2) {
      if (s_.unit_streams[size_t(v)]) last_dev = v;
      if (s_.unit_disk[size_t(v)] && id(StepKind::kLoadWeight, v, 0) >= 0) last_stage = v;
    }
    const int next = s_.units;
    if (s_.unit_disk[1]) {
      std::vector<int> d;
      if (last_stage >= 0) dep(d, StepKind::kLoadWeight, last_stage, 0);
      emit(StepKind::kLoadWeightDisk, Queue::kDiskRead, next, 0, d);
    }
    std::vector<int> d;
    dep(d, StepKind::kLoadWeightDisk, next, 0);
    if (last_dev >= 0) dep(d, StepKind::kCompute, last_dev, K_ - 1);
    emit(StepKind::kLoadWeight, Queue::kHostToDevice, next, 0, d);
  }

  void prefetch_pair(int u, int k) {
    if (is_layer(u) && !s_.prefill && s_.kv_disk) {
      std::vector<int> d;  // host KV staging slot: last used by pair p-2
      dep_pair_back(d, StepKind::kLoadCache, u, k, 2);
      dep_pair_back(d, StepKind::kCompute, u, k, 2);
      dep_pair_back(d, StepKind::kStoreCacheDisk, u, k, 2);
      emit(StepKind::kLoadCacheDisk, Queue::kDiskRead, u, k, d);
    }
    if (is_layer(u) && gpu_kv_load()) {
      std::vector<int> d;
      dep(d, StepKind::kLoadCacheDisk, u, k);
      dep_pair_back(d, StepKind::kCompute, u, k, 2);     // device KV staging slot
      dep_pair_back(d, StepKind::kStoreCache, u, k, 2);
      emit(StepKind::kLoadCache, Queue::kHostToDevice, u, k, d);
    }
    if (s_.act_on_host && u > 0) {
      if (id(StepKind::kStoreHidden, u - 1, k) < 0) {
        deferred_hidden_ = u;  // with one micro-batch the input is stored after this compute
        return;
      }
      load_hidden(u, k);
    }
  }

  void load_hidden(int u, int k) {
    std::vector<int> d;
    dep(d, StepKind::kStoreHidden, u - 1, k);  // data
    FH_CHECK(!d.empty(), "schedule: hidden state of unit ", u - 1, " is loaded before it is stored");
    const int r = flat(u, k) - 2;  // device hidden slot reuse
    if (r >= 0) {
      dep(d, StepKind::kCompute, r / K_, r % K_);
      dep(d, StepKind::kStoreHidden, r / K_, r % K_);
    }
    emit(StepKind::kLoadHidden, Queue::kHostToDevice, u, k, d);
  }

  void compute(int u, int k) {
    std::vector<int> d;
    dep(d, StepKind::kLoadWeight, u, 0);
    if (is_layer(u)) {
      dep(d, StepKind::kLoadCache, u, k);
      dep(d, StepKind::kLoadCacheDisk, u, k);
      // New rows land in a staging slot that the store of pair p-2 may still be reading.
      dep_pair_back(d, StepKind::kStoreCache, u, k, 2);
      if (host_kv_staging_used_by_compute()) dep_pair_back(d, StepKind::kStoreCacheDisk, u, k, 2);
    }
    if (s_.act_on_host) {
      dep(d, StepKind::kLoadHidden, u, k);
      const int r = flat(u, k) - 2;  // the device hidden slot's previous writer's store
      if (r >= 0) dep(d, StepKind::kStoreHidden, r / K_, r % K_);
    } else {
      dep(d, StepKind::kCompute, u - 1, k);
    }
    emit(StepKind::kCompute, Queue::kCompute, u, k, d);
  }

  void store_pair(int u, int k) {
    if (s_.act_on_host && u + 1 < s_.units)
      emit(StepKind::kStoreHidden, Queue::kDeviceToHost, u, k, {id(StepKind::kCompute, u, k)});
    if (!is_layer(u) || !(s_.kv_host || s_.kv_disk)) return;
    const bool host_path = !s_.prefill && s_.cpu_attention;  // new rows already on the host
    if (!host_path) {
      std::vector<int> d{id(StepKind::kCompute, u, k)};
      dep_pair_back(d, StepKind::kStoreCacheDisk, u, k, 2);  // host bounce slot
      emit(StepKind::kStoreCache, Queue::kDeviceToHost, u, k, d);
    }
    if (s_.kv_disk) {
      std::vector<int> d;
      dep(d, StepKind::kStoreCache, u, k);
      dep(d, StepKind::kCompute, u, k);
      emit(StepKind::kStoreCacheDisk, Queue::kDiskWrite, u, k, d);
    }
  }

  const ScheduleShape& s_;
  const int K_;
  Schedule out_;
  int deferred_hidden_ = -1;
  std::map<std::tuple<StepKind, int, int>, int> index_;
};

}  // namespace

Schedule build_schedule(const ScheduleShape& s) {
  FH_CHECK(int(s.unit_streams.size()) == s.units && int(s.unit_disk.size()) == s.units,
           "schedule shape: per-unit flags missing");
  return Builder(s).build();
}

}  // namespace flexh2o
