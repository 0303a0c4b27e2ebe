// Private state of OffloadEngine: weight homes, per-batch KV homes and slots, the micro-batches
// of the current step, and the step actions. Included only by the engine's .cpp files:
// offload_engine.cpp (setup, weights, driver, report), offload_batch.cpp (batch buffers and
// lengths), offload_moves.cpp (transfers), offload_compute.cpp (compute and KV decisions).
#pragma once

#include <array>
#include <functional>
#include <cstddef>
#include <span>
#include <memory>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "engine/kv_evict.h"
#include "engine/offload_engine.h"

namespace flexh2o {

// The end of a refusal of a batch that does not fit: what to change (a KV policy only when the
// run has none; under one, a smaller budget).
inline const char* batch_fit_remedy(bool kv_policy) {
  return kv_policy ? "lower the batch size, the KV budget (--heavy-ratio/--recent-ratio, ...) or move data to a "
                     "lower tier"
                   : "lower the batch size, use a KV policy (--kv-policy h2o) or move data to a lower tier";
}

// The text whose digest is the store identity (store_identity.h): store format, model config,
// the dtype each checkpoint dtype is stored in on `dev` (and Q4 for 2-D weights when
// compress_weight), and the checkpoint's shard fingerprints.
std::string offload_store_manifest(const Model& model, const Device& dev, bool compress_weight);

struct WeightHome {
  Tier tier = Tier::kDevice;
  TensorView source;            // the model's view (shape, checkpoint dtype, address)
  DType dtype = DType::F16;     // as every tier holds it (PlacedTensor::dtype; Q4 when compressed)
  size_t bytes = 0;             // at `dtype`
  Buffer device;                // device home, unless shared with an earlier tensor
  const std::byte* device_ptr = nullptr;  // where a device-homed tensor is read
  const std::byte* host = nullptr;        // host home at `dtype`: the model's bytes or host_copy
  Buffer host_copy;             // converted (or pinned) copy when the model's bytes cannot serve
  HostPin pin;                  // the model's bytes registered in place
  TierCharge host_charge;       // host budget for a home used in place
  std::string store_name;       // disk home
  TierCharge disk_charge;
  size_t slot_offset = 0;       // in the device weight slot, when streamed
  size_t stage_offset = 0;      // in the host disk staging slot, when on disk
  bool token_table = false;     // unit 0's token embedding: streamed as the step's rows only
};

struct MicroBatch {
  int64_t first = 0, n = 0;  // global sequence range
  KvSplit split;
  // [layer], when a KV policy is set: cap_h slots a row, what a sequence keeps between steps
  // (empty: the layer never evicts).
  std::vector<KvPolicyState> policy_state;
  TierCharge policy_charge;                 // their bytes, on the host budget
  std::vector<Buffer> kv_device, kv_host;   // [layer]: K region then V region
  std::vector<std::string> kv_disk;         // [layer]: store entry (same layout as kv_host)
  std::vector<TierCharge> kv_disk_charge;
  Buffer hidden_device;  // act on device: [n * s_max, H]
  Buffer hidden_host;    // act on host: [n * s_max, H]
};

// Everything one batch holds (its KV homes and buffers, lengths, the current step): a group of a
// pipeline (OffloadEngine::select_group) parks its own while another group steps.
struct BatchState {
  // KV lengths and slots shared by a class of layers: every layer, or under a window cap
  // (full_cache_window()) of a model whose other layers attend to everything, class 0 those and
  // class 1 the sliding ones. Slots (KvSlots): cap_w per row of device-side buffers (the whole
  // prompt during prefill), cap_h of host and disk homes and the disk rows' host staging (the
  // policy's budget when one is set).
  struct KvClass : KvSlots {
    std::vector<KvBudget> budgets;                          // [B] with a policy
    std::vector<int32_t> len_before, len_after, len_final;  // [B] cached tokens before / after / kept
    bool evicts() const { return any_bounded(budgets); }
  };

  // Current batch.
  int64_t batch = 0, capacity = 0, s_max = 0;
  int64_t rows_reserved = 0;  // reserve_rows(): the widest step the prefill sizes buffers for
  std::vector<int64_t> budget_lengths;  // budget_lengths() of this batch; empty: prefill rows
  int64_t logit_rows = 1;  // rows of logits a sequence the buffers hold (the first step's ask)
  // BatchDims::head_logits_bytes of this batch (OffloadOptions'): 0 once the device budget
  // refused the larger slot.
  uint64_t head_logits_bytes = kHeadLogitsBytes;
  bool allocated = false;
  MemoryPlan plan;
  // This batch's KV policy: the caller's, or under a window cap `local` at the window (the
  // full-attention layers' budgets unbounded).
  const KvPolicy* kv_policy = nullptr;
  int64_t window = 0;  // the window cap, 0: none
  std::array<KvClass, 2> kvc;
  int n_classes = 1;
  // The prefill's decisions over the whole prompt (cap_w slots a row, one micro-batch: the host
  // queue decides one layer at a time); the kept rows then go to MicroBatch::policy_state.
  KvPolicyState prefill_state;
  TierCharge prefill_state_charge;
  std::vector<int32_t> seen;  // [B] tokens seen (next token's position)
  std::vector<std::vector<int32_t>> dirty_lo, dirty_hi;  // per layer [B*kvh]: disk rows to store
  std::vector<MicroBatch> mbs;
  std::array<Buffer, 2> kv_stage_device, kv_stage_host, scores_device, scores_host;
  std::array<Buffer, 2> keep_host, keep_device, hidden_slot;
  Buffer qkv_step, attn_step;  // q/k/v and attention rows of a whole step (one micro-batch)
  std::array<Buffer, 2> qkv_pipe, attn_pipe, qkv_host, attn_host;  // host-attention pipeline
  int64_t pipe_rows = 0;
  Buffer inputs_device, inputs_host, logits_device, logits_host;
  TierCharge scratch;  // the device's compute scratch for this batch

  // Current step. A streamed token table moves only the step's rows (row i = table[ids[i]]):
  // the embedding then reads them through local ids 0..batch*T-1. Off when the step has >=
  // vocab rows.
  bool prefill = true, gather_rows = false;
  int64_t T = 0;
  int64_t step_logit_rows = 1;  // logits of each sequence's last rows this step returns
  int32_t *in_ids = nullptr, *in_pos = nullptr, *in_pos_rows = nullptr, *in_local = nullptr, *in_keys = nullptr;
  // A pipeline stage after the first reads its hidden rows [batch * T, hidden] (act dtype) from
  // these instead of embedding tokens; one before the last writes them to hidden_out_*.
  Buffer hidden_in_device, hidden_in_host, hidden_out_device, hidden_out_host;
  int group = 0;
};

struct OffloadEngine::Impl : BatchState {
  explicit Impl(OffloadEngine& engine);

  // ---- setup and batch (offload_engine.cpp, offload_batch.cpp, offload_store.cpp)
  void place_weights();
  // Every disk-homed weight (units[u][i] for each (u, i)): reused when its file checks out (under
  // the directory's shared lock), else written (under its exclusive lock); says why on a rebuild.
  void place_disk_weights(const std::vector<std::pair<size_t, size_t>>& homes);
  // A note about the store: to OffloadOptions::notice, else "flexh2o: <line>" on stderr.
  void say(const std::string& line) const;
  void build_views();
  void begin_batch(int64_t B, int64_t capacity);
  void allocate_batch(const int32_t* real_rows);
  void ensure_pipeline(int64_t rows);  // host-attention slots for steps of `rows` rows per micro-batch
  void prepare_step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows);
  void finish_step(std::vector<float>& logits, std::vector<std::byte>* hidden_out_rows);
  // A buffer of `bytes` on tier t's budget: one of spare_host of exactly that size when kind is
  // kPinned, else a new one (the spares are freed first when the budget refuses it).
  Buffer alloc(MemKind kind, Tier t, size_t bytes, const std::string& what);
  // A charge on the host budget, the spares freed first when it is refused.
  [[nodiscard]] Status charge_host(uint64_t bytes, const std::string& what, TierCharge* out);
  // b, emptied: a pinned host buffer goes to spare_host for the next prefill, any other is freed.
  void retire(Buffer& b);
  // Throws when an allocation or charge failed: the message and this batch's needs per tier.
  void fail_unless(const Status& s);
  BatchDims dims() const;
  // What sizes a batch, from the same functions begin_batch() and the prefill use: its window cap
  // and KV policy by `cap` (tokens a sequence), each class's budgets by `length` (sequence b's
  // budget base), and the plan of a batch of B sequences whose prefill is `rows` wide.
  struct Sizing {
    int64_t window = 0;
    const KvPolicy* policy = nullptr;
    int classes = 1;
  };
  Sizing sizing(int64_t cap) const;
  std::vector<KvBudget> class_budgets(const Sizing& z, int cls, int64_t B,
                                      const std::function<int64_t(int64_t)>& length) const;
  BatchDims dims_of(const Sizing& z, int64_t B, int64_t rows, int64_t cap, int64_t logits,
                    const std::vector<KvBudget>& first_class) const;
  // The plan of a batch ahead of it (OffloadEngine::check_batch): `lengths` its prompts.
  MemoryPlan plan_batch(std::span<const int64_t> lengths, int64_t rows, int64_t cap) const;
  // Whether a batch sized by `z` may rewind its sequences and so take refill steps, wider than
  // its first (OffloadEngine::can_rewind()): a whole model's full cache. The current batch's is
  // known from begin_batch() on.
  bool rewindable(const Sizing& z) const { return z.policy == nullptr && !hidden_in && !hidden_out; }
  bool rewindable() const { return rewindable({window, kv_policy, n_classes}); }
  // The policy whose block is a batch of B: what plans of that batch count.
  Policy batch_policy(int64_t B) const;
  // The bytes of layer l's KV file on disk for a micro-batch with n_disk sequences there, under
  // `plan` of a batch with `classes` classes of layers; and the store space all of a batch of B
  // sequences' KV files take (an entry each, header and padding included).
  uint64_t kv_disk_file_bytes(const MemoryPlan& plan, int classes, int l, int64_t n_disk) const;
  uint64_t kv_disk_space(const MemoryPlan& plan, int classes, int64_t B) const;

  // ---- actions (offload_moves.cpp, offload_compute.cpp)
  void run(const Step& s);
  void load_weight_disk(int u);
  void load_weight(int u);
  void load_cache_disk(int u, int k);
  void load_cache(int u, int k);
  void load_hidden(int u, int k);
  void store_hidden(int u, int k);
  void compute(int u, int k);
  void store_qkv(int u, int k);
  void host_attention(int u, int k);
  void load_attn(int u, int k);
  void compute_rest(int u, int k);
  void store_cache(int u, int k);
  void update_cache(int u, int k);
  void gather_cache(int u, int k);
  void store_kept(int u, int k);
  void store_cache_disk(int u, int k);

  // ---- helpers
  int layer(int u) const { return e.placement_.units[size_t(u)].layer; }
  int class_of(int l) const { return n_classes > 1 && l >= 0 && c.attention_window(l) > 0 ? 1 : 0; }
  KvClass& kv_class(int l) { return kvc[size_t(class_of(l))]; }
  const KvClass& kv_class(int l) const { return kvc[size_t(class_of(l))]; }
  int pair(int u, int k) const { return kv_pair(e.shape_, u, k); }
  bool split() const { return e.shape_.host_attention(); }
  // A prefill with a KV policy: offloaded rows are compacted on the device, then stored.
  bool kept_mode() const { return prefill && kv_policy != nullptr; }
  StepRows rows(int k, int l = -1) const;  // seq_keys of layer l's class (l < 0: class 0)
  const ModelWeights& weights(int u) const;  // unit u's tensors where they are now (device views)
  std::byte* device_hidden(int u, int k) const;
  std::byte* qkv_slot(int p) const;   // q | k | v rows of the micro-batch (device)
  std::byte* attn_slot(int p) const;  // attention output rows (device)
  // K (part 0) or V (part 1) of sequence i of a buffer of n sequences x cap slots.
  std::byte* kv_at(const Buffer& b, int64_t n, int64_t cap, int part, int64_t i) const;
  // Copies slots [lo[i], hi[i]) of every head of `count` sequences (K and V) between two KV
  // buffers laid out [n, kv_heads, cap, head_dim] on queue q; one 2-D copy per run of sequences
  // with equal ranges. Returns the bytes moved.
  uint64_t copy_kv_rows(Queue q, const Buffer& dst, int64_t dst_n, int64_t dst_cap, int64_t dst_first,
                        const Buffer& src, int64_t src_n, int64_t src_cap, int64_t src_first, int64_t count,
                        const int32_t* lo, const int32_t* hi);
  void move_offloaded(int u, int k, Queue q, const int32_t* lo, const int32_t* hi);
  // Disk KV of (layer, k): page-aligned ranges of the staging slot, read or written at once.
  void disk_kv(int l, int k, const Buffer& stage, bool write, const std::vector<int32_t>& lo,
               const std::vector<int32_t>& hi, int64_t seq0);
  // The kept slots [0, kept[b]) of the first n_seq rows of prefill_state into `to` (a layer's state).
  void keep_prefill_state(KvPolicyState& to, int64_t n_seq, const std::vector<int32_t>& kept);
  EvictArgs evict_args(int l, int k, const KvSegment& seg, int64_t first_seq_in_mb, int64_t score_cap,
                       std::vector<int32_t>& after, std::vector<int32_t>& dlo, std::vector<int32_t>& dhi);

  OffloadEngine& e;
  Device& dev;
  const ModelConfig& c;
  const Policy& p;
  const KvPolicy* user_policy;             // OffloadOptions::kv_policy
  std::unique_ptr<KvPolicy> window_policy;  // `local` at c.sliding_window, for window caps
  DType kvdt, adt;
  size_t kv_row, es_a;  // bytes of one K (or V) row of one head (row_nbytes), of one activation
  std::string io_note;
  std::string store_manifest;  // offload_store_manifest(), when there is a store
  std::vector<std::vector<WeightHome>> units;
  std::array<Buffer, 2> weight_slot, weight_stage;
  std::array<std::vector<ModelWeights>, 2> views;  // [slot parity][unit]
  int slot_phase = 0;  // unit u's weights use slot (u + slot_phase) % 2 (schedule.h)
  uint64_t pinned_in_place = 0;
  // The previous batch's pinned host buffers (KV homes, staging), kept by begin_batch() for the
  // next prefill: pinning costs seconds per GiB (17 s for OPT-30B's 34 GB host cache on an H100
  // machine), so a job of equal batches pins once. A prefill of other dims (spare_dims) frees
  // them first, so no batch holds more than its plan; spares stay charged to the host budget.
  std::vector<Buffer> spare_host;
  BatchDims spare_dims;
  double setup_seconds = 0;    // inside allocate_batch(): sizing, allocating, pinning, freeing spares
  uint64_t reused_bytes = 0;   // pinned bytes served from spare_host
  uint64_t to_place = 0, placed_bytes = 0;  // weight bytes to place / placed (OffloadOptions::on_place)
  void placed(uint64_t bytes) {
    placed_bytes += bytes;
    if (e.opts_.on_place) e.opts_.on_place(placed_bytes, to_place);
  }
  // Lets the checkpoint pages of a weight just copied (device, converted host copy, store file)
  // leave the resident set, unless a host home may read them in place (host_sourced).
  void let_go(const WeightHome& h) const {
    if (!host_sourced.contains(h.source.data)) e.model_.release_pages(h.source.data, h.source.nbytes());
  }
  std::set<const void*> host_sourced;  // sources of host-tier tensors (the homes read in place)
  bool token_streamed = false;  // the token table is host- or disk-homed
  bool hidden_in = false, hidden_out = false;  // a pipeline stage: !stage_range().embed() / head()
  // The other groups' batches while one steps (select_group); [current] is empty.
  std::vector<BatchState> parked;
  void select_group(int g);
  // The current step's hidden rows from the previous stage (hidden_in), or empty.
  std::span<const std::byte> step_hidden_in;
};

}  // namespace flexh2o
