// The zig-zag block schedule of one token step as a plain value: a list of steps, each on a
// queue, each with the steps it must wait for. Layer-major, micro-batch-minor: while unit u
// computes micro-batch k, unit u+1's weights, micro-batch k+1's KV cache and hidden state
// load, and micro-batch k-1's new KV and hidden state store. Every buffer slot is double
// buffered; write-after-read hazards are explicit dependencies (per-buffer events, never a
// global barrier). The executor only consumes this; tests inspect it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flexh2o {

enum class StepKind : uint8_t {
  kLoadWeightDisk,  // unit's disk-homed weights -> host staging
  kLoadWeight,      // unit's host-homed (+ staged) weights -> device slot
  kLoadCacheDisk,   // (u,k) disk-homed KV rows -> host staging
  kLoadCache,       // (u,k) host-homed (+ staged) KV rows -> device staging
  kLoadHidden,      // (u,k) hidden state host -> device
  kCompute,         // run unit u on micro-batch k
  kStoreHidden,     // (u,k) hidden state device -> host
  kStoreCache,      // (u,k) new KV rows device -> host home / host bounce
  kStoreCacheDisk,  // (u,k) new KV rows host -> disk
};
enum class Queue : uint8_t { kCompute = 0, kHostToDevice, kDeviceToHost, kDiskRead, kDiskWrite };
constexpr int kNumQueues = 5;
const char* step_name(StepKind k);
const char* queue_name(Queue q);

struct Step {
  StepKind kind = StepKind::kCompute;
  Queue queue = Queue::kCompute;
  int u = 0, k = 0;        // unit (0 embed, 1..L layers, L+1 head), micro-batch
  std::vector<int> deps;   // indices of earlier steps
};

// What exists in this token step; derived from the placement and the policy.
struct ScheduleShape {
  int units = 0;                  // n_layers + 2
  int micro_batches = 1;
  std::vector<bool> unit_streams;  // [units]: has host- or disk-homed weights
  std::vector<bool> unit_disk;     // [units]: has disk-homed weights
  bool prefill = true;
  bool kv_host = false, kv_disk = false;  // micro-batches have host / disk KV segments
  bool cpu_attention = false;             // decode attention on the host (cpu_cache_compute)
  bool act_on_host = false;
  // Cross-step prefetch of the first layer (unit 1) when it streams: `first_layer_loaded` says
  // the previous step already loaded it (no LWD(1)/LW(1) here); `prefetch_next` appends
  // LWD/LW of the next step's unit 1 as unit index `units` (into the slot of units-2's parity,
  // after its last reader here), so the disk works through the end of this step instead of
  // idling at the step boundary. Slots: unit u uses (u + phase) % 2, phase kept by the engine.
  bool first_layer_loaded = false, prefetch_next = false;
};

struct Schedule {
  std::vector<Step> steps;  // a topological order; each queue runs its steps in this order
  int units = 0;            // of the shape; a load of unit `units` is the next step's unit 1
  int find(StepKind kind, int u, int k) const;  // index or -1
  std::string str() const;                      // one line per step: "C(3,1) <- LW(3) LC(3,1)"
  std::string label(int i) const;               // "C(3,1)", "LW(3)", "LW(1 next)"
};

Schedule build_schedule(const ScheduleShape& s);

}  // namespace flexh2o
