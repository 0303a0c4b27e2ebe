// resources.h and cuda_check.h: the count-only arena, the check macro and the dispatch
// tables run on the CPU; real allocations, streams, events and pinned memory need a GPU.
#include <cublas_v2.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/ops.h"
#include "util.h"

namespace flexh2o::gpu::test {
namespace {

TEST(CudaCheck, ThrowsWithExpressionNameAndLocation) {
  try {
    FH_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cudaErrorInvalidValue"), std::string::npos) << m;
    EXPECT_NE(m.find("failed"), std::string::npos) << m;
    EXPECT_NE(m.find("resources_test.cpp:"), std::string::npos) << m;
  }
  try {
    FH_CUDA_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(FH_CUDA_CHECK(cudaSuccess));
  EXPECT_NO_THROW(FH_CUDA_CHECK(CUBLAS_STATUS_SUCCESS));
  EXPECT_NO_THROW(FH_CUDA_LOG(cudaErrorInvalidValue));  // logs, never throws
}

TEST(DeviceArena, CountOnlySizesWithAlignmentAndPeak) {
  DeviceArena a = DeviceArena::count_only();
  EXPECT_TRUE(a.counting());
  void* p = reinterpret_cast<void*>(1);
  ASSERT_TRUE(a.allocate(10, &p).ok());
  EXPECT_EQ(p, nullptr);
  ASSERT_TRUE(a.allocate(1, &p, 512).ok());
  EXPECT_EQ(a.used(), 513u);
  const size_t mark = a.offset();
  ASSERT_TRUE(a.allocate(100, &p).ok());
  EXPECT_EQ(a.used(), 768u + 100u);
  a.rewind(mark);
  EXPECT_EQ(a.used(), 513u);
  EXPECT_EQ(a.peak(), 868u);
  a.reset();
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.peak(), 868u);
  EXPECT_THROW(a.rewind(1), Error);
  EXPECT_THROW((void)a.allocate(1, &p, 3), Error);
}

// A real slab's base is only 256-byte aligned (cudaMalloc's guarantee): alignment is of the
// address, so a 1024-aligned block may start 768 bytes in.
TEST(DeviceArena, AlignsAddressesNotOffsets) {
  EXPECT_EQ(detail::aligned_offset(0x100, 0, 1024), 768u);
  EXPECT_EQ(detail::aligned_offset(0x100, 768, 1024), 768u);
  EXPECT_EQ(detail::aligned_offset(0x100, 769, 1024), 1792u);
  EXPECT_EQ(detail::aligned_offset(0x400, 3, 1024), 1024u);
  EXPECT_EQ(detail::aligned_offset(0x400, 3, 1), 3u);
  EXPECT_EQ(detail::aligned_offset(0, 513, 256), 768u);  // count-only: offsets, as from base 0
  EXPECT_EQ(detail::aligned_offset(UINTPTR_MAX - 10, 5, 256), SIZE_MAX);
  EXPECT_EQ(detail::aligned_offset(0, SIZE_MAX - 2, 256), SIZE_MAX);
  DeviceArena a = DeviceArena::count_only(SIZE_MAX);
  void* p = nullptr;
  ASSERT_TRUE(a.allocate(SIZE_MAX - 2, &p, 1).ok());
  EXPECT_EQ(a.allocate(1, &p, 256).code(), StatusCode::kOutOfBudget);  // the aligned start overflows
}

TEST(DeviceArena, CountOnlyBudgetFailsWithStatus) {
  DeviceArena a = DeviceArena::count_only(1000);
  void* p = nullptr;
  ASSERT_TRUE(a.allocate(600, &p).ok());
  Status s = a.allocate(600, &p);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfBudget);
  EXPECT_EQ(a.used(), 600u);  // a failed allocation changes nothing
  EXPECT_FALSE(a.allocate(SIZE_MAX, &p).ok());
  ASSERT_TRUE(a.allocate(144, &p).ok());  // 768 + 144 = 912
  DeviceArena b = std::move(a);
  EXPECT_EQ(b.used(), 912u);
  EXPECT_EQ(a.used(), 0u);
}

TEST(Dispatch, SupportedListsAreExplicit) {
  EXPECT_TRUE(dtype_supported(DType::F16));
  EXPECT_TRUE(dtype_supported(DType::BF16));
  EXPECT_FALSE(dtype_supported(DType::F32));
  for (DType dt : {DType::F16, DType::BF16}) {
    EXPECT_TRUE(attention_supported(dt, 64));
    EXPECT_TRUE(attention_supported(dt, 96));
    EXPECT_TRUE(attention_supported(dt, 128));
    EXPECT_TRUE(attention_supported(dt, 256));
    for (int64_t hd : {1, 32, 80, 95, 127, 512}) EXPECT_FALSE(attention_supported(dt, hd)) << hd;
  }
  EXPECT_FALSE(attention_supported(DType::F32, 128));
  AttentionArgs a;
  a.dtype = DType::F16;
  a.batch = a.tq = a.n_heads = a.kv_heads = 1;
  a.head_dim = 80;
  a.capacity = 4;
  try {
    attention(a, nullptr);  // rejected before anything touches CUDA
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 80"), std::string::npos) << e.what();
  }
}

class ResourcesGpu : public GpuTest {};

TEST_F(ResourcesGpu, ArenaAllocatesAlignedUntilBudget) {
  DeviceArena a;
  ASSERT_TRUE(DeviceArena::create(1 << 20, &a).ok());
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_TRUE(a.allocate(3, &p).ok());
  ASSERT_TRUE(a.allocate(5, &q, 1024).ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % 1024, 0u);
  EXPECT_GE(static_cast<char*>(q) - static_cast<char*>(p), 3);  // the base may be only 256-aligned
  EXPECT_LE(static_cast<char*>(q) - static_cast<char*>(p), 1024);
  FH_CUDA_CHECK(cudaMemsetAsync(q, 0, 5, stream()));
  EXPECT_EQ(a.allocate(1 << 20, &p).code(), StatusCode::kOutOfBudget);
  DeviceArena too_big;
  Status s = DeviceArena::create(size_t(1) << 50, &too_big);  // 1 PiB
  EXPECT_EQ(s.code(), StatusCode::kOutOfBudget) << s.message();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the failure left no sticky error behind
  sync();
}

TEST_F(ResourcesGpu, PinnedStreamEventRoundTrip) {
  PinnedBuffer pin;
  ASSERT_TRUE(PinnedBuffer::create(4096, &pin).ok());
  ASSERT_NE(pin.data(), nullptr);
  auto* h = static_cast<uint8_t*>(pin.data());
  for (int i = 0; i < 4096; ++i) h[i] = uint8_t(i * 7);
  uint8_t* d = alloc<uint8_t>(4096);
  Event start, end;
  start.record(stream());
  FH_CUDA_CHECK(cudaMemcpyAsync(d, h, 4096, cudaMemcpyHostToDevice, stream()));
  FH_CUDA_CHECK(cudaMemsetAsync(h, 0, 0, stream()));
  end.record(stream());
  end.synchronize();
  EXPECT_GE(Event::elapsed_ms(start, end), 0.f);
  auto back = download_raw(d, 4096);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(back[size_t(i)], uint8_t(i * 7));
  PinnedBuffer moved = std::move(pin);
  EXPECT_EQ(pin.data(), nullptr);
  EXPECT_EQ(moved.size(), 4096u);
  Stream s2 = std::move(*stream_);
  EXPECT_EQ(stream_->get(), nullptr);
  *stream_ = std::move(s2);
}

// cudaHostAlloc's own pointers to small allocations can sit at sub-page offsets (0x...4800 on
// an H200), which O_DIRECT refuses: an `align` is of data(), kept through a move.
TEST_F(ResourcesGpu, PinnedBufferDataIsAlignedAsAsked) {
  std::vector<PinnedBuffer> pins;
  for (size_t bytes : {1, 100, 2048, 4096, 5000, 16384, 1 << 20}) {
    for (int i = 0; i < 4; ++i) {
      PinnedBuffer pin;
      ASSERT_TRUE(PinnedBuffer::create(bytes, &pin, 4096).ok());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(pin.data()) % 4096, 0u) << bytes << " bytes";
      EXPECT_EQ(pin.size(), bytes);
      std::memset(pin.data(), 0xab, bytes);  // all `bytes` are ours
      pins.push_back(std::move(pin));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(pins.back().data()) % 4096, 0u);
    }
  }
  PinnedBuffer bad;
  EXPECT_THROW((void)PinnedBuffer::create(64, &bad, 3000), Error);  // not a power of two
}

TEST_F(ResourcesGpu, CublasHandleBindsToStream) {
  CublasHandle h;
  EXPECT_NE(h.get(), nullptr);
  h.bind(stream());
  CublasHandle h2 = std::move(h);
  EXPECT_EQ(h.get(), nullptr);
  EXPECT_THROW(h.bind(stream()), Error);
  h2.bind(stream());
  void* x = alloc<uint16_t>(4);
  EXPECT_THROW(linear(h2, DType::F32, x, 1, 2, x, 2, nullptr, alloc<uint16_t>(4), Epilogue::kStore, stream()),
               Error);
}

}  // namespace
}  // namespace flexh2o::gpu::test
