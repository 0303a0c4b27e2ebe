// Host-side plan of the CUDA weight-offloading runner (GpuOffloadRunner), counted and mapped
// before any CUDA call: which stream runs each schedule step and which events it waits on
// (StreamPlan), the device-side layout of the weights at the compute dtype (homes and the two
// weight slots), and the device bytes a run needs, item by item. Plain C++: built and tested
// in every build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/placement.h"
#include "engine/schedule.h"

namespace flexh2o::gpu {

// Throws Error (what is not wired, what to use instead) unless the policy homes no weights on
// disk, keeps the KV cache wholly on the GPU or wholly on the host with --cpu-cache-compute
// (HostKv), keeps the hidden states wholly on the GPU or wholly on the host, and sets a KV
// policy only with the cache on the host.
void check_gpu_offload_policy(const Policy& p, bool kv_policy);

// What the CUDA offloading runner keeps off the GPU (a checked policy).
struct OffloadModes {
  bool kv_host = false;   // KV homed on the host, decode attention there (cache 0 100, cpu_cache_compute)
  bool act_host = false;  // hidden states homed on the host between units (act 0 100)
  bool scores = false;    // kv_host with a KV policy that needs the prefill's attention scores
};
OffloadModes offload_modes(const Policy& p, bool policy_needs_scores);

// CUDA streams of the executor: kCompute -> 0, kHostToDevice -> 1, kDeviceToHost -> 2. The
// disk queues have no stream (the disk tier is not wired on CUDA): planning them throws.
inline constexpr int kNumStreams = 3;

// Per step of a Schedule: its stream, and the steps whose events it waits on before it is
// enqueued (cudaStreamWaitEvent). A dependency on the same stream needs no wait (a stream
// runs in order and steps are enqueued in schedule order); of several dependencies on one
// other stream only the latest is waited on (it implies the earlier ones). Without overlap
// every step runs on stream 0 and nothing waits.
struct StreamPlan {
  std::vector<int> stream;             // [steps]
  std::vector<std::vector<int>> waits; // [steps] indices of earlier steps, ascending
};
StreamPlan plan_streams(const Schedule& s, bool overlap = true);

// Where the weights sit on the device, per tensor of the placement (same unit/tensor order):
// a device home (offset into the homes block), or a streamed tensor (offset into a weight
// slot). Every tensor is converted to `dtype` and aligned to kTensorAlign. A tensor whose
// source is already device-homed in another unit (the tied lm_head) shares that home.
struct DeviceLayout {
  DType dtype = DType::F16;
  std::vector<std::vector<size_t>> offset;  // [unit][tensor]: in the homes block or in a slot
  std::vector<std::vector<bool>> streamed;  // [unit][tensor]: host-homed (copied each step)
  size_t home_bytes = 0;                    // device-homed weights
  size_t slot_bytes = 0;                    // one weight slot: the largest streamed unit
  size_t host_bytes = 0;                    // host-homed weights at `dtype` (pinned homes)
  std::vector<size_t> unit_streamed;        // [unit] bytes one LW step copies
};
// Throws Error if the placement homes anything on disk (no disk tier on CUDA yet).
DeviceLayout device_layout(const WeightPlacement& wp, DType dtype);

// What a batch needs on the device, one line per item, against the budget.
struct GpuOffloadNeed {
  struct Item {
    std::string what;
    size_t bytes = 0;
  };
  std::vector<Item> items;
  size_t total() const;
  std::string str() const;  // "weights homed on the GPU 1.2 GiB, weight double buffer ..., total X"
};
inline constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // CublasHandle's default
// Per-batch device buffers, carved from the runner's arena in this order (each aligned to
// kTensorAlign): hidden [batch * rows, hidden] (dtype; act_host: two slots of one micro-batch),
// step inputs (ids | positions | OPT position rows [batch * rows] | seq_keys [batch], int32),
// logits [batch, vocab] fp32, then either K and V of every layer [batch, kv_heads, capacity,
// head_dim] (dtype) or, with kv_host, two prefill staging slots each of K and V [micro-batch,
// kv_heads, rows, head_dim] (+ two fp32 score slots [micro-batch, heads, rows] with scores),
// and the compute scratch of one micro-batch (GpuLayerCompute::carve_scratch).
struct BatchBuffers {
  size_t hidden = 0, inputs = 0, logits = 0, kv_layer = 0, scratch = 0;
  size_t kv_stage = 0, scores_stage = 0;  // kv_host: one slot of K (or V) / of scores
  int64_t layers = 0;
  OffloadModes modes;
  size_t hidden_total() const;  // 1 buffer, or 2 slots with act_host
  size_t kv() const;     // 2 * layers K/V buffers, or the kv_host staging slots, aligned
  size_t total() const;  // everything, aligned
};
BatchBuffers batch_buffers(const ModelConfig& c, DType dt, int64_t batch, int64_t gpu_batch_size, int64_t rows_per_seq,
                           int64_t capacity, const OffloadModes& modes = {});

// Device bytes for a batch of `batch` sequences (micro-batches of `gpu_batch_size`) whose
// longest step has `rows_per_seq` rows, with `capacity` KV slots per sequence. batch == 0
// counts only what exists before any batch (weights, slots, cuBLAS workspace).
GpuOffloadNeed gpu_offload_need(const ModelConfig& c, const DeviceLayout& l, int64_t batch, int64_t gpu_batch_size,
                                int64_t rows_per_seq, int64_t capacity, const OffloadModes& modes = {});

// "" when `need` fits `budget`; else the message naming every item and the budget.
std::string budget_error(const GpuOffloadNeed& need, size_t budget, const std::string& what);

}  // namespace flexh2o::gpu
