// Private state of OffloadEngine: weight homes, per-batch KV homes and staging slots, the
// micro-batches of the current step, and the step actions. Included only by the engine's
// .cpp files.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "engine/offload_engine.h"

namespace flexh2o {

int64_t kv_capacity_align(const ModelConfig& c);

struct WeightHome {
  Tier tier = Tier::kDevice;
  TensorView source;       // the model's view (shape, dtype, original address)
  size_t bytes = 0;
  TierBuffer home;         // device / host home
  std::string store_name;  // disk home
  TierCharge disk_charge;
  size_t slot_offset = 0;   // in the device weight slot, when streamed
  size_t stage_offset = 0;  // in the host disk staging slot, when on disk
  bool token_table = false; // unit 0's token embedding: streamed as the step's rows only
};

struct MicroBatch {
  int64_t first = 0, n = 0;  // global sequence range
  KvSplit split;
  std::vector<KvPolicyState> policy_state;  // per layer, when a KV policy is set
  // Per layer: K/V homes of the device and host segments, name of the disk segment file.
  std::vector<TierBuffer> kv_device, kv_host;
  std::vector<std::string> kv_disk;
  std::vector<TierCharge> kv_disk_charge;
  TierBuffer hidden_device;  // act on device: [n * s_max, H]
  TierBuffer hidden_host;    // act on host: [n * s_max, H]
  std::vector<float> logits;  // [n, V]
};

struct OffloadEngine::Impl {
  explicit Impl(OffloadEngine& engine) : e(engine), c(engine.config()), p(engine.opts_.policy) {}

  void place_weights();
  void begin_batch(int64_t B, int64_t capacity);
  void prepare_step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows);
  void run(const Step& s);
  void finish_step(std::vector<float>& logits);
  void alloc(Tier t, size_t bytes, const std::string& what, TierBuffer& out);

  static size_t align(size_t n) { return (n + 4095) / 4096 * 4096; }
  // Floats of one K (or V) region for n sequences at a capacity.
  int64_t region(int64_t n, int64_t cap) const { return n * c.n_kv_heads * cap * c.head_dim; }
  void allocate_batch(const int32_t* real_rows);

  // Actions
  void load_weight_disk(int u);
  void load_weight(int u);
  void load_cache_disk(int u, int k);
  void load_cache(int u, int k);
  void load_hidden(int u, int k);
  void compute(int u, int k);
  void store_hidden(int u, int k);
  void store_cache(int u, int k);
  void store_cache_disk(int u, int k);

  ModelWeights unit_weights(int u) const;  // views where unit u's tensors are now
  float* device_hidden(int u, int k);
  int pair(int u, int k) const { return (u - 1) * int(mbs.size()) + k; }
  // A K/V buffer: n sequences at a capacity (K region, then V region).
  struct KvBuf {
    float* data;
    int64_t n, cap;
  };
  // Copies slots [lo, hi) of each (sequence, head) row, for `count` sequences starting at global
  // sequence seq0, from src (starting at its sequence src_first) to dst (at dst_first).
  // lo/hi are indexed by global (sequence * kv_heads + head).
  void copy_rows(KvBuf dst, int64_t dst_first, KvBuf src, int64_t src_first, int64_t count, const int32_t* lo,
                 const int32_t* hi, int64_t seq0, Link link);
  // Reads/writes rows of the disk segment file of (layer, k) from/to a host buffer of the same layout.
  void disk_rows(int layer, int k, float* host, bool write, const int32_t* lo, const int32_t* hi);

  OffloadEngine& e;
  const ModelConfig& c;
  const Policy& p;
  std::string io_note;
  LayerCompute compute_;
  std::vector<std::vector<WeightHome>> units;
  std::array<TierBuffer, 2> weight_slot, weight_stage;
  int slot_phase = 0;  // unit u's weights use slot (u + slot_phase) % 2 (schedule.h)

  // Current batch. cap_w: slots per row of device-side buffers (the whole prompt during
  // prefill); cap_h: of host/disk homes and staging (the policy's budget when one is set).
  int64_t batch = 0, capacity = 0, cap_w = 0, cap_h = 0, s_max = 0, batch_no = 0;
  bool allocated = false;
  std::vector<KvBudget> budgets;                   // [B] with a policy
  std::vector<int32_t> seen;                       // [B] tokens seen (next token's position)
  std::vector<int32_t> len_final;                  // [B] cached tokens after this step's eviction
  std::vector<int32_t> load_lo, load_hi;           // [B*kvh] rows to load this step: [0, len_before)
  std::vector<std::vector<int32_t>> dirty_lo, dirty_hi;  // per layer [B*kvh]: rows to store
  std::vector<MicroBatch> mbs;
  std::array<TierBuffer, 2> kv_stage_device, kv_stage_host, kv_bounce, hidden_slot;
  TierCharge scratch_charge;
  std::vector<int32_t> len_before, len_after;  // [B] cached tokens before / after this step

  // Current step
  bool prefill = true;
  // Streamed token table: only the step's rows move (row i = table[ids[i]]), and the embedding
  // reads them through local_ids = 0..batch*T-1. Off when the step has >= vocab rows.
  bool gather_rows = false;
  bool token_streamed = false;  // the token table is host- or disk-homed
  std::vector<int32_t> local_ids;
  int64_t T = 0;
  const int32_t* ids = nullptr;
  const int32_t* positions = nullptr;
};

}  // namespace flexh2o
