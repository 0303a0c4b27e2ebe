// GpuRunner: per-batch device memory (K/V, key scores, keep lists, step inputs, hidden,
// logits) carved from one arena at the prefill, one stream, one host sync per step; the KV
// policy's decisions are made on the host by engine/kv_evict.cpp's decide_kv_policy().
#include "gpu/gpu_runner.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <tuple>

#include "core/error.h"
#include "engine/kv_evict.h"
#include "gpu/device_info.h"
#include "gpu/gpu_layer_compute.h"
#include "gpu/gpu_model.h"
#include "gpu/memory_plan.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_probe.h"

namespace flexh2o::gpu {
namespace {

int use_device0() {
  const CudaProbe p = probe_cuda();
  if (!p.available) FH_FAIL("the CUDA runner needs a GPU: ", p.reason, "; use --device cpu");
  FH_CUDA_CHECK(cudaSetDevice(0));
  return 0;
}

}  // namespace

struct GpuRunner::Impl {
  const Model& model;
  const ModelConfig& c;
  GpuRunnerOptions opt;
  int device = use_device0();
  DeviceInfo dev = current_device_info();
  GpuModel gm;
  GpuLayerCompute compute;
  Stream stream;

  // The batch. cap == 0 until the prefill sized the cache.
  int64_t batch = 0, capacity = 0, cap = 0;
  DeviceArena arena;
  std::vector<void*> k, v;        // per layer, [B, kv_heads, cap, head_dim]
  float* scores = nullptr;        // [L, B, n_heads, cap] (policies that need scores)
  int32_t* keep = nullptr;        // [L * B * kv_heads * cap] packed keep lists
  int32_t* keep_count = nullptr;  // [L, B * kv_heads]
  int32_t *ids = nullptr, *pos = nullptr, *pos_rows = nullptr, *keys = nullptr;  // step inputs
  void* hidden = nullptr;         // [B * cap, hidden]
  float* logits = nullptr;        // [B, vocab] fp32
  PinnedBuffer pin_in, pin_logits, pin_scores;
  std::vector<int32_t> lengths, seen, seq_keys, evicted, dirty_lo, dirty_hi;
  std::vector<KvBudget> budgets;
  std::vector<KvPolicyState> state;
  std::vector<int32_t> keep_host, count_host, row_keep;

  Impl(const Model& m, const GpuRunnerOptions& o)
      : model(m), c(m.config()), opt(o), gm(m, o.max_weight_bytes), compute(c, gm.dtype()) {}
  ~Impl() { FH_CUDA_LOG(cudaStreamSynchronize(stream.get())); }

  bool scoring() const { return opt.policy && opt.policy->needs_scores(); }

  // Carves the batch's buffers out of `a` (count-only or real; same code path).
  Status carve(DeviceArena& a) {
    const int64_t B = batch, L = c.n_layers, rows = B * c.n_kv_heads, M = B * cap;
    const size_t kv_one = gpu_kv_bytes(c, gm.dtype(), B, cap) / size_t(2 * L);
    k.assign(size_t(L), nullptr);
    v.assign(size_t(L), nullptr);
    for (int64_t l = 0; l < L; ++l) {
      if (Status s = a.allocate(kv_one, &k[size_t(l)]); !s.ok()) return s;
      if (Status s = a.allocate(kv_one, &v[size_t(l)]); !s.ok()) return s;
    }
    scores = nullptr, keep = nullptr, keep_count = nullptr;
    if (scoring())
      if (Status s = a.allocate_n(size_t(L * B * c.n_heads * cap), &scores); !s.ok()) return s;
    if (opt.policy) {
      if (Status s = a.allocate_n(size_t(L * rows * cap), &keep); !s.ok()) return s;
      if (Status s = a.allocate_n(size_t(L * rows), &keep_count); !s.ok()) return s;
    }
    for (int32_t** p : {&ids, &pos, &pos_rows})
      if (Status s = a.allocate_n(size_t(M), p); !s.ok()) return s;
    if (Status s = a.allocate_n(size_t(B), &keys); !s.ok()) return s;
    if (Status s = a.allocate(size_t(M * c.hidden) * dtype_size(gm.dtype()), &hidden); !s.ok()) return s;
    return a.allocate_n(size_t(B * c.vocab_size), &logits);
  }

  // Sizes the cache at the prefill (like InMemoryRunner: with a policy, the prompt or the
  // largest budget, whichever is larger) and allocates every per-batch buffer.
  void start(int64_t T, const int32_t* real_rows) {
    cap = capacity;
    budgets.clear();
    if (opt.policy) {
      int64_t need = T;
      for (int64_t b = 0; b < batch; ++b) {
        budgets.push_back(opt.policy->budget(real_rows ? real_rows[b] : T));
        if (!budgets.back().unbounded) need = std::max(need, budgets.back().total());
        else need = capacity;
      }
      cap = std::min(capacity, need);
      state.resize(size_t(c.n_layers));
      for (auto& s : state) s.reset(batch, c.n_kv_heads, cap);
      seen.assign(size_t(batch), 0);
    } else {
      state.clear();
    }
    lengths.assign(size_t(batch), 0);
    DeviceArena counter = DeviceArena::count_only();
    carve(counter).throw_if_error();
    const size_t need = counter.peak();
    if (arena.budget() < need) {
      arena = DeviceArena();
      if (!DeviceArena::create(need, &arena).ok()) {
        const DeviceInfo d = current_device_info();
        FH_FAIL(fit_error("the KV cache and buffers of " + std::to_string(batch) + " sequences x " +
                              std::to_string(cap) + " tokens",
                          need, d.free_bytes, d.total_bytes, d.name,
                          "lower --batch-size (the weights use " + format_bytes(gm.bytes()) + ")"));
      }
    }
    arena.reset();
    carve(arena).throw_if_error();
    for (int64_t l = 0; l < c.n_layers; ++l) {  // as the CPU cache: stale slots are zeros
      FH_CUDA_CHECK(cudaMemsetAsync(k[size_t(l)], 0, gpu_kv_bytes(c, gm.dtype(), batch, cap) / size_t(2 * c.n_layers),
                                    stream.get()));
      FH_CUDA_CHECK(cudaMemsetAsync(v[size_t(l)], 0, gpu_kv_bytes(c, gm.dtype(), batch, cap) / size_t(2 * c.n_layers),
                                    stream.get()));
    }
    auto grow = [](PinnedBuffer& p, size_t bytes) {
      if (p.size() < bytes) {
        p = PinnedBuffer();
        PinnedBuffer::create(bytes, &p).throw_if_error();
      }
    };
    grow(pin_in, size_t(3 * batch * cap + batch) * sizeof(int32_t));
    grow(pin_logits, size_t(batch * c.vocab_size) * sizeof(float));
    if (scoring()) grow(pin_scores, size_t(c.n_layers * batch * c.n_heads * cap) * sizeof(float));
  }

  void step(const int32_t* in_ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& out) {
    const int64_t B = batch, M = B * T;
    FH_CHECK(B > 0, "GpuRunner: begin_batch() first");
    FH_CHECK(T > 0, "step needs at least one token");
    for (int64_t i = 0; i < M; ++i) {
      FH_CHECK(positions[i] >= 0 && positions[i] < c.max_positions, "position ", positions[i],
               " outside the model's ", c.max_positions, " positions");
      FH_CHECK(in_ids[i] >= 0 && in_ids[i] < c.vocab_size, "token id ", in_ids[i], " outside the vocabulary of ",
               c.vocab_size);
    }
    if (cap == 0) start(T, real_rows);
    FH_CHECK(M <= B * cap, "step of ", T, " rows exceeds the batch's KV capacity ", cap);
    seq_keys.resize(size_t(B));
    int64_t max_keys = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t add = real_rows ? real_rows[b] : T;
      FH_CHECK(add >= 0 && add <= T, "real rows ", add, " outside [0, ", T, "]");
      seq_keys[size_t(b)] = int32_t(lengths[size_t(b)] + add);
      FH_CHECK(seq_keys[size_t(b)] <= cap, "KV cache full: sequence ", b, " needs ", seq_keys[size_t(b)],
               " slots, capacity ", cap);
      max_keys = std::max<int64_t>(max_keys, seq_keys[size_t(b)]);
    }
    const bool prefill = std::all_of(lengths.begin(), lengths.end(), [](int32_t n) { return n == 0; });

    // Inputs: ids | positions | OPT position rows | seq_keys, one pinned staging area.
    int32_t* pin = static_cast<int32_t*>(pin_in.data());
    std::memcpy(pin, in_ids, size_t(M) * sizeof(int32_t));
    std::memcpy(pin + M, positions, size_t(M) * sizeof(int32_t));
    for (int64_t i = 0; i < M; ++i) pin[2 * M + i] = positions[i] + int32_t(c.position_offset());
    std::memcpy(pin + 3 * M, seq_keys.data(), size_t(B) * sizeof(int32_t));
    cudaStream_t st = stream.get();
    for (auto [dst, src, n] : {std::tuple{ids, pin, M}, {pos, pin + M, M}, {pos_rows, pin + 2 * M, M},
                               {keys, pin + 3 * M, B}})
      FH_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, st));

    compute.reserve(M, B);
    const GpuStep s{B, T, ids, pos, pos_rows, keys, max_keys};
    const int64_t per_layer_scores = B * c.n_heads * cap;
    if (scoring())
      FH_CUDA_CHECK(cudaMemsetAsync(scores, 0, size_t(c.n_layers * per_layer_scores) * sizeof(float), st));
    const GpuModelWeights& w = gm.weights();
    compute.embed(w, s, hidden, st);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      GpuKvSegment seg{k[size_t(l)], v[size_t(l)], 0, B, cap, scoring() ? scores + l * per_layer_scores : nullptr};
      compute.layer(w.layers[size_t(l)], s, hidden, {&seg, 1}, st);
    }
    compute.head(w, s, hidden, logits, st);
    FH_CUDA_CHECK(cudaMemcpyAsync(pin_logits.data(), logits, size_t(B * c.vocab_size) * sizeof(float),
                                  cudaMemcpyDeviceToHost, st));
    if (scoring())
      FH_CUDA_CHECK(cudaMemcpyAsync(pin_scores.data(), scores, size_t(c.n_layers * per_layer_scores) * sizeof(float),
                                    cudaMemcpyDeviceToHost, st));
    stream.synchronize();
    out.resize(size_t(B * c.vocab_size));
    std::memcpy(out.data(), pin_logits.data(), out.size() * sizeof(float));

    if (!opt.policy) {
      lengths = seq_keys;
      return;
    }
    evict(prefill);
    for (int64_t b = 0; b < B; ++b) seen[size_t(b)] += seq_keys[size_t(b)] - lengths[size_t(b)];
    lengths = evicted;
  }

  // The policy after the step's attention, layer by layer, exactly as Forward::step does on
  // the CPU; each layer's keep lists are packed [B * kv_heads, stride] (stride = the longest
  // prefix that moves anything) and applied to K and V with kv_gather.
  void evict(bool prefill) {
    const int64_t B = batch, kvh = c.n_kv_heads, rows = B * kvh, hd = c.head_dim;
    keep_host.clear();
    count_host.assign(size_t(c.n_layers * rows), 0);
    std::vector<int64_t> offset(size_t(c.n_layers)), stride(size_t(c.n_layers));
    row_keep.resize(size_t(rows * cap));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      evicted = seq_keys;
      int32_t* counts = count_host.data() + l * rows;
      EvictArgs ea;
      ea.policy = opt.policy;
      ea.config = &c;
      ea.seg = KvSegment{nullptr, nullptr, 0, B, cap};
      if (scoring()) ea.seg.key_scores = static_cast<float*>(pin_scores.data()) + l * B * c.n_heads * cap;
      ea.state = &state[size_t(l)];
      ea.len_before = lengths.data();
      ea.len_after = evicted.data();
      ea.seen_before = seen.data();
      ea.budgets = budgets.data();
      ea.prefill = prefill;
      ea.salt = uint64_t(l);
      ea.dirty_lo = &dirty_lo;
      ea.dirty_hi = &dirty_hi;
      int64_t longest = 0;
      decide_kv_policy(ea, [&](int64_t b, int64_t h, std::span<const int32_t> kl) {
        int64_t n = 0;  // entries up to the last one that moves a row
        for (size_t i = 0; i < kl.size(); ++i)
          if (kl[i] != int32_t(i)) n = int64_t(i) + 1;
        const int64_t r = b * kvh + h;
        counts[r] = int32_t(n);
        std::copy_n(kl.data(), n, row_keep.data() + r * cap);
        longest = std::max(longest, n);
      });
      offset[size_t(l)] = int64_t(keep_host.size());
      stride[size_t(l)] = longest;
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t* src = row_keep.data() + r * cap;
        keep_host.insert(keep_host.end(), src, src + counts[r]);
        keep_host.resize(keep_host.size() + size_t(longest - counts[r]), 0);  // never read
      }
    }
    cudaStream_t st = stream.get();
    if (keep_host.empty()) return;
    // Pageable sources: the copies return once the data is staged, so the vectors may change.
    FH_CUDA_CHECK(cudaMemcpyAsync(keep, keep_host.data(), keep_host.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, st));
    FH_CUDA_CHECK(cudaMemcpyAsync(keep_count, count_host.data(), count_host.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, st));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      if (stride[size_t(l)] == 0) continue;
      const int32_t* kp = keep + offset[size_t(l)];
      const int32_t* kc = keep_count + l * rows;
      kv_gather(gm.dtype(), k[size_t(l)], B, kvh, cap, hd, kp, stride[size_t(l)], kc, st);
      kv_gather(gm.dtype(), v[size_t(l)], B, kvh, cap, hd, kp, stride[size_t(l)], kc, st);
    }
  }
};

GpuRunner::GpuRunner(const Model& model, const GpuRunnerOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {
  FH_CHECK(options.max_batch > 0, "GpuRunner: max_batch must be positive");
}
GpuRunner::~GpuRunner() = default;

const ModelConfig& GpuRunner::config() const { return impl_->c; }
int64_t GpuRunner::max_batch() const { return impl_->opt.max_batch; }

void GpuRunner::begin_batch(int64_t B, int64_t capacity) {
  FH_CHECK(B > 0 && capacity > 0, "GpuRunner: batch and capacity must be positive");
  impl_->batch = B;
  impl_->capacity = capacity;
  impl_->cap = 0;  // sized at the prefill
}

void GpuRunner::step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                     std::vector<float>& logits) {
  impl_->step(ids, positions, T, real_rows, logits);
}

size_t GpuRunner::kv_bytes() const {
  const Impl& m = *impl_;
  if (m.cap == 0) return 0;
  size_t n = gpu_kv_bytes(m.c, m.gm.dtype(), m.batch, m.cap);
  for (const auto& s : m.state) n += s.bytes();
  return n;
}

GpuRunInfo GpuRunner::info() const {
  const Impl& m = *impl_;
  return {m.dev.name, m.dev.total_bytes, std::string(dtype_name(m.gm.dtype())), m.gm.bytes(),
          m.gm.upload_seconds()};
}

std::vector<int32_t> GpuRunner::lengths() const { return impl_->lengths; }

const KvPolicyState* GpuRunner::policy_state(int64_t layer) const {
  const Impl& m = *impl_;
  if (layer < 0 || layer >= int64_t(m.state.size())) return nullptr;
  return &m.state[size_t(layer)];
}

}  // namespace flexh2o::gpu
