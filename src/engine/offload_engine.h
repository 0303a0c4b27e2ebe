// The offloading engine: weights, KV cache and hidden states homed on device / host / disk
// tiers by a Policy, moved by a zig-zag schedule that overlaps every transfer with compute,
// on any Device (device.h): the CPU device (whose "device memory" is host memory charged to
// --gpu-mem) or a CUDA GPU. Disk I/O is real (DiskStore: io_uring + O_DIRECT or pread). The
// KV cache is stored in one dtype in every tier (f16 by default). One OffloadEngine drives one
// batch at a time; not thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/executor.h"
#include "engine/memory_plan.h"
#include "engine/placement.h"
#include "engine/runner.h"
#include "offload/disk_store.h"
#include "offload/tier.h"
#include "policies/kv_policy.h"

namespace flexh2o {

class OffloadEngine;

struct OffloadOptions {
  Policy policy;
  uint64_t device_mem = 0, host_mem = 0, disk_mem = 0;  // bytes; 0 = unlimited (device: the device's memory)
  std::filesystem::path offload_dir;                     // needed when anything is homed on disk
  IoBackendChoice io = IoBackendChoice::kAuto;
  // Hash every reused weight file's payload against its header before trusting it (one read of
  // the disk-homed weights at start). false (--trust-store): header and size checks only.
  bool verify_store = true;
  // One-line notes about the store (a rebuild and why, waiting for another run's lock); null:
  // printed to stderr as "flexh2o: <line>".
  std::function<void(const std::string&)> notice;
  // Caller-owned backend to use instead of probing one (tests wrap it to inject faults);
  // must outlive the engine.
  IoBackend* io_backend = nullptr;
  // KV-cache policy (null = full cache). Caller-owned; must outlive the engine.
  const KvPolicy* kv_policy = nullptr;
  // With the full cache, a batch whose sequences may pass the model's sliding window keeps only
  // the window in its sliding layers (full_cache_window(): the same logits, fewer KV bytes).
  // false: every layer keeps every token (tests compare the two).
  bool window_cap = true;
  // Of the KV cache in every tier: F16, BF16, F32 or Q4 (policy.compress_cache: the engine
  // makes the two agree, either one turning on both).
  DType kv_dtype = DType::F16;
  // Device bytes a scoring step's logits slot may grow to so that one head call computes many
  // rows (BatchDims::head_logits_bytes); 0: the generation slot only (bench_scoring's baseline).
  uint64_t head_logits_bytes = kHeadLogitsBytes;
  // Record when every schedule step ran (write_trace()); a few dozen bytes per step.
  bool trace = false;
  // Called by the constructor on its thread as it places the weights: (bytes placed, bytes to
  // place), device and host homes as they are uploaded or copied, disk homes as their store
  // files are checked or written. Null: none. The engine drops it once constructed.
  std::function<void(uint64_t done, uint64_t total)> on_place;
  // Called by the constructor about every 50 ms while another run holds the offload directory's
  // lock (DiskStoreOptions::still_waiting); what it throws ends the construction. Null: it waits.
  std::function<void()> while_waiting;
  // Called by the constructor once the engine is planned (its block, budgets, placement, the
  // offload directory opened) and before any weight is uploaded, copied or written: a caller
  // checks the batches it will run (check_batch) there, so that one refused costs no placing
  // (writing a large model's store takes minutes). What it throws ends the construction. Null:
  // none. The engine drops it once constructed.
  std::function<void(const OffloadEngine&)> before_placing;
  // Tests only: edits each token step's schedule before it runs (e.g. drops a dependency).
  std::function<void(Schedule&)> edit_schedule;
};

enum class Link : uint8_t { kDiskToHost = 0, kHostToDevice, kDeviceToHost, kHostToDisk };
constexpr int kNumLinks = 4;
const char* link_name(Link l);

// Counted by the engine as it moves bytes (logical payload bytes, not page padding).
struct TransferCounters {
  std::array<std::atomic<uint64_t>, kNumLinks> bytes{};
  std::atomic<uint64_t> kv{0};  // the KV-cache part of all links together
  void add(Link l, uint64_t n) { bytes[size_t(l)].fetch_add(n, std::memory_order_relaxed); }
  void add_kv(uint64_t n) { kv.fetch_add(n, std::memory_order_relaxed); }
  uint64_t get(Link l) const { return bytes[size_t(l)].load(std::memory_order_relaxed); }
};

struct OffloadReport {
  std::string device;             // Device::name()
  std::string kv_dtype, act_dtype, weight_dtype;
  std::array<uint64_t, kNumLinks> bytes{};
  uint64_t kv_bytes = 0;  // KV-cache rows moved over all links (the policy's effect)
  std::array<double, kNumQueues> busy{}, wait{};
  double wall = 0;                // seconds inside schedules
  int64_t token_steps = 0;
  double overlap_efficiency = 0;  // busiest queue / wall, over the whole run
  // Sum over token steps of the busiest queue in that step / wall: the bound moves between
  // steps (a prefill is compute-bound, decode steps may be link-bound), and this measures how
  // well each step hides everything behind its own slowest resource.
  double step_overlap_efficiency = 0;
  double step_bound = 0;  // seconds: the sum over token steps of that step's busiest queue
  std::array<uint64_t, 3> peak{};  // per tier
  uint64_t weights_pinned_in_place = 0;  // host-homed weight bytes used where the model holds them
  // Seconds the batches' prefills spent allocating their buffers (inside the prefill step's
  // time, outside the schedules' wall), and the pinned bytes they took from the previous batch.
  double batch_setup_seconds = 0;
  uint64_t batch_buffers_reused_bytes = 0;
  std::string io_note;           // which I/O backend / O_DIRECT
  // Bytes the offload directory's files read and wrote in the token steps (weights and KV): whole
  // 4096-byte pages, so a KV row written alone costs its page, where `bytes` counts the rows.
  uint64_t disk_read = 0, disk_written = 0;
  // ... and while the weights were placed (the store written or hash-checked), before any step.
  uint64_t placement_disk_read = 0, placement_disk_written = 0;
  size_t weights_reused = 0, weights_written = 0;
};

// The report of the interval from `base` to `now`, two reports of one engine with `base` taken
// first: bytes, times and steps subtracted, both efficiencies recomputed over the interval; the
// rest (dtypes, peaks, placement facts) is `now`'s.
OffloadReport report_interval(const OffloadReport& now, const OffloadReport& base);

class OffloadEngine final : public StepRunner {
 public:
  // Places the weights (uploading device-homed ones, writing disk-homed ones to the store or
  // reusing valid files, under the offload directory's lock so concurrent runs share them) and
  // checks the budgets. KV files on disk are this run's own and are removed when it ends.
  // Throws flexh2o::Error when the policy is invalid, a budget is too small (saying what the
  // minimum is, item by item), or the offload directory is unusable. `model` and `dev` must
  // outlive the engine.
  OffloadEngine(const Model& model, Device& dev, const OffloadOptions& opts);
  ~OffloadEngine() override;

  const ModelConfig& config() const override { return model_.config(); }
  int64_t max_batch() const override { return opts_.policy.block_size(); }
  void begin_batch(int64_t B, int64_t capacity) override;
  // Buffers sized at the prefill take at least `rows` rows a sequence, in a batch that can
  // rewind; other batches never refill.
  void reserve_rows(int64_t rows) override;
  void budget_lengths(std::span<const int64_t> lengths) override;
  // The batch's memory plan (the one its prefill allocates by) against the budgets.
  void check_batch(std::span<const int64_t> lengths, int64_t rows, int64_t capacity) const override;
  // Blocking. The first step of a batch (the prefill) sizes its buffers and fails, naming
  // every item, when they do not fit.
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override;
  size_t kv_bytes() const override { return kv_bytes_; }
  // true (the default): each step also loads the next step's first layer when it streams.
  void expect_more_steps(bool more) override { more_steps_ = more; }
  // A whole model's full cache (no policy or window cap). Under --cpu-cache-compute a step of
  // more than one row (a refill, a scoring chunk) attends on the device, as the prefill does.
  bool can_rewind() const override;
  bool rewinds(int64_t capacity) const override;
  void rewind(int64_t b, int64_t len) override;
  // A whole model without a KV policy (a window cap is the full cache's).
  bool can_step_rows() const override;
  void step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows, int64_t rows,
                 std::vector<float>& logits) override;
  // step() and step_rows() end at the next schedule step (a unit's load, compute or store) once
  // `*stop` is set; a stage's step (step_stage()) always runs to its end, as its peers wait for it.
  void stop_steps_on(const std::atomic<bool>* stop) override { stop_ = stop; }

  // ---- pipeline stages and groups
  // One step of a pipeline stage (the model is a Model::stage() view): stages after the first
  // start from `hidden_in`, the rows [B * T, hidden] (act dtype) the previous stage returned,
  // instead of embedding `ids`; stages before the last return theirs in *hidden_out (and leave
  // logits empty); the last stage returns logits as step() does. Blocking.
  void step_stage(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                  std::span<const std::byte> hidden_in, std::vector<std::byte>* hidden_out,
                  std::vector<float>& logits);
  // Batches held at once (a pipeline's groups in flight): each group has its own KV homes and
  // buffers, all charged to the budgets while they live. Resets to group 0. Default 1.
  void set_groups(int n);
  int groups() const;
  // Makes group g's batch the one begin_batch / step act on (the others stay as they are).
  void select_group(int g);
  // Called on the stepping thread about every millisecond while a step runs (run_schedule's
  // `idle`): a pipeline stage lets MPI move its messages during its own compute. Empty: none.
  void set_idle(std::function<void()> idle) { idle_ = std::move(idle); }

  const WeightPlacement& placement() const { return placement_; }
  const OffloadOptions& options() const { return opts_; }
  Device& device() const { return dev_; }
  OffloadReport report() const;
  // Bytes moved so far per link (relaxed atomic reads: safe from any thread while steps run).
  std::array<uint64_t, kNumLinks> link_bytes() const;
  const TierBudget& budget(Tier t) const { return *budgets_[size_t(t)]; }
  const Schedule& last_schedule() const { return schedule_; }
  const ScheduleShape& last_shape() const { return shape_; }
  // Tokens cached per sequence of the current batch (after the last step's eviction); under a
  // window cap, in the full-attention layers.
  std::vector<int32_t> lengths() const;
  // This batch's window cap (full_cache_window()), 0: none.
  int64_t window_cap() const;
  // With OffloadOptions::trace: every step run so far as Chrome trace-event JSON (open in
  // Perfetto or chrome://tracing): one row per queue, one slice per step, named like
  // "C(3,1)" (schedule.h), microseconds since the engine was created.
  void write_trace(std::ostream& os) const;

  struct Impl;  // buffers and actions (offload_*.cpp)

 private:
  void open_store(IoBackend& io);  // offload_store.cpp
  // step_stage() returning logits of each sequence's last `logit_rows` rows (step_rows()); with
  // `stop` (null: none) set, it throws StepStopped at the next schedule step.
  void run_step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows, int64_t logit_rows,
                std::span<const std::byte> hidden_in, std::vector<std::byte>* hidden_out, std::vector<float>& logits,
                const std::atomic<bool>* stop);
  const Model& model_;
  Device& dev_;
  OffloadOptions opts_;
  WeightPlacement placement_;
  std::array<std::unique_ptr<TierBudget>, 3> budgets_;
  std::unique_ptr<IoBackend> io_;
  std::unique_ptr<DiskStore> store_;
  std::unique_ptr<Impl> impl_;
  ScheduleShape shape_;
  Schedule schedule_;
  QueueTimes times_{};
  double step_bound_ = 0;  // sum over steps of max(queue busy)
  int64_t steps_ = 0;
  struct TraceEvent {
    std::string name;
    Queue queue;
    double start, end;  // seconds since epoch_
  };
  std::vector<TraceEvent> trace_;
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  size_t group_kv_bytes() const;  // KV bytes the current group's batch holds
  std::function<void()> idle_;
  TransferCounters counters_;
  size_t kv_bytes_ = 0;
  bool more_steps_ = true, first_layer_loaded_ = false;
  const std::atomic<bool>* stop_ = nullptr;  // stop_steps_on()
  size_t reused_ = 0, written_ = 0;
  uint64_t placed_read_ = 0, placed_written_ = 0;  // the store's I/O at the end of construction
};

// The KV dtype a run with `o` holds: Q4 when o.policy.compress_cache, else o.kv_dtype.
DType offload_kv_dtype(const OffloadOptions& o);

// The memory plan of `model` under `opts` on `dev` for a batch (what the engine allocates).
MemoryPlan offload_memory_plan(const Model& model, const Device& dev, const OffloadOptions& opts,
                               const BatchDims& dims);

}  // namespace flexh2o
