// HostKv: fp32 KV homes on the host for the CUDA offloading runner's cpu_cache_compute path;
// prefill rows converted in, decode attention on engine/layer_compute's CPU kernels, the KV
// policy applied in place by engine/kv_evict (the same code as the CPU engines).
#include "gpu/host_kv.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <new>

#include "core/error.h"
#include "gpu/memory_plan.h"

namespace flexh2o::gpu {
namespace {

constexpr int64_t kGrain = int64_t(1) << 16;  // elements per task when converting

template <class F>
void chunked(int64_t n, F&& f) {
  if (n <= kGrain) return f(int64_t(0), n);
  tbb::parallel_for(int64_t(0), (n + kGrain - 1) / kGrain, [&](int64_t i) {
    const int64_t lo = i * kGrain;
    f(lo, std::min(n, lo + kGrain));
  });
}

}  // namespace

void to_f32(DType dt, const void* src, int64_t n, float* dst) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (dt == DType::F16)
    chunked(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) dst[i] = f16_to_f32(s[i]);
    });
  else
    chunked(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) dst[i] = bf16_to_f32(s[i]);
    });
}

void from_f32(DType dt, const float* src, int64_t n, void* dst) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dt == DType::F16)
    chunked(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) d[i] = f32_to_f16(src[i]);
    });
  else
    chunked(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) d[i] = f32_to_bf16(src[i]);
    });
}

HostKv::HostKv(const ModelConfig& c, DType dt, const KvPolicy* policy) : c_(c), dt_(dt), policy_(policy) {
  FH_CHECK(dt == DType::F16 || dt == DType::BF16, "HostKv: rows cross the link as F16 or BF16, not ",
           dtype_name(dt));
  k_.resize(size_t(c.n_layers));
  v_.resize(size_t(c.n_layers));
}

int64_t HostKv::begin(int64_t batch, int64_t capacity, int64_t T, const int32_t* real_rows) {
  FH_CHECK(batch > 0 && capacity > 0 && T > 0, "HostKv: batch ", batch, ", capacity ", capacity, ", rows ", T);
  FH_CHECK(T <= capacity, "prompt of ", T, " tokens exceeds the KV capacity of ", capacity);
  batch_ = batch;
  cap_ = capacity;
  budgets_.clear();
  state_.clear();
  if (policy_) {
    int64_t need = 1;  // the prefill is evicted before it is stored: the homes hold the budget
    for (int64_t b = 0; b < batch; ++b) {
      budgets_.push_back(policy_->budget(real_rows ? real_rows[b] : T));
      need = budgets_.back().unbounded ? capacity : std::max(need, budgets_.back().total());
    }
    cap_ = std::min(capacity, need);
    state_.resize(size_t(c_.n_layers));
    for (KvPolicyState& s : state_) s.reset(batch, c_.n_kv_heads, std::max(cap_, T));  // >= any segment's
  }
  seen_.assign(size_t(batch), 0);
  lengths_.assign(size_t(batch), 0);
  prefill_ = true;
  final_.assign(size_t(batch), 0);
  const size_t n = home_floats();
  if (int64_t(n) > allocated_) {
    allocated_ = 0;
    for (size_t l = 0; l < k_.size(); ++l) k_[l].reset(), v_[l].reset();
    try {
      for (size_t l = 0; l < k_.size(); ++l) {
        k_[l] = std::make_unique_for_overwrite<float[]>(n);
        v_[l] = std::make_unique_for_overwrite<float[]>(n);
      }
    } catch (const std::bad_alloc&) {
      for (size_t l = 0; l < k_.size(); ++l) k_[l].reset(), v_[l].reset();
      FH_FAIL("the host KV cache of ", batch, " sequences x ", cap_, " tokens needs ", format_bytes(bytes()),
              " of host memory and the allocation failed; lower the batch or use a KV policy (--kv-policy h2o)");
    }
    allocated_ = int64_t(n);
  }
  return cap_;
}

size_t HostKv::bytes() const { return 2 * size_t(c_.n_layers) * home_floats() * sizeof(float); }

const KvPolicyState* HostKv::state(int64_t l) const { return policy_ ? &state_[size_t(l)] : nullptr; }

void HostKv::begin_step(const int32_t* seq_keys) {
  FH_CHECK(batch_ > 0, "HostKv: begin() first");
  keys_.assign(seq_keys, seq_keys + batch_);
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t n = keys_[size_t(b)];
    // The prefill's rows are evicted before they are stored (store_rows checks its block).
    FH_CHECK(n >= lengths_[size_t(b)] && (n <= cap_ || (prefill_ && policy_)), "KV cache full: sequence ", b,
             " needs ", n, " slots, capacity ", cap_);
    int64_t keep = n;
    if (policy_ && !budgets_[size_t(b)].unbounded)
      keep = std::min<int64_t>(keep, std::max<int64_t>(budgets_[size_t(b)].total() - 1, 0));
    final_[size_t(b)] = int32_t(keep);
  }
}

void HostKv::store_rows(int64_t l, int64_t first, int64_t n, int64_t rows, const void* k, const void* v,
                        const float* scores) {
  FH_CHECK(l >= 0 && l < c_.n_layers && first >= 0 && n >= 0 && first + n <= batch_ && rows > 0,
           "HostKv::store_rows: layer ", l, ", sequences [", first, ", ", first + n, "), rows ", rows);
  for (int64_t b = 0; b < n; ++b)
    FH_CHECK(keys_[size_t(first + b)] <= rows, "HostKv::store_rows: sequence ", first + b, " has ",
             keys_[size_t(first + b)], " tokens in a block of ", rows, " rows");
  const int64_t kvh = c_.n_kv_heads, hd = c_.head_dim, es = int64_t(dtype_size(dt_));
  float* kh = k_[size_t(l)].get() + first * kvh * cap_ * hd;
  float* vh = v_[size_t(l)].get() + first * kvh * cap_ * hd;
  if (!policy_) {  // straight into the homes
    FH_CHECK(rows <= cap_, "HostKv::store_rows: ", rows, " rows exceed the capacity of ", cap_);
    tbb::parallel_for(int64_t(0), n * kvh, [&](int64_t r) {
      const int64_t len = keys_[size_t(first + r / kvh)];
      const size_t src = size_t(r * rows * hd * es);
      to_f32(dt_, static_cast<const char*>(k) + src, len * hd, kh + r * cap_ * hd);
      to_f32(dt_, static_cast<const char*>(v) + src, len * hd, vh + r * cap_ * hd);
    });
    return;
  }
  // With a policy: evict in an fp32 copy of the block (capacity `rows`), then store the kept
  // rows, so the homes need only the budget.
  const size_t block = size_t(n * kvh * rows * hd);
  if (tmp_k_.size() < block) tmp_k_.resize(block), tmp_v_.resize(block);
  to_f32(dt_, k, int64_t(block), tmp_k_.data());
  to_f32(dt_, v, int64_t(block), tmp_v_.data());
  KvSegment seg{tmp_k_.data(), tmp_v_.data(), 0, n, rows, nullptr};
  if (policy_->needs_scores()) {
    FH_CHECK(scores, "HostKv::store_rows: the KV policy needs the prefill's attention scores");
    seg.key_scores = const_cast<float*>(scores);  // read only: eviction accumulates them into the state
  }
  evict(l, first, n, seg, /*prefill=*/true);
  tbb::parallel_for(int64_t(0), n * kvh, [&](int64_t r) {
    const int64_t len = final_[size_t(first + r / kvh)];
    std::copy_n(tmp_k_.data() + r * rows * hd, len * hd, kh + r * cap_ * hd);
    std::copy_n(tmp_v_.data() + r * rows * hd, len * hd, vh + r * cap_ * hd);
  });
}

void HostKv::attend(int64_t l, int64_t first, int64_t n, int64_t T, const void* q, const void* k, const void* v,
                    void* out) {
  FH_CHECK(l >= 0 && l < c_.n_layers && first >= 0 && n > 0 && first + n <= batch_ && T > 0,
           "HostKv::attend: layer ", l, ", sequences [", first, ", ", first + n, "), T ", T);
  const int64_t M = n * T, Q = c_.q_dim(), KV = c_.kv_dim(), kvh = c_.n_kv_heads, hd = c_.head_dim;
  q32_.resize(size_t(M * Q));
  k32_.resize(size_t(M * KV));
  v32_.resize(size_t(M * KV));
  to_f32(dt_, q, M * Q, q32_.data());
  to_f32(dt_, k, M * KV, k32_.data());
  to_f32(dt_, v, M * KV, v32_.data());
  const StepShape s{n, T, nullptr, keys_.data() + first};
  cpu_.load_qkv(c_, s, q32_.data(), k32_.data(), v32_.data());
  KvSegment seg{k_[size_t(l)].get() + first * kvh * cap_ * hd, v_[size_t(l)].get() + first * kvh * cap_ * hd, 0, n,
                cap_, nullptr};
  if (policy_ && policy_->needs_scores()) {
    scores_.assign(size_t(n * c_.n_heads * cap_), 0.f);
    seg.key_scores = scores_.data();
  }
  cpu_.attend(c_, s, seg);
  from_f32(dt_, cpu_.attn(), M * Q, out);
  if (policy_) evict(l, first, n, seg, /*prefill=*/false);
}

void HostKv::evict(int64_t l, int64_t first, int64_t n, const KvSegment& seg, bool prefill) {
  after_.assign(keys_.begin() + first, keys_.begin() + first + n);
  EvictArgs ea;
  ea.policy = policy_;
  ea.config = &c_;
  ea.seg = seg;
  ea.state_first = first;
  ea.state = &state_[size_t(l)];
  ea.len_before = lengths_.data() + first;
  ea.len_after = after_.data();
  ea.seen_before = seen_.data() + first;
  ea.budgets = budgets_.data() + first;
  ea.prefill = prefill;
  ea.salt = uint64_t(l);
  ea.dirty_lo = &dirty_lo_;
  ea.dirty_hi = &dirty_hi_;
  apply_kv_policy(ea);
  for (int64_t i = 0; i < n; ++i)
    FH_CHECK(after_[size_t(i)] == final_[size_t(first + i)], "eviction kept ", after_[size_t(i)],
             " tokens, expected ", final_[size_t(first + i)]);
}

void HostKv::end_step() {
  for (int64_t b = 0; b < batch_; ++b) seen_[size_t(b)] += keys_[size_t(b)] - lengths_[size_t(b)];
  lengths_ = final_;
  prefill_ = false;
}

}  // namespace flexh2o::gpu
