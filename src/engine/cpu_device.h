// CpuDevice: the reference Device. Its "device memory" is host memory charged to the device
// budget (--gpu-mem), copies are real copies, and every op runs synchronously on the calling
// queue thread inside one bounded oneTBB arena (no global thread pool). Two test modes:
//  * act_dtype F16/BF16: activations are kept in that dtype between ops, so every value that
//    crosses a link (hidden states, q/k/v, attention rows) is rounded exactly where the CUDA
//    device rounds it;
//  * check_hazards: every buffer access is checked against the events its queue waited on
//    (hazard.h) and ops start after a random delay; a missing dependency throws.
// Owned by the caller (main / tests) and passed down. Thread-safe as the Device contract says.
#pragma once

#include <tbb/task_arena.h>

#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/layer_compute.h"

namespace flexh2o {

class HazardTracker;

struct CpuDeviceOptions {
  int threads = 0;               // <= 0: all hardware threads
  DType act_dtype = DType::F32;  // F32, or F16/BF16 to round activations like the CUDA device
  bool check_hazards = false;
  int max_delay_us = 0;          // with check_hazards: each op first sleeps up to this long
  uint64_t seed = 1;
};

class CpuDevice : public Device {
 public:
  explicit CpuDevice(int threads = 0);
  explicit CpuDevice(const CpuDeviceOptions& o);
  ~CpuDevice() override;

  int threads() const { return arena_.max_concurrency(); }
  // Runs f inside the device's arena (blocking). Thread-safe.
  template <typename F>
  decltype(auto) run(F&& f) {
    return arena_.execute(std::forward<F>(f));
  }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override;
  DType act_dtype() const override { return opts_.act_dtype; }
  DType weight_dtype(DType checkpoint) const override { return checkpoint; }
  uint64_t memory_bytes() const override { return 0; }

  Status allocate(MemKind kind, size_t bytes, TierBudget& budget, const std::string& what, Buffer* out) override;
  void upload(void* dst, const TensorView& src) override;
  TierCharge reserve(const ModelConfig& c, int64_t rows, int64_t seqs, TierBudget& budget) override;

  Event record(Queue q) override;
  void wait(Queue q, const Event& e) override;
  void host_wait(const Event& e) override;
  void synchronize() override;
  double seconds_between(const Event& from, const Event& to) override;
  void begin_schedule() override;
  void host_access(int agent, const void* p, size_t bytes, bool write) override;
  bool checking() const override { return hazards_ != nullptr; }
  void annotate(int agent, std::string label) override;
  // In the device's arena, isolated: while the host queue's parallel work (host attention, KV
  // decisions) waits, its thread takes none of the compute queue's tasks, which would hold it
  // long after its own work is done.
  void host_run(const std::function<void()>& f) override;

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

 protected:
  void release(MemKind kind, std::byte* p, size_t bytes) noexcept override;

 private:
  void enter(int agent);  // hazard mode: the random delay
  void touch(int agent, const void* p, size_t bytes, bool write);
  void touch_weights(const LayerWeights& L);  // every tensor the op may read (compute queue)
  void touch_weights(const ModelWeights& w);
  // Activation rows in fp32: the buffer itself (act F32) or a converted copy in `tmp`.
  const float* f32_in(const void* p, int64_t n, std::vector<float>& tmp);
  float* f32_out(void* p, int64_t n, std::vector<float>& tmp);                // fp32 view to write
  void f32_done(const float* f, int64_t n, void* p);                          // write back if converted
  StepShape shape(const StepRows& r) const { return {r.n, r.T, r.positions, r.seq_keys}; }

  CpuDeviceOptions opts_;
  tbb::task_arena arena_;
  LayerCompute compute_;  // compute queue only
  std::vector<float> t_hidden_, t_q_, t_k_, t_v_, t_attn_;
  std::unique_ptr<HazardTracker> hazards_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
};

}  // namespace flexh2o
