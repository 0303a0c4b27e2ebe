// CudaDevice: memory (cudaMalloc / cudaHostAlloc / in-place registration), streams and pooled
// events, host<->device moves, and the factory. The unit ops are in cuda_device_ops.cpp.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "gpu/detail/cuda_device_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_probe.h"
#include "kernels/cuda/ops.h"

namespace flexh2o::gpu {
namespace {

using Clock = std::chrono::steady_clock;

// A device-queue event carries a pooled CUDA event (returned when the last handle goes);
// a host-queue event only the time (host work is complete when its step records).
struct CudaEvent final : EventState {
  CudaDevice* dev = nullptr;
  cudaEvent_t ev = nullptr;
  Clock::time_point t = Clock::now();
  ~CudaEvent() override {
    if (ev) dev->give_event(ev);
  }
};

const CudaEvent& cuda_event(const flexh2o::Event& e) {
  const auto* ev = dynamic_cast<const CudaEvent*>(e.get());
  FH_CHECK(ev, "CUDA device: an event from another device");
  return *ev;
}

constexpr size_t kChunkBytes = size_t(32) << 20;  // per half of the upload staging buffer

int make_current(int device) {
  FH_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

}  // namespace

std::string cuda_unsupported(const ModelConfig& c, DType compute) {
  if (attention_supported(compute, c.head_dim)) return {};
  return flexh2o::detail::concat("the CUDA attention kernels are built for head_dim 64, 96, 128 and 256, and ", c.name,
                                 " has ", c.head_dim);
}

std::string CudaDevice::kv_unsupported(const ModelConfig& c, DType kv) const {
  if (attention_supported(dt_, kv, c.head_dim)) return {};
  if (kv == DType::Q4 && attention_supported(dt_, c.head_dim))
    return flexh2o::detail::concat("the CUDA attention reads a 4-bit KV cache (--compress-cache) for head_dim 64, 128 ",
                                   "and 256, and ", c.name, " has ", c.head_dim, "; use an f16 cache or --device cpu");
  return cuda_unsupported(c, dt_);
}

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& o) {
  const CudaProbe p = probe_cuda();
  if (!p.available) FH_FAIL("no usable CUDA GPU: ", p.reason, "; use --device cpu");
  FH_CHECK(o.device >= 0 && o.device < p.device_count, "CUDA device ", o.device, " outside [0, ", p.device_count, ")");
  return std::make_unique<CudaDevice>(o);
}

CudaDevice::CudaDevice(const CudaDeviceOptions& o)
    : opts_(o),
      device_(make_current(o.device)),
      dt_(o.compute),
      cublas_(kCublasWorkspaceBytes),
      arena_(o.host_threads > 0 ? o.host_threads : tbb::task_arena::automatic) {
  FH_CHECK(dtype_supported(dt_), "the CUDA device computes in F16 or BF16, not ", dtype_name(dt_));
  cudaDeviceProp prop{};
  FH_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
  host_pointers_ = prop.canUseHostPointerForRegisteredMem != 0;
  size_t free_b = 0, total_b = 0;
  FH_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  name_ = std::string(prop.name) + " (" + std::to_string(total_b >> 20) + " MiB)";
  // cuBLAS's workspace is allocated already (free_b excludes it) and is charged again as part
  // of the compute scratch (cuda_scratch): give it back to the default budget.
  free_b += kCublasWorkspaceBytes;
  // A GPU with no more free than the reserve gets a one-byte budget, so the first placement is
  // refused by name: 0 would mean unlimited.
  budget_default_ = free_b > o.reserve_bytes ? free_b - o.reserve_bytes : 1;
  arena_.initialize();
}

CudaDevice::~CudaDevice() {
  for (const Stream& s : streams_) FH_CUDA_LOG(cudaStreamSynchronize(s.get()));
  if (scratch_) FH_CUDA_LOG(cudaFree(scratch_));
  for (cudaEvent_t e : events_) FH_CUDA_LOG(cudaEventDestroy(e));
  for (const auto& [start, v] : pins_) FH_CUDA_LOG(cudaHostUnregister(reinterpret_cast<void*>(start)));
}

// The current device is per host thread, and the executor runs each queue on a fresh thread
// (current device 0): from there, a kernel or cuBLAS call into a stream of GPU 1, or an event
// created for it, fails. So every entry point that creates or enqueues work binds its thread
// first (a thread-local read when it is bound already).
void CudaDevice::bind_thread() const {
  int current = -1;
  FH_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device_) FH_CUDA_CHECK(cudaSetDevice(device_));
}

cudaStream_t CudaDevice::stream(Queue q) const {
  FH_CHECK(device_queue(q), "CUDA device: queue ", queue_name(q), " is a host queue, not a stream");
  bind_thread();
  return streams_[size_t(q)].get();
}

// ---- memory ----------------------------------------------------------------------------

Status CudaDevice::allocate(MemKind kind, size_t bytes, TierBudget& budget, const std::string& what, Buffer* out) {
  TierCharge charge;
  if (Status s = TierCharge::reserve(budget, bytes, what, &charge); !s.ok()) return s;
  bind_thread();
  void* p = nullptr;
  const size_t n = std::max<size_t>(bytes, 1);
  cudaError_t e = cudaSuccess;
  PinnedBuffer pinned;  // kPinned: aligned to kHostAlign (cudaHostAlloc's own pointer need not be)
  switch (kind) {
    case MemKind::kDevice: e = cudaMalloc(&p, n); break;
    case MemKind::kPinned:
      if (PinnedBuffer::create(n, &pinned, kHostAlign).ok()) p = pinned.data();
      break;
    case MemKind::kPageable: p = std::aligned_alloc(kHostAlign, align_up(n, kHostAlign)); break;
  }
  if (e == cudaErrorMemoryAllocation || (!p && e == cudaSuccess)) {
    (void)cudaGetLastError();
    return Status(StatusCode::kOutOfBudget,
                  flexh2o::detail::concat(kind == MemKind::kDevice ? "the GPU" : "the host", " cannot allocate ",
                                          bytes, " bytes for ", what, " (out of memory)"));
  }
  FH_CUDA_CHECK(e);
  if (pinned.data()) {
    std::lock_guard<std::mutex> lock(mu_);
    host_allocs_.emplace(static_cast<std::byte*>(p), std::move(pinned));
  }
  *out = make_buffer(static_cast<std::byte*>(p), bytes, kind, std::move(charge));
  return Status::Ok();
}

void CudaDevice::release(MemKind kind, std::byte* p, size_t) noexcept {
  switch (kind) {
    case MemKind::kDevice: FH_CUDA_LOG(cudaFree(p)); break;
    case MemKind::kPinned: {
      PinnedBuffer freed;  // frees it once mu_ is released
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = host_allocs_.find(p); it != host_allocs_.end()) {
        freed = std::move(it->second);
        host_allocs_.erase(it);
      }
      break;
    }
    case MemKind::kPageable: std::free(p); break;
  }
}

struct Pinned final : PinState {
  CudaDevice* dev = nullptr;
  std::vector<uintptr_t> chunks;  // registry entries this pin holds a reference to
  ~Pinned() override {
    if (!chunks.empty()) dev->unpin(chunks);
  }
};

// Registers the pages of [p, p + bytes) not registered yet (a page shared with an earlier
// tensor of the same file is already), read-only: a checkpoint's mapping stays read-only and is
// not copied. Returns null (nothing registered) when the driver refuses.
HostPin CudaDevice::pin_in_place(const void* p, size_t bytes) {
  if (!p || !bytes) return nullptr;
  bind_thread();
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t a = uintptr_t(p) / page * page, b = (uintptr_t(p) + bytes + page - 1) / page * page;
  // The Pinned gets its references only once they are taken (last, under mu_): its destructor
  // unpins, which locks mu_, so it holds none while a throw (bad_alloc) can still leave here.
  auto pin = std::make_unique<Pinned>();
  pin->dev = this;
  std::vector<uintptr_t> chunks;  // registry entries the pin will hold a reference to
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uintptr_t, uintptr_t>> gaps;
  uintptr_t at = a;
  auto it = pins_.upper_bound(a);
  if (it != pins_.begin() && std::prev(it)->second.first > a) --it;
  for (; it != pins_.end() && it->first < b; ++it) {
    if (it->first > at) gaps.push_back({at, it->first});
    chunks.push_back(it->first);
    at = std::max(at, it->second.first);
  }
  if (at < b) gaps.push_back({at, b});
  std::vector<uintptr_t> added;
  for (auto [s, e] : gaps) {
    // Mapped and portable explicitly: only cudaHostRegisterDefault (flags 0) is documented to
    // map the range on a UVA system, and the row gather reads it from a kernel.
    const cudaError_t err = cudaHostRegister(reinterpret_cast<void*>(s), e - s,
                                             cudaHostRegisterMapped | cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      for (uintptr_t x : added) {
        FH_CUDA_LOG(cudaHostUnregister(reinterpret_cast<void*>(x)));
        pins_.erase(x);
      }
      return nullptr;  // `pin` holds no chunk: dropping it unpins nothing
    }
    pins_[s] = {e, 0};
    added.push_back(s);
    chunks.push_back(s);
  }
  for (uintptr_t x : chunks) ++pins_[x].second;
  pin->chunks = std::move(chunks);  // noexcept: from here the pin owns the references
  return pin;
}

void CudaDevice::unpin(const std::vector<uintptr_t>& chunks) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (uintptr_t x : chunks) {
    auto it = pins_.find(x);
    if (it == pins_.end() || --it->second.second > 0) continue;
    FH_CUDA_LOG(cudaHostUnregister(reinterpret_cast<void*>(x)));
    pins_.erase(it);
  }
}

// Converted on the host into a double-buffered pinned staging area, copied chunk by chunk; a
// Q4 tensor's records are copied as they are.
void CudaDevice::upload(void* dst, const TensorView& src) {
  // A Q4 tensor (already compressed, weight_dtype(Q4) == Q4) moves as bytes.
  const bool raw = src.dtype == DType::Q4 || src.dtype == dt_;
  const size_t si = src.dtype == DType::Q4 ? 1 : dtype_size(src.dtype), di = raw ? si : dtype_size(dt_);
  const int64_t per_chunk = int64_t(kChunkBytes / std::max(si, di));
  const int64_t n = src.dtype == DType::Q4 ? int64_t(src.nbytes()) : src.numel();
  // Each half holds one chunk, or the whole tensor when smaller: most tensors (biases, norms)
  // are kilobytes, and a model's first small ones need not pin 64 MiB.
  const size_t half_bytes = size_t(std::min(per_chunk, n)) * std::max(si, di);
  std::lock_guard<std::mutex> lock(upload_mu_);
  if (upload_stage_.size() < 2 * half_bytes) {
    const size_t grown = std::min(std::max(2 * half_bytes, 2 * upload_stage_.size()), 2 * kChunkBytes);
    upload_stage_ = PinnedBuffer();  // the old one goes first: nothing is in flight from it
    PinnedBuffer::create(grown, &upload_stage_).throw_if_error();
  }
  const PinnedBuffer& stage = upload_stage_;
  std::array<cudaEvent_t, 2> done{take_event(), take_event()};
  // On every exit, a throw too: the copies in flight end before `stage` is freed, and the
  // events go back to the pool.
  struct Finish {
    CudaDevice& d;
    cudaStream_t st;
    std::array<cudaEvent_t, 2>& ev;
    ~Finish() {
      FH_CUDA_LOG(cudaStreamSynchronize(st));
      d.give_event(ev[0]);
      d.give_event(ev[1]);
    }
  };
  std::array<bool, 2> in_flight{false, false};
  std::vector<float> tmp;
  cudaStream_t st = stream(Queue::kHostToDevice);
  const Finish finish{*this, st, done};
  int half = 0;
  for (int64_t off = 0; off < n; off += per_chunk) {
    const int64_t m = std::min(per_chunk, n - off);
    if (in_flight[size_t(half)]) FH_CUDA_CHECK(cudaEventSynchronize(done[size_t(half)]));
    std::byte* host = static_cast<std::byte*>(stage.data()) + size_t(half) * half_bytes;
    const std::byte* s = static_cast<const std::byte*>(src.data) + size_t(off) * si;
    if (raw) {
      std::memcpy(host, s, size_t(m) * di);
    } else {
      tmp.resize(size_t(m));
      cpu::to_f32(src.dtype, s, m, tmp.data());
      cpu::from_f32(tmp.data(), m, dt_, host);
    }
    FH_CUDA_CHECK(cudaMemcpyAsync(static_cast<std::byte*>(dst) + size_t(off) * di, host, size_t(m) * di,
                                  cudaMemcpyHostToDevice, st));
    FH_CUDA_CHECK(cudaEventRecord(done[size_t(half)], st));
    in_flight[size_t(half)] = true;
    half ^= 1;
  }
  FH_CUDA_CHECK(cudaStreamSynchronize(st));
}

// ---- events ------------------------------------------------------------------------------

cudaEvent_t CudaDevice::take_event() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!events_.empty()) {
      cudaEvent_t e = events_.back();
      events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  bind_thread();  // an event belongs to the device current where it is created
  // Blocking sync: the host-side queues (disk, host attention) wait on these events from their
  // own threads, and under cudaDeviceScheduleAuto a wait would spin a core that host attention
  // needs. A blocked wait wakes some microseconds later, once per dependency.
  FH_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventBlockingSync));
  return e;
}

void CudaDevice::give_event(cudaEvent_t e) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(e);
}

flexh2o::Event CudaDevice::record(Queue q) {
  auto e = std::make_shared<CudaEvent>();
  e->dev = this;
  if (device_queue(q)) {
    e->ev = take_event();
    FH_CUDA_CHECK(cudaEventRecord(e->ev, stream(q)));
  }
  return e;
}

void CudaDevice::wait(Queue q, const flexh2o::Event& e) {
  const CudaEvent& ev = cuda_event(e);
  if (!ev.ev) return;  // host work: complete when recorded
  if (device_queue(q)) FH_CUDA_CHECK(cudaStreamWaitEvent(stream(q), ev.ev, 0));
  else FH_CUDA_CHECK(cudaEventSynchronize(ev.ev));
}

void CudaDevice::host_wait(const flexh2o::Event& e) {
  const CudaEvent& ev = cuda_event(e);
  if (ev.ev) FH_CUDA_CHECK(cudaEventSynchronize(ev.ev));
}

void CudaDevice::synchronize() {
  for (const Stream& s : streams_) s.synchronize();
}

double CudaDevice::seconds_between(const flexh2o::Event& from, const flexh2o::Event& to) {
  const CudaEvent& a = cuda_event(from);
  const CudaEvent& b = cuda_event(to);
  if (a.ev && b.ev) {
    float ms = 0;
    FH_CUDA_CHECK(cudaEventElapsedTime(&ms, a.ev, b.ev));
    return 1e-3 * double(ms);
  }
  return std::chrono::duration<double>(b.t - a.t).count();
}

// ---- moves -------------------------------------------------------------------------------

std::vector<size_t> CudaDevice::pin_cuts(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return registration_cuts(pins_, uintptr_t(p), bytes);
}

// Tensors pinned in place share pages with their neighbours, so one tensor can lie across two
// registrations (pin_in_place registers only what is not registered yet): such a copy goes in
// pieces, one per registration (copy_pieces.h).
void CudaDevice::copy(Queue q, void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  size_t at = 0;
  for (size_t end : piece_ends(pin_cuts(src, bytes), pin_cuts(dst, bytes), bytes)) {
    FH_CUDA_CHECK(cudaMemcpyAsync(static_cast<std::byte*>(dst) + at, static_cast<const std::byte*>(src) + at, end - at,
                                  cudaMemcpyDefault, stream(q)));
    at = end;
  }
}

void CudaDevice::copy_2d(Queue q, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height) {
  if (!width || !height) return;
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  for (const RowPiece& pc : plan_2d(pin_cuts(src, spitch * (height - 1) + width), spitch,
                                    pin_cuts(dst, dpitch * (height - 1) + width), dpitch, width, height)) {
    if (pc.split_row) copy(q, d + pc.row * dpitch, s + pc.row * spitch, width);
    else FH_CUDA_CHECK(cudaMemcpy2DAsync(d + pc.row * dpitch, dpitch, s + pc.row * spitch, spitch, width, pc.rows,
                                         cudaMemcpyDefault, stream(q)));
  }
}

void CudaDevice::gather_rows(Queue q, void* dst, const void* table, int64_t table_rows, size_t row_bytes,
                             const int32_t* ids, const int32_t* host_ids, int64_t n) {
  if (n <= 0) return;
  check_gather_ids(host_ids, n, table_rows);
  cudaPointerAttributes at{};
  const bool visible = cudaPointerGetAttributes(&at, table) == cudaSuccess && at.type != cudaMemoryTypeUnregistered;
  (void)cudaGetLastError();
  // The kernel reads the whole table through the device address of its first registration: right
  // for device memory, for one registration, or where the device uses host addresses.
  if (visible && (at.type != cudaMemoryTypeHost || host_pointers_ ||
                  pin_cuts(table, size_t(table_rows) * row_bytes).empty())) {
    gpu::gather_rows(ids, n, table, table_rows, int64_t(row_bytes), dst, stream(q));
    return;
  }
  for (int64_t i = 0; i < n; ++i)  // pageable host memory, or a table over several registrations: a copy per row
    copy(q, static_cast<std::byte*>(dst) + size_t(i) * row_bytes,
         static_cast<const std::byte*>(table) + size_t(host_ids[i]) * row_bytes, row_bytes);
}

void CudaDevice::fill_zero(Queue q, void* dst, size_t bytes) {
  if (bytes) FH_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream(q)));
}

}  // namespace flexh2o::gpu
