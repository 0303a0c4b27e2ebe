// The zig-zag block schedule of one token step as a plain value: a list of steps, each on a
// queue, each with the steps it must wait for. Unit-major, micro-batch-minor: while unit u
// computes micro-batch k, unit u+1's weights, micro-batch k+1's KV cache and hidden state
// load, and micro-batch k-1's new KV and hidden state store. Every buffer slot is double
// buffered; write-after-read hazards are explicit dependencies (per-buffer events, never a
// global barrier). schedule_accesses() says which buffer each step reads and writes, so tests
// can check that every conflicting pair is ordered. The executor only consumes this.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flexh2o {

// What a unit computes. With --sep-layer (FlexGen's granularity) a transformer layer is two
// units, attention then MLP; otherwise one kLayer unit. Units with a KV cache: kLayer, kAttention.
enum class UnitKind : uint8_t { kEmbed, kLayer, kAttention, kMlp, kHead };
const char* unit_kind_name(UnitKind k);

enum class StepKind : uint8_t {
  kLoadWeightDisk,  // unit's disk-homed weights -> host staging
  kLoadWeight,      // unit's host-homed (+ staged) weights -> device slot
  kLoadCacheDisk,   // (u,k) disk-homed KV rows -> host staging
  kLoadCache,       // (u,k) host-homed (+ staged) KV rows -> device staging
  kLoadHidden,      // (u,k) hidden state host -> device
  kCompute,         // run unit u on micro-batch k (with host attention: its part up to q/k/v)
  kStoreQkv,        // (u,k) q/k/v rows of host-attended sequences device -> host
  kHostAttention,   // (u,k) attention (+ KV policy) on the host where those sequences' KV lives
  kLoadAttn,        // (u,k) host attention output -> device
  kComputeRest,     // the rest of unit u on micro-batch k after host attention
  kStoreHidden,     // (u,k) hidden state device -> host
  kStoreCache,      // (u,k) new KV rows of offloaded sequences (+ attention scores) device -> host
                    //   (a prefill with a KV policy: the scores only)
  kUpdateCache,     // (u,k) the KV policy's decision on the host, applied to host homes / staging
  kGatherCache,     // (u,k) device-homed KV (and a prefill's staging) compacted by that decision
  kStoreKept,       // (u,k) a prefill with a KV policy: the kept rows of offloaded sequences -> host
  kStoreCacheDisk,  // (u,k) changed KV rows host -> disk
};
enum class Queue : uint8_t { kCompute = 0, kHostToDevice, kDeviceToHost, kDiskRead, kDiskWrite, kHost };
constexpr int kNumQueues = 6;
const char* step_name(StepKind k);
const char* queue_name(Queue q);

struct Step {
  StepKind kind = StepKind::kCompute;
  Queue queue = Queue::kCompute;
  int u = 0, k = 0;        // unit (0 embed, ..., units-1 head), micro-batch
  std::vector<int> deps;   // indices of earlier steps
};

// What exists in this token step; derived from the placement and the policy.
struct ScheduleShape {
  std::vector<UnitKind> kinds;     // [units]: kEmbed, layers (kLayer, or kAttention/kMlp pairs), kHead
  int micro_batches = 1;
  std::vector<bool> unit_streams;  // [units]: has host- or disk-homed weights
  std::vector<bool> unit_disk;     // [units]: has disk-homed weights
  bool prefill = true;
  bool kv_device = true;                  // micro-batches have device-homed KV sequences
  bool kv_host = false, kv_disk = false;  // micro-batches have host / disk KV sequences
  bool cpu_attention = false;             // decode attention on the host for those (cpu_cache_compute)
  bool act_on_host = false;
  bool kv_policy = false;                 // a KV policy decides on the host after each attention
  // Cross-step prefetch of the first layer unit (unit 1) when it streams: `first_layer_loaded`
  // says the previous step already loaded it (no LWD(1)/LW(1) here); `prefetch_next` appends
  // LWD/LW of the next step's unit 1 as unit index `units` (into the slot of units-2's parity,
  // after its last reader here), so the disk works through the end of this step instead of
  // idling at the step boundary. Slots: unit u uses (u + phase) % 2, phase kept by the engine.
  bool first_layer_loaded = false, prefetch_next = false;

  int units() const { return int(kinds.size()); }
  bool has_kv(int u) const { return kinds[size_t(u)] == UnitKind::kLayer || kinds[size_t(u)] == UnitKind::kAttention; }
  bool offloaded() const { return kv_host || kv_disk; }
  // Decode attention of offloaded sequences runs on the host (compute is split around it).
  bool host_attention() const { return !prefill && cpu_attention && offloaded(); }
};

// The units of a model: embed, n_layers layers (split in two with sep_layer), head.
std::vector<UnitKind> unit_kinds(int64_t n_layers, bool sep_layer);

struct Schedule {
  std::vector<Step> steps;  // a topological order; each queue runs its steps in this order
  int units = 0;            // of the shape; a load of unit `units` is the next step's unit 1
  int find(StepKind kind, int u, int k) const;  // index or -1
  std::string str() const;                      // one line per step: "C(3,1) <- LW(3) LC(3,1)"
  std::string label(int i) const;               // "C(3,1)", "LW(3)", "LW(1 next)"
};

Schedule build_schedule(const ScheduleShape& s);

// ---- what each step touches (for hazard checks) ------------------------------------------
// Buffers named abstractly: the slot index is the parity the step uses (weights: unit parity;
// KV and q/k/v/attention slots: KV pair parity; hidden slots: (u * K + k) parity), `id` the
// unit or (KV unit, micro-batch) home it refers to.
enum class Buf : uint8_t {
  kWeightSlot, kWeightStage,          // id: slot
  kKvHomeDevice, kKvHomeHost,         // id: KV pair (layer * K + k)
  kKvStageDevice, kKvStageHost,       // id: slot
  kScoresDevice, kScoresHost, kKeep,  // id: slot
  kQkvDevice, kQkvHost, kAttnDevice, kAttnHost,  // id: slot
  kHiddenDevice,                      // id: micro-batch (act on device)
  kHiddenSlot,                        // id: slot (act on host)
  kHiddenHost,                        // id: micro-batch
  kLogits,                            // id: micro-batch
};
struct Access {
  Buf buf;
  int id = 0;
  bool write = false;
};
// The accesses of step `i` of `s` built from `shape` (the engine's actions touch exactly these).
std::vector<Access> schedule_accesses(const ScheduleShape& shape, const Schedule& s, int i);
// Index of the KV pair (kv unit ordinal * K + k) of an attention unit u; -1 for other units.
int kv_pair(const ScheduleShape& shape, int u, int k);

}  // namespace flexh2o
