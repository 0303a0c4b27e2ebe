// Plain argument types of the unit ops (device.h, layer_compute.h): the rows of one
// micro-batch in a token step, and a KV segment (a contiguous range of its sequences whose
// K/V live in one buffer). Views only; they own nothing. And the one room check every attend
// makes before it writes K/V.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace flexh2o {

// KV layout: K and V each [n_seq, kv_heads, capacity, head_dim] in `dtype`, left-aligned:
// sequence b's tokens fill slots [0, n_b). Pointers are in the memory of whoever reads them
// (device memory for Device::attend, host memory for the host attention).
struct KvSegment {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::F32;
  int64_t first_seq = 0, n_seq = 0;  // sequences of the micro-batch this segment holds
  int64_t capacity = 0;              // slots per (sequence, kv head) in this buffer
  // Optional fp32 [n_seq, n_heads, capacity], zeroed by the caller: += each slot's attention
  // probability summed over this step's queries (H2O scores).
  float* key_scores = nullptr;
  // A sliding-window layer's segment (ModelConfig::attention_window; 0: full attention). The
  // query in slot s attends to slots (s - window, s]. That is the model's position window while
  // slots are positions, i.e. until a policy first evicts; from then on the policy keeps only
  // positions inside the window (kv_evict.h), and at most `window` slots are ever attended.
  int64_t window = 0;
};

// One micro-batch of a token step: n sequences x T rows, left-padded. Device arrays are in the
// memory of the device that computes (on the CPU device: host memory); host arrays always.
struct StepRows {
  int64_t n = 0, T = 0;
  const int32_t* ids = nullptr;        // device [n*T]: rows of the token table to embed
  const int32_t* positions = nullptr;  // device [n*T]: 0-based positions (rotary)
  const int32_t* pos_rows = nullptr;   // device [n*T]: rows of OPT's learned position table
  const int32_t* seq_keys = nullptr;   // device [n]: cached tokens per sequence after this step's write
  const int32_t* host_ids = nullptr;   // host mirrors of the four arrays above
  const int32_t* host_positions = nullptr;
  const int32_t* host_pos_rows = nullptr;
  const int32_t* host_seq_keys = nullptr;
  int64_t max_keys = 0;                // max of seq_keys
};

// Throws ("KV cache full") when a sequence of `seg` needs more slots than seg.capacity after
// this step's write; keys: the micro-batch's host seq_keys (StepRows::host_seq_keys), indexed
// from the micro-batch's first sequence. An invariant of the engine, checked on every device.
inline void check_kv_room(const int32_t* keys, const KvSegment& seg) {
  for (int64_t b = seg.first_seq; b < seg.first_seq + seg.n_seq; ++b)
    FH_CHECK(keys[b] <= seg.capacity, "KV cache full: sequence needs ", keys[b], " slots, capacity ", seg.capacity);
}

// Throws when any of the n host ids of a gather_rows call (Device::gather_rows) is outside
// [0, table_rows): every device checks before it copies, so a bad id is named, not read past the
// table or zeroed by a kernel.
inline void check_gather_ids(const int32_t* host_ids, int64_t n, int64_t table_rows) {
  FH_CHECK(host_ids || n <= 0, "gather_rows: host ids needed");
  for (int64_t i = 0; i < n; ++i)
    FH_CHECK(host_ids[i] >= 0 && host_ids[i] < table_rows, "gather_rows: row ", host_ids[i], " outside [0, ",
             table_rows, ")");
}

}  // namespace flexh2o
