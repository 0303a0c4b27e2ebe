// Private: the CudaDevice class shared by cuda_device.cpp (memory, events, moves) and
// cuda_device_ops.cpp (unit ops). CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>
#include <tbb/task_arena.h>

#include <array>
#include <chrono>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "gpu/copy_pieces.h"
#include "gpu/cuda_device.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/resources.h"

namespace flexh2o::gpu {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const CudaDeviceOptions& o);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }
  std::string kv_unsupported(const ModelConfig& c, DType kv) const override;
  DType act_dtype() const override { return dt_; }
  // Q4 weights stay compressed on the device (the ops decode them); the rest are in dt_.
  DType weight_dtype(DType checkpoint) const override { return checkpoint == DType::Q4 ? DType::Q4 : dt_; }
  uint64_t memory_bytes() const override { return budget_default_; }

  Status allocate(MemKind kind, size_t bytes, TierBudget& budget, const std::string& what, Buffer* out) override;
  HostPin pin_in_place(const void* p, size_t bytes) override;
  void upload(void* dst, const TensorView& src) override;
  TierCharge reserve(const ModelConfig& c, int64_t rows, int64_t seqs, TierBudget& budget) override;

  flexh2o::Event record(Queue q) override;
  void wait(Queue q, const flexh2o::Event& e) override;
  void host_wait(const flexh2o::Event& e) override;
  void synchronize() override;
  double seconds_between(const flexh2o::Event& from, const flexh2o::Event& to) override;
  void host_run(const std::function<void()>& f) override { arena_.execute(f); }

  void copy(Queue q, void* dst, const void* src, size_t bytes) override;
  void copy_2d(Queue q, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
               size_t height) override;
  void gather_rows(Queue q, void* dst, const void* table, int64_t table_rows, size_t row_bytes, const int32_t* ids,
                   const int32_t* host_ids, int64_t n) override;
  void fill_zero(Queue q, void* dst, size_t bytes) override;

  void embed(const ModelConfig& c, const ModelWeights& w, const StepRows& r, void* hidden) override;
  void attention_in(const ModelConfig& c, const LayerWeights& L, const StepRows& r, const void* hidden, void* q,
                    void* k, void* v) override;
  void attend(const ModelConfig& c, const StepRows& r, const void* q, const void* k, const void* v,
              std::span<const KvSegment> segs, void* attn) override;
  void attention_out(const ModelConfig& c, const LayerWeights& L, const StepRows& r, const void* attn,
                     void* hidden) override;
  void mlp(const ModelConfig& c, const LayerWeights& L, const StepRows& r, void* hidden) override;
  void head(const ModelConfig& c, const ModelWeights& w, const StepRows& r, const void* hidden, int64_t first,
            int64_t rows, float* logits) override;
  void kv_gather(void* buf, DType dt, int64_t rows, int64_t capacity, int64_t row_elems, const int32_t* keep,
                 int64_t keep_stride, const int32_t* count) override;

  // Event pool (cuda_device.cpp).
  cudaEvent_t take_event();
  void give_event(cudaEvent_t e) noexcept;

 protected:
  void release(MemKind kind, std::byte* p, size_t bytes) noexcept override;

 private:
  friend struct Pinned;
  // Offsets in (0, bytes), ascending, where [p, p + bytes) crosses from one registered chunk
  // of pins_ into another or out of one: a copy must be split there, since the driver refuses
  // one that spans two registrations (cudaErrorInvalidValue). Empty for unregistered memory.
  std::vector<size_t> pin_cuts(const void* p, size_t bytes);
  static bool device_queue(Queue q) { return q == Queue::kCompute || q == Queue::kHostToDevice || q == Queue::kDeviceToHost; }
  // Makes this device current on the calling thread (see bind_thread in cuda_device.cpp).
  void bind_thread() const;
  cudaStream_t stream(Queue q) const;
  void unpin(const std::vector<uintptr_t>& chunks) noexcept;
  // y = ep(x w^T + b) on the compute stream; a Q4 weight goes through linear_q4 and dq_.
  void linear_w(const TensorView& w, const void* x, int64_t M, int64_t K, int64_t N, const TensorView& b, void* y,
                Epilogue ep);
  // y (fp32) = x w^T on the compute stream; a Q4 weight goes through linear_q4_f32out and dq_.
  void linear_f32out_w(const TensorView& w, const void* x, int64_t M, int64_t K, int64_t N, float* y);
  // out[n, H] = an expert's SwiGLU of width F over x[n, H] (through ffn_a_ / ffn_b_).
  void expert_ffn(const ExpertWeights& w, const void* x, int64_t n, int64_t H, int64_t F, void* out);
  // A MoE MLP over m rows of normed_, added into h (m <= kMlpChunkRows).
  void moe(const ModelConfig& c, const LayerWeights& L, int64_t m, void* h);

  CudaDeviceOptions opts_;
  int device_;  // made current before anything else is created
  DType dt_;
  // The GPU reads registered host memory at its host address (cudaDevAttrCanUseHostPointerForRegisteredMem):
  // a kernel may then read a table that spans several registrations.
  bool host_pointers_ = false;
  std::string name_;
  uint64_t budget_default_ = 0;
  std::array<Stream, 3> streams_;
  CublasHandle cublas_;
  tbb::task_arena arena_;
  // Scratch of the unit ops (reserve()): normed rows, two FFN chunks, last rows, and the tile
  // Q4 weights are decoded into for cuBLAS (dq_bytes_ of it), and a MoE's (CudaScratch).
  void *scratch_ = nullptr, *normed_ = nullptr, *ffn_a_ = nullptr, *ffn_b_ = nullptr;
  void* dq_ = nullptr;
  float *moe_logits_ = nullptr, *moe_weights_ = nullptr, *moe_row_w_ = nullptr, *moe_sum_ = nullptr;
  int32_t *moe_experts_ = nullptr, *moe_rows_ = nullptr, *moe_counts_ = nullptr;
  void *moe_x_ = nullptr, *moe_out_ = nullptr;
  std::vector<int32_t> moe_host_counts_;  // the group sizes, read back (compute queue's thread only)
  size_t dq_bytes_ = 0;
  int64_t rows_ = 0, seqs_ = 0;
  // upload()'s double-buffered pinned staging, kept across calls (pinning it anew for each of
  // a model's hundreds of tensors costs seconds): grown geometrically to at most two chunks.
  // upload_mu_ serialises uploads, which share it.
  std::mutex upload_mu_;
  PinnedBuffer upload_stage_;
  std::mutex mu_;                    // event pool, pin registry and host_allocs_
  std::vector<cudaEvent_t> events_;  // free timing events
  // Page-locked host ranges registered in place: start -> (end, references).
  PinRegistry pins_;
  // allocate()'s pinned host memory: Buffer::data() -> its owner (release() frees it).
  std::unordered_map<const std::byte*, PinnedBuffer> host_allocs_;
};

}  // namespace flexh2o::gpu
