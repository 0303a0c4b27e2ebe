// CpuDevice: host-memory buffers, synchronous queue ops, the unit ops on LayerCompute, and the
// hazard-checking and activation-rounding modes.
#include "engine/cpu_device.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "engine/hazard.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace flexh2o {
namespace {

using Clock = std::chrono::steady_clock;

struct CpuEvent final : EventState {
  Clock::time_point t = Clock::now();
  HazardTracker::Clock vc{};
};

const CpuEvent& cpu_event(const Event& e) {
  const auto* ev = dynamic_cast<const CpuEvent*>(e.get());
  FH_CHECK(ev, "CpuDevice: an event from another device");
  return *ev;
}

}  // namespace

CpuDevice::CpuDevice(int threads) : CpuDevice(CpuDeviceOptions{threads}) {}

CpuDevice::CpuDevice(const CpuDeviceOptions& o)
    : opts_(o), arena_(o.threads > 0 ? o.threads : tbb::task_arena::automatic), rng_(o.seed) {
  FH_CHECK(o.act_dtype == DType::F32 || o.act_dtype == DType::F16 || o.act_dtype == DType::BF16,
           "CPU device activations must be F32, F16 or BF16");
  arena_.initialize();
  if (o.check_hazards) hazards_ = std::make_unique<HazardTracker>();
}

CpuDevice::~CpuDevice() = default;

std::string CpuDevice::name() const {
  std::ostringstream os;
  os << "CPU (" << threads() << " threads, " << cpu::cpu_isa_name() << ")";
  return os.str();
}

// ---- memory ----------------------------------------------------------------------------

Status CpuDevice::allocate(MemKind kind, size_t bytes, TierBudget& budget, const std::string& what, Buffer* out) {
  TierCharge charge;
  if (Status s = TierCharge::reserve(budget, bytes, what, &charge); !s.ok()) return s;
  void* p = std::aligned_alloc(kHostAlign, align_up(std::max<size_t>(bytes, 1), kHostAlign));
  if (!p) return Status(StatusCode::kOutOfBudget, "out of host memory allocating " + what);
  if (hazards_) hazards_->add_buffer(p, bytes, what);
  *out = make_buffer(static_cast<std::byte*>(p), bytes, kind, std::move(charge));
  return Status::Ok();
}

void CpuDevice::release(MemKind, std::byte* p, size_t) noexcept {
  if (hazards_) hazards_->remove_buffer(p);
  std::free(p);
}

void CpuDevice::upload(void* dst, const TensorView& src) { std::memcpy(dst, src.data, src.nbytes()); }

TierCharge CpuDevice::reserve(const ModelConfig& c, int64_t rows, int64_t /*seqs*/, TierBudget& budget) {
  // The scratch itself grows on first use (LayerCompute); the charge is what it will reach.
  TierCharge charge;
  const uint64_t need = device_scratch_bytes(DeviceKind::kCpu, c, opts_.act_dtype, rows);
  TierCharge::reserve(budget, need, "compute scratch", &charge).throw_if_error();
  return charge;
}

// ---- queues and events -------------------------------------------------------------------

void CpuDevice::enter(int agent) {
  (void)agent;
  if (!hazards_ || opts_.max_delay_us <= 0) return;
  int us;
  {
    std::lock_guard<std::mutex> lock(rng_mu_);
    us = int(rng_() % uint64_t(opts_.max_delay_us + 1));
  }
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

void CpuDevice::touch(int agent, const void* p, size_t bytes, bool write) {
  if (hazards_) hazards_->access(agent, p, bytes, write);
}

void CpuDevice::annotate(int agent, std::string label) {
  if (hazards_) hazards_->set_label(agent, std::move(label));
}

Event CpuDevice::record(Queue q) {
  auto e = std::make_shared<CpuEvent>();
  if (hazards_) e->vc = hazards_->record(int(q));
  return e;
}

void CpuDevice::wait(Queue q, const Event& e) {
  const CpuEvent& ev = cpu_event(e);
  if (hazards_) {
    enter(int(q));
    hazards_->merge(int(q), ev.vc);
  }
}

void CpuDevice::host_run(const std::function<void()>& f) {
  run([&] { tbb::this_task_arena::isolate(f); });
}

void CpuDevice::host_wait(const Event& e) {
  const CpuEvent& ev = cpu_event(e);
  if (hazards_) hazards_->merge(kMainAgent, ev.vc);
}

void CpuDevice::synchronize() {
  if (hazards_) hazards_->barrier();
}

void CpuDevice::begin_schedule() {
  if (hazards_) hazards_->barrier();
}

double CpuDevice::seconds_between(const Event& from, const Event& to) {
  return std::chrono::duration<double>(cpu_event(to).t - cpu_event(from).t).count();
}

void CpuDevice::host_access(int agent, const void* p, size_t bytes, bool write) {
  if (!hazards_) return;
  enter(agent);
  touch(agent, p, bytes, write);
}

// ---- moves -------------------------------------------------------------------------------

void CpuDevice::copy(Queue q, void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  enter(int(q));
  touch(int(q), src, bytes, false);
  touch(int(q), dst, bytes, true);
  std::memcpy(dst, src, bytes);
}

void CpuDevice::copy_2d(Queue q, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                        size_t height) {
  if (!width || !height) return;
  enter(int(q));
  touch(int(q), src, (height - 1) * spitch + width, false);
  touch(int(q), dst, (height - 1) * dpitch + width, true);
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  for (size_t i = 0; i < height; ++i) std::memcpy(d + i * dpitch, s + i * spitch, width);
}

void CpuDevice::gather_rows(Queue q, void* dst, const void* table, int64_t table_rows, size_t row_bytes,
                            const int32_t* ids, const int32_t* host_ids, int64_t n) {
  if (n <= 0) return;
  check_gather_ids(host_ids, n, table_rows);
  enter(int(q));
  touch(int(q), ids, size_t(n) * sizeof(int32_t), false);
  touch(int(q), table, size_t(table_rows) * row_bytes, false);
  touch(int(q), dst, size_t(n) * row_bytes, true);
  auto* d = static_cast<std::byte*>(dst);
  const auto* t = static_cast<const std::byte*>(table);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(d + size_t(i) * row_bytes, t + size_t(host_ids[i]) * row_bytes, row_bytes);
}

void CpuDevice::fill_zero(Queue q, void* dst, size_t bytes) {
  if (!bytes) return;
  enter(int(q));
  touch(int(q), dst, bytes, true);
  std::memset(dst, 0, bytes);
}

// ---- activations in fp32 ------------------------------------------------------------------

const float* CpuDevice::f32_in(const void* p, int64_t n, std::vector<float>& tmp) {
  if (opts_.act_dtype == DType::F32) return static_cast<const float*>(p);
  if (tmp.size() < size_t(n)) tmp.resize(size_t(n));
  cpu::to_f32(opts_.act_dtype, p, n, tmp.data());
  return tmp.data();
}

float* CpuDevice::f32_out(void* p, int64_t n, std::vector<float>& tmp) {
  if (opts_.act_dtype == DType::F32) return static_cast<float*>(p);
  if (tmp.size() < size_t(n)) tmp.resize(size_t(n));
  return tmp.data();
}

void CpuDevice::f32_done(const float* f, int64_t n, void* p) {
  if (opts_.act_dtype == DType::F32) return;
  cpu::from_f32(f, n, opts_.act_dtype, p);
}

// ---- unit ops ------------------------------------------------------------------------------

namespace {
template <class... V>
void each_view(const std::function<void(const TensorView&)>& f, const V&... v) {
  (f(v), ...);
}
}  // namespace

void CpuDevice::touch_weights(const LayerWeights& L) {
  if (!hazards_) return;
  for (const TensorView* v : L.all()) touch(0, v->data, v->nbytes(), false);
}

void CpuDevice::touch_weights(const ModelWeights& w) {
  if (!hazards_) return;
  each_view([&](const TensorView& v) { touch(0, v.data, v.nbytes(), false); }, w.embed, w.pos_embed, w.final_norm_w,
            w.final_norm_b, w.lm_head);
}

void CpuDevice::embed(const ModelConfig& c, const ModelWeights& w, const StepRows& r, void* hidden) {
  const int64_t M = r.n * r.T, es = int64_t(dtype_size(opts_.act_dtype));
  enter(0);
  touch_weights(w);
  touch(0, r.ids, size_t(M) * 4, false);
  touch(0, r.positions, size_t(M) * 4, false);
  touch(0, hidden, size_t(M * c.hidden * es), true);
  run([&] {
    float* h = f32_out(hidden, M * c.hidden, t_hidden_);
    compute_.embed(c, w, r.ids, shape(r), h);
    f32_done(h, M * c.hidden, hidden);
  });
}

void CpuDevice::attention_in(const ModelConfig& c, const LayerWeights& L, const StepRows& r, const void* hidden,
                             void* q, void* k, void* v) {
  const int64_t M = r.n * r.T, es = int64_t(dtype_size(opts_.act_dtype));
  enter(0);
  touch_weights(L);
  touch(0, r.positions, size_t(M) * 4, false);
  touch(0, hidden, size_t(M * c.hidden * es), false);
  touch(0, q, size_t(M * c.q_dim() * es), true);
  touch(0, k, size_t(M * c.kv_dim() * es), true);
  touch(0, v, size_t(M * c.kv_dim() * es), true);
  run([&] {
    const float* h = f32_in(hidden, M * c.hidden, t_hidden_);
    float* qf = f32_out(q, M * c.q_dim(), t_q_);
    float* kf = f32_out(k, M * c.kv_dim(), t_k_);
    float* vf = f32_out(v, M * c.kv_dim(), t_v_);
    compute_.qkv(c, L, shape(r), h, qf, kf, vf);
    f32_done(qf, M * c.q_dim(), q);
    f32_done(kf, M * c.kv_dim(), k);
    f32_done(vf, M * c.kv_dim(), v);
  });
}

void CpuDevice::attend(const ModelConfig& c, const StepRows& r, const void* q, const void* k, const void* v,
                       std::span<const KvSegment> segs, void* attn) {
  const int64_t M = r.n * r.T, Q = c.q_dim(), KV = c.kv_dim();
  const size_t es = dtype_size(opts_.act_dtype);
  enter(0);
  touch(0, r.seq_keys, size_t(r.n) * 4, false);
  for (const KvSegment& s : segs) {
    if (s.n_seq == 0) continue;
    const size_t rows = size_t(s.n_seq * r.T), row0 = size_t(s.first_seq * r.T);
    const size_t region = size_t(s.n_seq * c.n_kv_heads * s.capacity) * row_nbytes(s.dtype, c.head_dim);
    touch(0, static_cast<const std::byte*>(q) + row0 * size_t(Q) * es, rows * size_t(Q) * es, false);
    touch(0, static_cast<const std::byte*>(k) + row0 * size_t(KV) * es, rows * size_t(KV) * es, false);
    touch(0, static_cast<const std::byte*>(v) + row0 * size_t(KV) * es, rows * size_t(KV) * es, false);
    touch(0, s.k, region, true);
    touch(0, s.v, region, true);
    if (s.key_scores) touch(0, s.key_scores, size_t(s.n_seq * c.n_heads * s.capacity) * 4, true);
    touch(0, static_cast<std::byte*>(attn) + row0 * size_t(Q) * es, rows * size_t(Q) * es, true);
  }
  run([&] {
    const float* qf = f32_in(q, M * Q, t_q_);
    const float* kf = f32_in(k, M * KV, t_k_);
    const float* vf = f32_in(v, M * KV, t_v_);
    float* af = f32_out(attn, M * Q, t_attn_);
    for (const KvSegment& s : segs) {
      compute_.attend(c, shape(r), qf, kf, vf, s, af);
      if (opts_.act_dtype != DType::F32 && s.n_seq > 0) {
        const int64_t row0 = s.first_seq * r.T * Q;
        cpu::from_f32(af + row0, s.n_seq * r.T * Q, opts_.act_dtype, static_cast<std::byte*>(attn) + size_t(row0) * es);
      }
    }
  });
}

void CpuDevice::attention_out(const ModelConfig& c, const LayerWeights& L, const StepRows& r, const void* attn,
                              void* hidden) {
  const int64_t M = r.n * r.T, es = int64_t(dtype_size(opts_.act_dtype));
  enter(0);
  touch_weights(L);
  touch(0, attn, size_t(M * c.q_dim() * es), false);
  touch(0, hidden, size_t(M * c.hidden * es), true);
  run([&] {
    const float* a = f32_in(attn, M * c.q_dim(), t_attn_);
    float* h = opts_.act_dtype == DType::F32 ? static_cast<float*>(hidden)
                                             : const_cast<float*>(f32_in(hidden, M * c.hidden, t_hidden_));
    compute_.attention_out(c, L, shape(r), a, h);
    f32_done(h, M * c.hidden, hidden);
  });
}

void CpuDevice::mlp(const ModelConfig& c, const LayerWeights& L, const StepRows& r, void* hidden) {
  const int64_t M = r.n * r.T, es = int64_t(dtype_size(opts_.act_dtype));
  enter(0);
  touch_weights(L);
  touch(0, hidden, size_t(M * c.hidden * es), true);
  run([&] {
    float* h = opts_.act_dtype == DType::F32 ? static_cast<float*>(hidden)
                                             : const_cast<float*>(f32_in(hidden, M * c.hidden, t_hidden_));
    compute_.mlp(c, L, shape(r), h);
    f32_done(h, M * c.hidden, hidden);
  });
}

void CpuDevice::head(const ModelConfig& c, const ModelWeights& w, const StepRows& r, const void* hidden,
                     int64_t first, int64_t rows, float* logits) {
  const int64_t M = r.n * r.T, es = int64_t(dtype_size(opts_.act_dtype));
  FH_CHECK(first >= 0 && rows >= 1 && first + rows <= r.T, "head of rows [", first, ", ", first + rows,
           ") of a step of ", r.T);
  enter(0);
  touch_weights(w);
  touch(0, hidden, size_t(M * c.hidden * es), false);
  touch(0, logits, size_t(rows * r.n * c.vocab_size) * 4, true);
  run([&] {
    const float* h = f32_in(hidden, M * c.hidden, t_hidden_);
    compute_.head_rows(c, w, shape(r), h, first, rows, logits);
  });
}

void CpuDevice::kv_gather(void* buf, DType dt, int64_t rows, int64_t capacity, int64_t row_elems,
                          const int32_t* keep, int64_t keep_stride, const int32_t* count) {
  enter(0);
  touch(0, keep, size_t(rows * keep_stride) * 4, false);
  touch(0, count, size_t(rows) * 4, false);
  touch(0, buf, size_t(rows * capacity) * row_nbytes(dt, row_elems), true);
  cpu::kv_gather(buf, dt, rows, 1, capacity, row_elems, keep, keep_stride, count);
}

}  // namespace flexh2o
