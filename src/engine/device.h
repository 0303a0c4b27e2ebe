// Device: what differs between the machines the offloading engine runs on. Memory of three
// kinds charged to the tier budgets; in-order queues (compute, host->device, device->host,
// disk read, disk write, host) with events; and the ops of one transformer unit on device
// memory. Two implementations: CpuDevice (engine/cpu_device.h, the reference: its "device
// memory" is host memory charged to --gpu-mem) and the CUDA device (gpu/cuda_device.h). One
// engine (offload_engine.h) drives both from the same Schedule value.
//
// Queue contract: ops named with a Queue are enqueued on it and run in the order enqueued; an
// op may run after the call returns (CUDA) or before (CPU). Device queues (compute, host->device,
// device->host) take only device ops; the disk and host queues are host threads of the
// executor, whose host work runs synchronously inside the step. Compute ops run on
// Queue::kCompute. All calls for one queue come from one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/error.h"
#include "engine/schedule.h"
#include "engine/unit_args.h"
#include "model/weights.h"
#include "offload/aligned_buffer.h"
#include "offload/tier.h"

namespace flexh2o {

enum class MemKind : uint8_t { kDevice, kPinned, kPageable };
// Host memory a Device allocates (kPinned, kPageable) starts at a multiple of kHostAlign: the
// engine hands it, and page offsets into it, to O_DIRECT disk I/O (the KV cache's disk staging,
// DiskStore::read_ranges / write_ranges), which needs kIoAlign.
inline constexpr size_t kHostAlign = kIoAlign;
enum class DeviceKind : uint8_t { kCpu, kCuda };
const char* device_kind_name(DeviceKind k);

// The engine's main thread, for Device::host_access (queues are agents 0..kNumQueues-1).
inline constexpr int kMainAgent = kNumQueues;

class Device;

// Move-only owner of one allocation made by a Device, charged to a TierBudget while it lives.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  std::byte* data() const { return data_; }
  template <class T>
  T* as() const { return reinterpret_cast<T*>(data_); }
  size_t size() const { return size_; }
  MemKind kind() const { return kind_; }
  explicit operator bool() const { return data_ != nullptr; }
  void reset() noexcept;

 private:
  friend class Device;
  Device* dev_ = nullptr;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  MemKind kind_ = MemKind::kDevice;
  TierCharge charge_;
};

// A point in one queue's work, made by Device::record(). Copyable handle; the device owns the
// meaning (CPU: a completion flag and time; CUDA: a cudaEvent_t).
struct EventState {
  virtual ~EventState() = default;
};
using Event = std::shared_ptr<const EventState>;

// Undoes Device::pin_in_place when destroyed.
struct PinState {
  virtual ~PinState() = default;
};
using HostPin = std::unique_ptr<PinState>;

class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;      // "CPU (2 threads, AVX-512)", "NVIDIA H200"
  virtual DType act_dtype() const = 0;        // hidden states, q/k/v and attention rows
  virtual DType weight_dtype(DType checkpoint) const = 0;  // weights as the ops read them
  virtual uint64_t memory_bytes() const = 0;  // device memory to budget by default (0: unlimited)
  // Why this device's attention cannot run `c` over a KV cache of `kv` (empty: it can). The
  // offloading engine refuses such a run before any work.
  virtual std::string kv_unsupported(const ModelConfig& c, DType kv) const {
    (void)c, (void)kv;
    return {};
  }

  // ---- memory --------------------------------------------------------------------------
  // kOutOfBudget (naming `what`) when the budget or the device refuses. Contents undefined.
  // Host kinds start at a multiple of kHostAlign (make_buffer checks).
  [[nodiscard]] virtual Status allocate(MemKind kind, size_t bytes, TierBudget& budget, const std::string& what,
                                        Buffer* out) = 0;
  // Makes existing read-only host memory a fast copy source (CUDA: registered, read-only).
  // Null when refused or not needed; the caller then copies the bytes into pinned memory.
  virtual HostPin pin_in_place(const void* p, size_t bytes) {
    (void)p, (void)bytes;
    return nullptr;
  }
  // Blocking: converts host tensor `src` (f32/f16/bf16) to weight_dtype(src.dtype) into `dst`
  // (device memory of src.numel() elements); a Q4 `src` (records, compressed by the engine at
  // placement) is copied as it is (src.nbytes() bytes).
  virtual void upload(void* dst, const TensorView& src) = 0;
  // Sizes the compute ops' scratch for steps of up to `rows` rows and `seqs` sequences and
  // returns its charge to `budget` (device_scratch_bytes() below), which the caller holds while
  // it runs ops. Throws naming the bytes when the budget or the device has no room.
  [[nodiscard]] virtual TierCharge reserve(const ModelConfig& c, int64_t rows, int64_t seqs, TierBudget& budget) = 0;

  // ---- queues and events ---------------------------------------------------------------
  // Marks the end of everything enqueued on q so far. Timing events (for seconds_between).
  virtual Event record(Queue q) = 0;
  // q's later work starts after e: a device queue waits without blocking the caller when the
  // device can; a host queue blocks the caller until e is complete.
  virtual void wait(Queue q, const Event& e) = 0;
  virtual void host_wait(const Event& e) = 0;  // blocks the caller until e is complete
  // Blocks until every queue is idle; rethrows the first failure of asynchronous work.
  virtual void synchronize() = 0;
  // Seconds from `from` to `to` (both complete).
  virtual double seconds_between(const Event& from, const Event& to) = 0;
  // The main thread starts a schedule (after it wrote this step's inputs) / declares an access
  // to a buffer by a host queue or the main thread (the CPU device's hazard checker).
  virtual void begin_schedule() {}
  virtual void host_access(int agent, const void* p, size_t bytes, bool write) {
    (void)agent, (void)p, (void)bytes, (void)write;
  }
  // True when the device checks accesses; then the executor names each step it starts.
  virtual bool checking() const { return false; }
  virtual void annotate(int agent, std::string label) { (void)agent, (void)label; }
  // Runs host work (the host queue's attention, KV decisions) in the device's thread pool.
  virtual void host_run(const std::function<void()>& f) { f(); }

  // ---- moves (device queues) -----------------------------------------------------------
  virtual void copy(Queue q, void* dst, const void* src, size_t bytes) = 0;
  // height rows of `width` bytes, at pitches dpitch / spitch.
  virtual void copy_2d(Queue q, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                       size_t height) = 0;
  // dst row i (row_bytes) = table row ids[i]; table in device memory or pinned host memory,
  // ids on the device (host_ids: the same on the host). ids must be in [0, table_rows).
  virtual void gather_rows(Queue q, void* dst, const void* table, int64_t table_rows, size_t row_bytes,
                           const int32_t* ids, const int32_t* host_ids, int64_t n) = 0;
  virtual void fill_zero(Queue q, void* dst, size_t bytes) = 0;

  // ---- unit ops (Queue::kCompute) --------------------------------------------------------
  // Weights are views of device memory in weight_dtype(); activations [n*T rows] in act_dtype().
  // hidden[n*T, H] = token embedding (+ OPT learned positions).
  virtual void embed(const ModelConfig& c, const ModelWeights& w, const StepRows& r, void* hidden) = 0;
  // q [n*T, q_dim], k and v [n*T, kv_dim] from the first norm of hidden (bias, rotary applied).
  virtual void attention_in(const ModelConfig& c, const LayerWeights& L, const StepRows& r, const void* hidden,
                            void* q, void* k, void* v) = 0;
  // Per segment (device memory, sequences [first_seq, first_seq + n_seq) of r): the new K/V
  // rows go into the cache, then attention; output rows of those sequences into attn.
  virtual void attend(const ModelConfig& c, const StepRows& r, const void* q, const void* k, const void* v,
                      std::span<const KvSegment> segs, void* attn) = 0;
  // hidden += o_proj(attn)
  virtual void attention_out(const ModelConfig& c, const LayerWeights& L, const StepRows& r, const void* attn,
                             void* hidden) = 0;
  // hidden += mlp(norm(hidden))
  virtual void mlp(const ModelConfig& c, const LayerWeights& L, const StepRows& r, void* hidden) = 0;
  // logits [rows, n, V] fp32 (device memory; row first + i of sequence b at (i * n + b) * V) of
  // rows [first, first + rows) of each sequence (0 <= first, first + rows <= T; generation: T - 1
  // and 1; rows * n <= the rows reserve() sized for): final norm + lm_head, one lm_head pass.
  virtual void head(const ModelConfig& c, const ModelWeights& w, const StepRows& r, const void* hidden,
                    int64_t first, int64_t rows, float* logits) = 0;
  // In-place compaction of rows x capacity x row_elems elements of dt (row r: new slot i <-
  // old slot keep[r*keep_stride + i] for i < count[r], i <= keep[..+i] < capacity); keep/count
  // in device memory (the CUDA kernel reads them there; the engine copies its pinned keep slot
  // in first on the compute queue), unchanged until this op is complete.
  virtual void kv_gather(void* buf, DType dt, int64_t rows, int64_t capacity, int64_t row_elems,
                         const int32_t* keep, int64_t keep_stride, const int32_t* count) = 0;

 protected:
  // For implementations: wraps memory they allocated into a Buffer that calls release().
  // Throws (misuse) when host memory is not kHostAlign-aligned.
  Buffer make_buffer(std::byte* p, size_t bytes, MemKind kind, TierCharge charge);
  virtual void release(MemKind kind, std::byte* p, size_t bytes) noexcept = 0;

 private:
  friend class Buffer;
};

// Bytes of scratch the unit ops of a `kind` device need for steps of `rows` rows (sequences x
// rows a sequence) with activations in `act` (what reserve() charges; the planner counts it too).
uint64_t device_scratch_bytes(DeviceKind kind, const ModelConfig& c, DType act, int64_t rows);
// The CUDA device's scratch piece by piece, in bytes, each piece 256-aligned: normed rows (the
// head's rows too), one of two FFN chunks and the Q4 dequantization tile share one allocation
// (CudaDevice::reserve lays it out from this); cuBLAS's workspace is its handle's.
// device_scratch_bytes(kCuda, ...) is total().
struct CudaScratch {
  uint64_t normed = 0, ffn_chunk = 0, dequant = 0, cublas_workspace = 0;
  // MoE, per chunk of rows: router logits and the shared expert's gate (fp32, n_experts + 1 a
  // row); four lists of the rows' choices (experts, weights, then grouped by expert: rows,
  // weights; 4-byte, experts_per_token a row); counts and work (int32, 3 n_experts); an expert's
  // gathered rows and output (act) and the sum over experts (fp32), a hidden row each.
  uint64_t moe_logits = 0, moe_list = 0, moe_counts = 0, moe_x = 0, moe_out = 0, moe_sum = 0;
  uint64_t allocation() const {
    return normed + 2 * ffn_chunk + dequant + moe_logits + 4 * moe_list + moe_counts + moe_x + moe_out + moe_sum;
  }
  uint64_t total() const { return allocation() + cublas_workspace; }
};
inline constexpr uint64_t kCublasWorkspaceBytes = uint64_t(32) << 20;
CudaScratch cuda_scratch(const ModelConfig& c, DType act, int64_t rows);
// The CUDA device's share of it for Q4 weights: the tile that linear layers above the fused
// kernel's rows decode a Q4 weight into (in `act`) before cuBLAS; the largest 2-D weight a unit
// multiplies by, capped at 64 MiB (larger weights go tile by tile).
uint64_t q4_dequant_tile_bytes(const ModelConfig& c, DType act);

}  // namespace flexh2o
