// The Device memory contract (engine/device.h): host memory starts at a multiple of kHostAlign,
// since the engine does O_DIRECT disk I/O on it (the KV cache's disk staging). The CPU device
// honours it; a device that does not (the CUDA device did, with cudaHostAlloc's 2 KiB-aligned
// small allocations, and failed only at its first KV write to disk) is refused at allocation.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "engine/cpu_device.h"
#include "engine/device.h"

namespace flexh2o {
namespace {

TEST(DeviceContract, CpuDeviceHostMemoryIsIoAligned) {
  CpuDevice dev{1};
  TierBudget budget(Tier::kHost, 0);
  std::vector<Buffer> keep;
  for (MemKind kind : {MemKind::kDevice, MemKind::kPinned, MemKind::kPageable})
    for (size_t bytes : {size_t(1), size_t(100), size_t(2048), size_t(4097), size_t(1) << 20}) {
      Buffer b;
      ASSERT_TRUE(dev.allocate(kind, bytes, budget, "t", &b).ok());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kHostAlign, 0u) << int(kind) << " " << bytes;
      keep.push_back(std::move(b));
    }
}

// Host memory 2 KiB into a page, like the CUDA device's pinned buffers were; device memory
// too (it has no alignment contract). Only allocate() and release() are real.
class MisalignedDevice final : public Device {
 public:
  int released = 0;
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "misaligned test device"; }
  DType act_dtype() const override { return DType::F32; }
  DType weight_dtype(DType checkpoint) const override { return checkpoint; }
  uint64_t memory_bytes() const override { return 0; }
  Status allocate(MemKind kind, size_t bytes, TierBudget& budget, const std::string& what, Buffer* out) override {
    TierCharge charge;
    if (Status s = TierCharge::reserve(budget, bytes, what, &charge); !s.ok()) return s;
    auto* base = static_cast<std::byte*>(std::aligned_alloc(4096, align_up(bytes + 2048, 4096)));
    *out = make_buffer(base + 2048, bytes, kind, std::move(charge));
    return Status::Ok();
  }
  void upload(void*, const TensorView&) override { FH_FAIL("unused"); }
  TierCharge reserve(const ModelConfig&, int64_t, int64_t, TierBudget&) override { FH_FAIL("unused"); }
  Event record(Queue) override { FH_FAIL("unused"); }
  void wait(Queue, const Event&) override { FH_FAIL("unused"); }
  void host_wait(const Event&) override { FH_FAIL("unused"); }
  void synchronize() override {}
  double seconds_between(const Event&, const Event&) override { FH_FAIL("unused"); }
  void copy(Queue, void*, const void*, size_t) override { FH_FAIL("unused"); }
  void copy_2d(Queue, void*, size_t, const void*, size_t, size_t, size_t) override { FH_FAIL("unused"); }
  void gather_rows(Queue, void*, const void*, int64_t, size_t, const int32_t*, const int32_t*, int64_t) override {
    FH_FAIL("unused");
  }
  void fill_zero(Queue, void*, size_t) override { FH_FAIL("unused"); }
  void embed(const ModelConfig&, const ModelWeights&, const StepRows&, void*) override { FH_FAIL("unused"); }
  void attention_in(const ModelConfig&, const LayerWeights&, const StepRows&, const void*, void*, void*,
                    void*) override {
    FH_FAIL("unused");
  }
  void attend(const ModelConfig&, const StepRows&, const void*, const void*, const void*, std::span<const KvSegment>,
              void*) override {
    FH_FAIL("unused");
  }
  void attention_out(const ModelConfig&, const LayerWeights&, const StepRows&, const void*, void*) override {
    FH_FAIL("unused");
  }
  void mlp(const ModelConfig&, const LayerWeights&, const StepRows&, void*) override { FH_FAIL("unused"); }
  void head(const ModelConfig&, const ModelWeights&, const StepRows&, const void*, int64_t, int64_t,
            float*) override {
    FH_FAIL("unused");
  }
  void kv_gather(void*, DType, int64_t, int64_t, int64_t, const int32_t*, int64_t, const int32_t*) override {
    FH_FAIL("unused");
  }

 protected:
  void release(MemKind, std::byte* p, size_t) noexcept override {
    ++released;
    std::free(p - 2048);
  }
};

TEST(DeviceContract, HostMemoryNotIoAlignedIsRefusedAtAllocation) {
  MisalignedDevice dev;
  TierBudget budget(Tier::kHost, 0);
  {
    Buffer b;
    ASSERT_TRUE(dev.allocate(MemKind::kDevice, 4096, budget, "device rows", &b).ok());  // no contract
  }
  EXPECT_EQ(dev.released, 1);
  for (MemKind kind : {MemKind::kPinned, MemKind::kPageable}) {
    Buffer b;
    try {
      (void)dev.allocate(kind, 16384, budget, "KV disk staging", &b);
      FAIL() << "a host buffer 2 KiB into a page was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("misaligned test device"), std::string::npos) << msg;
      EXPECT_NE(msg.find("4096-byte aligned"), std::string::npos) << msg;
    }
    EXPECT_FALSE(b);
  }
  EXPECT_EQ(dev.released, 3);  // the refused memory is not leaked
  EXPECT_EQ(budget.used(), 0u);
}

}  // namespace
}  // namespace flexh2o
