// GpuOffloadRunner: weight homes (device arena / pinned host), the per-batch buffers carved
// from the same budgeted arena, and the CUDA schedule executor: each step of build_schedule()
// is enqueued on its queue's stream after cudaStreamWaitEvent on its cross-stream
// dependencies (plan_streams), between two timing events; the host blocks once per step, and
// once per (layer, micro-batch) for the host attention of a cache homed on the host (HostKv).
#include "gpu/gpu_offload_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <tuple>

#include "core/error.h"
#include "engine/placement.h"
#include "engine/schedule.h"
#include "gpu/device_info.h"
#include "gpu/gpu_layer_compute.h"
#include "gpu/host_kv.h"
#include "gpu/memory_plan.h"
#include "gpu/offload_plan.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_probe.h"

namespace flexh2o::gpu {
namespace {

constexpr size_t kChunkBytes = size_t(32) << 20;   // per half of the upload staging buffer
constexpr size_t kRegisterMin = size_t(1) << 20;   // smaller host homes are copied, not pinned in place
constexpr size_t kDefaultReserve = size_t(512) << 20;  // left free without --gpu-mem (context, cuBLAS)

int use_device0() {
  const CudaProbe p = probe_cuda();
  if (!p.available) FH_FAIL("the CUDA offloading runner needs a GPU: ", p.reason, "; use --device cpu");
  FH_CUDA_CHECK(cudaSetDevice(0));
  return 0;
}

const Policy& checked(const GpuOffloadOptions& o) {
  check_gpu_offload_policy(o.policy, o.kv_policy != nullptr);
  return o.policy;
}

void grow(PinnedBuffer& pb, size_t bytes) {
  if (pb.size() >= bytes) return;
  pb = PinnedBuffer();
  PinnedBuffer::create(bytes, &pb).throw_if_error();
}

struct Unregister {
  void operator()(void* p) const noexcept { FH_CUDA_LOG(cudaHostUnregister(p)); }
};
using HostPin = std::unique_ptr<void, Unregister>;  // memory page-locked in place

}  // namespace

struct GpuOffloadRunner::Impl {
  const Model& model;
  const ModelConfig& c;
  GpuOffloadOptions opt;
  const Policy& p;
  OffloadModes modes = offload_modes(p, opt.kv_policy && opt.kv_policy->needs_scores());
  int device = use_device0();
  DeviceInfo dev = current_device_info();
  WeightPlacement wp;
  DeviceLayout layout;
  size_t budget = 0;
  DeviceArena arena;  // budget - cuBLAS workspace: homes | slot 0 | slot 1 || per-batch buffers
  size_t batch_mark = 0;
  char* homes = nullptr;
  std::array<char*, 2> slot{};
  PinnedBuffer host_pinned;                      // converted host homes (pin_weight)
  std::unique_ptr<uint16_t[]> host_pageable;     // converted host homes (--pin-weight false)
  std::vector<HostPin> pins;
  std::vector<std::vector<const void*>> host_src;  // [unit][tensor] host home of a streamed tensor
  std::vector<std::vector<size_t>> copy_bytes;     // [unit][tensor] bytes at the compute dtype
  std::array<GpuModelWeights, 2> views;            // weights as compute reads them, per slot parity
  std::unique_ptr<GpuLayerCompute> compute;
  std::array<Stream, kNumStreams> streams;
  std::vector<Event> events, starts;  // per schedule step: recorded after / before it (timing)
  Event prefetched{false};
  bool prefetch_pending = false, first_layer_loaded = false, more_steps = true;
  int slot_phase = 0;  // unit u's weights use slot (u + slot_phase) % 2 (schedule.h)

  // The batch (cap == 0 until the prefill sized it).
  int64_t batch = 0, capacity = 0, cap = 0, rows = 0, T = 0, max_keys = 0;
  std::vector<int32_t> lengths, seq_keys;
  char* hidden = nullptr;
  int32_t *ids = nullptr, *pos = nullptr, *pos_rows = nullptr, *keys = nullptr;
  float* logits = nullptr;
  std::vector<char*> k, v;
  PinnedBuffer pin_in, pin_logits;
  // act_host: two device hidden slots and the pinned host home of every hidden state.
  std::array<char*, 2> hslot{};
  PinnedBuffer pin_hidden;
  // kv_host: the cache on the host, the prefill's device staging and pinned bounce slots, the
  // pinned q/k/v and attention rows of the host attention, and each store's host-callback
  // argument (stable until the step's end).
  std::unique_ptr<HostKv> hkv;
  std::array<char*, 2> kstage{}, vstage{};
  std::array<float*, 2> sstage{};
  std::array<PinnedBuffer, 2> pin_k, pin_v, pin_s;
  PinnedBuffer pin_qkv, pin_attn;
  Event host_ready;
  struct HostStore {
    Impl* self;
    int64_t layer, first, n;
    int slot;
  };
  std::vector<HostStore> stores;
  std::string host_error;  // first error of a host callback (read after the streams synchronise)
  int micro = 1;           // micro-batches of this step

  GpuOffloadReport rep;

  Impl(const Model& m, const GpuOffloadOptions& o) : model(m), c(m.config()), opt(o), p(checked(opt)) {
    const auto t0 = std::chrono::steady_clock::now();
    wp = place_weights(m, p);
    layout = device_layout(wp, gpu_compute_dtype(m));
    budget = opt.device_budget ? opt.device_budget
                               : (dev.free_bytes > kDefaultReserve ? dev.free_bytes - kDefaultReserve : 0);
    const GpuOffloadNeed need = gpu_offload_need(c, layout, 0, p.gpu_batch_size, 1, 1);
    if (std::string e = budget_error(need, budget, "policy " + p.str() + " on " + c.name); !e.empty()) FH_FAIL(e);
    if (opt.host_budget && layout.host_bytes > opt.host_budget)
      FH_FAIL("the host-homed weights need ", format_bytes(layout.host_bytes), " of pinned host memory but --cpu-mem is ",
              format_bytes(opt.host_budget), "; raise w_gpu or --cpu-mem");
    if (!DeviceArena::create(budget - kCublasWorkspaceBytes, &arena).ok())
      FH_FAIL(fit_error("the --gpu-mem budget", budget, std::min(current_device_info().free_bytes, budget - 1),
                        dev.total_bytes, dev.name, "lower --gpu-mem"));
    compute = std::make_unique<GpuLayerCompute>(c, layout.dtype);
    if (modes.kv_host) hkv = std::make_unique<HostKv>(c, layout.dtype, opt.kv_policy);
    void* h = nullptr;
    arena.allocate(layout.home_bytes, &h, kTensorAlign).throw_if_error();
    homes = static_cast<char*>(h);
    for (char*& s : slot) {
      arena.allocate(layout.slot_bytes, &h, kTensorAlign).throw_if_error();
      s = static_cast<char*>(h);
    }
    batch_mark = arena.offset();
    upload_homes();
    place_host_homes();
    build_views();
    rep.device_name = dev.name;
    rep.device_total_bytes = dev.total_bytes;
    rep.dtype = dtype_name(layout.dtype);
    rep.policy = p.str();
    rep.budget_bytes = budget;
    rep.weight_device_bytes = layout.home_bytes;
    rep.weight_host_bytes = layout.host_bytes;
    rep.slot_bytes = layout.slot_bytes;
    rep.upload_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  ~Impl() {
    for (const Stream& s : streams) FH_CUDA_LOG(cudaStreamSynchronize(s.get()));
  }

  // Device homes: converted on the host through a double-buffered pinned staging area.
  void upload_homes() {
    PinnedBuffer stage;
    PinnedBuffer::create(2 * kChunkBytes, &stage).throw_if_error();
    Event done[2] = {Event(false), Event(false)};
    bool in_flight[2] = {false, false};
    int half = 0;
    const int64_t per_chunk = int64_t(kChunkBytes / sizeof(uint16_t));
    std::map<size_t, bool> uploaded;  // home offset -> done (a tied lm_head shares the embedding's)
    cudaStream_t st = streams[1].get();
    for (size_t u = 0; u < wp.units.size(); ++u)
      for (size_t i = 0; i < wp.units[u].tensors.size(); ++i) {
        if (layout.streamed[u][i] || !uploaded.try_emplace(layout.offset[u][i], true).second) continue;
        const TensorView& src = wp.units[u].tensors[i].source;
        uint16_t* d = reinterpret_cast<uint16_t*>(homes + layout.offset[u][i]);
        for (int64_t off = 0, n = src.numel(); off < n; off += per_chunk) {
          const int64_t cnt = std::min(per_chunk, n - off);
          if (in_flight[half]) done[half].synchronize();
          uint16_t* host = static_cast<uint16_t*>(stage.data()) + size_t(half) * size_t(per_chunk);
          convert_weights(src, off, cnt, layout.dtype, host);
          FH_CUDA_CHECK(cudaMemcpyAsync(d + off, host, size_t(cnt) * sizeof(uint16_t), cudaMemcpyHostToDevice, st));
          done[half].record(st);
          in_flight[half] = true;
          half ^= 1;
        }
      }
    streams[1].synchronize();
  }

  // Host homes: the model's own bytes page-locked in place when they already are in the
  // compute dtype (large tensors, pin_weight), else converted once into one pinned (or, with
  // --pin-weight false, pageable) block.
  void place_host_homes() {
    const size_t es = dtype_size(layout.dtype);
    host_src.assign(wp.units.size(), {});
    copy_bytes.assign(wp.units.size(), {});
    std::map<const void*, const void*> home_of;  // source -> host home (tied lm_head: once)
    std::vector<std::tuple<size_t, size_t, size_t>> to_convert;  // unit, tensor, offset in block
    size_t block = 0;
    for (size_t u = 0; u < wp.units.size(); ++u)
      for (size_t i = 0; i < wp.units[u].tensors.size(); ++i) {
        const TensorView& src = wp.units[u].tensors[i].source;
        const size_t bytes = size_t(src.numel()) * es;
        host_src[u].push_back(nullptr);
        copy_bytes[u].push_back(layout.streamed[u][i] ? bytes : 0);
        if (!layout.streamed[u][i]) continue;
        if (auto it = home_of.find(src.data); it != home_of.end()) {
          host_src[u][i] = it->second;
          continue;
        }
        const bool same = src.dtype == layout.dtype;
        if (same && !p.pin_weight) {
          host_src[u][i] = src.data;  // pageable, as loaded
        } else if (same && bytes >= kRegisterMin &&
                   cudaHostRegister(const_cast<void*>(src.data), bytes, cudaHostRegisterDefault) == cudaSuccess) {
          pins.emplace_back(const_cast<void*>(src.data));
          host_src[u][i] = src.data;
          rep.host_registered_bytes += bytes;
        } else {
          (void)cudaGetLastError();  // a refused registration (read-only mapping, overlap) is not an error
          to_convert.emplace_back(u, i, block);
          block += (bytes + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
        }
        if (host_src[u][i]) home_of[src.data] = host_src[u][i];
      }
    if (block == 0) return;
    char* base = nullptr;
    if (p.pin_weight) {
      if (Status s = PinnedBuffer::create(block, &host_pinned); !s.ok())
        FH_FAIL("cannot pin ", format_bytes(block), " of host memory for the host-homed weights (", s.message(),
                "); raise w_gpu or give --pin-weight false");
      base = static_cast<char*>(host_pinned.data());
    } else {
      host_pageable.reset(new uint16_t[block / sizeof(uint16_t)]);
      base = reinterpret_cast<char*>(host_pageable.get());
    }
    for (auto [u, i, off] : to_convert) {
      const TensorView& src = wp.units[u].tensors[i].source;
      convert_weights(src, 0, src.numel(), layout.dtype, reinterpret_cast<uint16_t*>(base + off));
      host_src[u][i] = base + off;  // (a source streamed in two units is converted twice)
    }
  }

  // Per slot parity: every weight's device address (device home, or its offset in that slot).
  void build_views() {
    const ModelWeights& hw = model.weights();
    for (int s = 0; s < 2; ++s) {
      std::map<std::pair<size_t, const void*>, const void*> at;
      for (size_t u = 0; u < wp.units.size(); ++u)
        for (size_t i = 0; i < wp.units[u].tensors.size(); ++i)
          at[{u, wp.units[u].tensors[i].source.data}] =
              (layout.streamed[u][i] ? slot[size_t(s)] : homes) + layout.offset[u][i];
      auto ptr = [&](size_t u, const TensorView& t) -> const void* {
        if (t.empty()) return nullptr;
        auto it = at.find({u, t.data});
        FH_CHECK(it != at.end(), "GPU offload: a bound weight is not in unit ", u, "'s placement");
        return it->second;
      };
      GpuModelWeights& w = views[size_t(s)];
      const size_t head = wp.units.size() - 1;
      w.dtype = layout.dtype;
      w.embed = ptr(0, hw.embed);
      w.pos_embed = ptr(0, hw.pos_embed);
      w.final_norm_w = ptr(head, hw.final_norm_w);
      w.final_norm_b = ptr(head, hw.final_norm_b);
      w.lm_head = ptr(head, hw.lm_head);
      w.layers.clear();
      for (size_t l = 0; l < hw.layers.size(); ++l) {
        const LayerWeights& L = hw.layers[l];
        const size_t u = l + 1;
        GpuLayerWeights g;
        g.ln1_w = ptr(u, L.ln1_w), g.ln1_b = ptr(u, L.ln1_b);
        g.q_w = ptr(u, L.q_w), g.q_b = ptr(u, L.q_b), g.k_w = ptr(u, L.k_w), g.k_b = ptr(u, L.k_b);
        g.v_w = ptr(u, L.v_w), g.v_b = ptr(u, L.v_b), g.o_w = ptr(u, L.o_w), g.o_b = ptr(u, L.o_b);
        g.ln2_w = ptr(u, L.ln2_w), g.ln2_b = ptr(u, L.ln2_b);
        g.fc1_w = ptr(u, L.fc1_w), g.fc1_b = ptr(u, L.fc1_b), g.fc2_w = ptr(u, L.fc2_w), g.fc2_b = ptr(u, L.fc2_b);
        g.gate_w = ptr(u, L.gate_w), g.gate_b = ptr(u, L.gate_b), g.up_w = ptr(u, L.up_w), g.up_b = ptr(u, L.up_b);
        g.down_w = ptr(u, L.down_w), g.down_b = ptr(u, L.down_b);
        w.layers.push_back(g);
      }
    }
  }

  // The batch's buffers, sized at its prefill (T rows per sequence at most) and carved from
  // the arena after the weights; the need is checked against the budget first.
  void start(int64_t prefill_T, const int32_t* real_rows) {
    cap = capacity;
    rows = prefill_T;
    if (hkv) {
      cap = hkv->begin(batch, capacity, rows, real_rows);
      if (opt.host_budget && layout.host_bytes + hkv->bytes() > opt.host_budget)
        FH_FAIL("the host-homed weights (", format_bytes(layout.host_bytes), ") and the host KV cache of ", batch,
                " sequences x ", cap, " tokens (", format_bytes(hkv->bytes()), ") exceed --cpu-mem ",
                format_bytes(opt.host_budget), "; lower the batch, raise --cpu-mem or use a KV policy");
    }
    const GpuOffloadNeed need = gpu_offload_need(c, layout, batch, p.gpu_batch_size, rows, cap, modes);
    if (std::string e = budget_error(need, budget, "a batch of " + std::to_string(batch) + " sequences x " +
                                                       std::to_string(cap) + " tokens (prompt " +
                                                       std::to_string(rows) + ")");
        !e.empty()) {
      cap = 0;
      FH_FAIL(e);
    }
    arena.rewind(batch_mark);
    const BatchBuffers b = batch_buffers(c, layout.dtype, batch, p.gpu_batch_size, rows, cap, modes);
    auto take = [&](size_t bytes) {
      void* q = nullptr;
      arena.allocate(std::max<size_t>(bytes, 1), &q, kTensorAlign).throw_if_error();
      return static_cast<char*>(q);
    };
    hidden = take(b.hidden);
    hslot = {hidden, modes.act_host ? take(b.hidden) : nullptr};
    ids = reinterpret_cast<int32_t*>(take(b.inputs));
    const int64_t M = batch * rows;
    pos = ids + M, pos_rows = ids + 2 * M, keys = ids + 3 * M;
    logits = reinterpret_cast<float*>(take(b.logits));
    k.assign(size_t(c.n_layers), nullptr);
    v.assign(size_t(c.n_layers), nullptr);
    if (modes.kv_host) {
      for (int i = 0; i < 2; ++i) {
        kstage[size_t(i)] = take(b.kv_stage), vstage[size_t(i)] = take(b.kv_stage);
        sstage[size_t(i)] = modes.scores ? reinterpret_cast<float*>(take(b.scores_stage)) : nullptr;
        grow(pin_k[size_t(i)], b.kv_stage);
        grow(pin_v[size_t(i)], b.kv_stage);
        if (modes.scores) grow(pin_s[size_t(i)], b.scores_stage);
      }
    } else {
      for (int64_t l = 0; l < c.n_layers; ++l) k[size_t(l)] = take(b.kv_layer), v[size_t(l)] = take(b.kv_layer);
    }
    const int64_t mb = std::min(batch, p.gpu_batch_size);
    compute->carve_scratch(arena, mb * rows, mb).throw_if_error();
    rep.arena_peak_bytes = std::max(rep.arena_peak_bytes, arena.peak() + kCublasWorkspaceBytes);
    cudaStream_t st = streams[0].get();
    for (int64_t l = 0; l < c.n_layers && !modes.kv_host; ++l) {  // as the CPU cache: stale slots are zeros
      FH_CUDA_CHECK(cudaMemsetAsync(k[size_t(l)], 0, b.kv_layer, st));
      FH_CUDA_CHECK(cudaMemsetAsync(v[size_t(l)], 0, b.kv_layer, st));
    }
    if (modes.act_host) grow(pin_hidden, size_t(batch * rows * c.hidden) * dtype_size(layout.dtype));
    grow(pin_in, b.inputs);
    grow(pin_logits, b.logits);
    lengths.assign(size_t(batch), 0);
  }

  // Weights of unit u (u == units: the next step's unit 1) host -> device slot.
  void load_weight(int u, cudaStream_t st) {
    const int units = int(wp.units.size());
    char* dst = slot[size_t((u + slot_phase) % 2)];
    const size_t unit = size_t(u == units ? 1 : u);
    for (size_t i = 0; i < wp.units[unit].tensors.size(); ++i) {
      if (!layout.streamed[unit][i]) continue;
      FH_CUDA_CHECK(cudaMemcpyAsync(dst + layout.offset[unit][i], host_src[unit][i], copy_bytes[unit][i],
                                    cudaMemcpyHostToDevice, st));
      rep.weight_bytes_moved += copy_bytes[unit][i];
      rep.host_to_device_bytes += copy_bytes[unit][i];
    }
  }

  int64_t first_of(int kb) const { return kb * p.gpu_batch_size; }
  int64_t size_of(int kb) const { return std::min(p.gpu_batch_size, batch - first_of(kb)); }
  size_t es() const { return dtype_size(layout.dtype); }
  // Unit u's input / output hidden state of micro-batch kb on the device: its rows of the
  // batch's buffer, or with act_host the slot that alternates with the (u, kb) order.
  char* device_hidden(int u, int kb) const {
    if (modes.act_host) return hslot[size_t((u * micro + kb) % 2)];
    return hidden + size_t(first_of(kb) * T * c.hidden) * es();
  }
  // Hidden state of micro-batch kb between the device slot and its pinned host home.
  void move_hidden(int u, int kb, bool load, cudaStream_t st) {
    const size_t bytes = size_t(size_of(kb) * T * c.hidden) * es();
    char* host = static_cast<char*>(pin_hidden.data()) + size_t(first_of(kb) * T * c.hidden) * es();
    char* dev = device_hidden(u, kb);
    FH_CUDA_CHECK(cudaMemcpyAsync(load ? dev : host, load ? host : dev, bytes,
                                  load ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, st));
    (load ? rep.host_to_device_bytes : rep.device_to_host_bytes) += bytes;
  }

  // Unit u on micro-batch k (sequences [k * gpu_batch_size, +n)).
  void run_compute(int u, int kb, bool prefill, cudaStream_t st) {
    const int64_t first = first_of(kb), n = size_of(kb);
    const GpuModelWeights& w = views[size_t((u + slot_phase) % 2)];
    const GpuStep s{n, T, ids + first * T, pos + first * T, pos_rows + first * T, keys + first, max_keys};
    char* h = device_hidden(u, kb);
    if (u == 1 && kb == 0 && prefetch_pending) {  // layer 1 was loaded by the previous step
      FH_CUDA_CHECK(cudaStreamWaitEvent(st, prefetched.get(), 0));
      prefetch_pending = false;
    }
    if (u == 0) return compute->embed(w, s, h, st);
    if (u == c.n_layers + 1) return compute->head(w, s, h, logits + first * c.vocab_size, st);
    const GpuLayerWeights& L = w.layers[size_t(u - 1)];
    if (!modes.kv_host) {
      const size_t off = size_t(first * c.n_kv_heads * cap * c.head_dim) * es();
      const GpuKvSegment seg{k[size_t(u - 1)] + off, v[size_t(u - 1)] + off, 0, n, cap, nullptr};
      return compute->layer(L, s, h, {&seg, 1}, st);
    }
    const size_t slot = size_t(((u - 1) * micro + kb) % 2);  // the schedule's KV staging slot
    if (prefill) {  // attention on the device over the staging slot; StoreCache brings the rows down
      float* scores = sstage[slot];
      if (scores) FH_CUDA_CHECK(cudaMemsetAsync(scores, 0, size_t(n * c.n_heads * rows) * sizeof(float), st));
      const GpuKvSegment seg{kstage[slot], vstage[slot], 0, n, rows, scores};
      return compute->layer(L, s, h, {&seg, 1}, st);
    }
    // Decode with the cache on the host: q/k/v down, attention on the CPU, the output back up.
    const int64_t M = n * T, Q = c.q_dim(), KV = c.kv_dim();
    grow(pin_qkv, size_t(M * (Q + 2 * KV)) * es());
    grow(pin_attn, size_t(M * Q) * es());
    char* pq = static_cast<char*>(pin_qkv.data());
    char* pk = pq + size_t(M * Q) * es();
    char* pv = pk + size_t(M * KV) * es();
    compute->qkv(L, s, h, st);
    FH_CUDA_CHECK(cudaMemcpyAsync(pq, compute->q(), size_t(M * Q) * es(), cudaMemcpyDeviceToHost, st));
    FH_CUDA_CHECK(cudaMemcpyAsync(pk, compute->k(), size_t(M * KV) * es(), cudaMemcpyDeviceToHost, st));
    FH_CUDA_CHECK(cudaMemcpyAsync(pv, compute->v(), size_t(M * KV) * es(), cudaMemcpyDeviceToHost, st));
    host_ready.record(st);
    host_ready.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    hkv->attend(u - 1, first, n, T, pq, pk, pv, pin_attn.data());
    rep.host_attention_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    FH_CUDA_CHECK(cudaMemcpyAsync(compute->attn(), pin_attn.data(), size_t(M * Q) * es(), cudaMemcpyHostToDevice, st));
    rep.device_to_host_bytes += uint64_t(M * (Q + 2 * KV)) * es();
    rep.host_to_device_bytes += uint64_t(M * Q) * es();
    compute->finish(L, s, h, st);
  }

  // Prefill rows of (layer u, micro-batch kb) from the device staging slot to the host cache:
  // copied into a pinned bounce slot, then HostKv::store_rows in a host callback on the same
  // stream (so the next copy into that bounce slot waits for it).
  void store_cache(int u, int kb, cudaStream_t st) {
    const int64_t first = first_of(kb), n = size_of(kb);
    const int slot = ((u - 1) * micro + kb) % 2;
    const size_t kvb = size_t(n * c.n_kv_heads * rows * c.head_dim) * es();
    FH_CUDA_CHECK(cudaMemcpyAsync(pin_k[size_t(slot)].data(), kstage[size_t(slot)], kvb, cudaMemcpyDeviceToHost, st));
    FH_CUDA_CHECK(cudaMemcpyAsync(pin_v[size_t(slot)].data(), vstage[size_t(slot)], kvb, cudaMemcpyDeviceToHost, st));
    rep.device_to_host_bytes += 2 * kvb;
    if (modes.scores) {
      const size_t sb = size_t(n * c.n_heads * rows) * sizeof(float);
      FH_CUDA_CHECK(cudaMemcpyAsync(pin_s[size_t(slot)].data(), sstage[size_t(slot)], sb, cudaMemcpyDeviceToHost, st));
      rep.device_to_host_bytes += sb;
    }
    FH_CHECK(stores.size() < stores.capacity(), "GpuOffloadRunner: host store arguments not reserved");
    stores.push_back({this, u - 1, first, n, slot});
    FH_CUDA_CHECK(cudaLaunchHostFunc(st, &Impl::host_store, &stores.back()));
  }

  static void host_store(void* arg) noexcept {
    const HostStore& a = *static_cast<const HostStore*>(arg);
    Impl& m = *a.self;
    if (!m.host_error.empty()) return;
    try {
      const size_t i = size_t(a.slot);
      m.hkv->store_rows(a.layer, a.first, a.n, m.rows, m.pin_k[i].data(), m.pin_v[i].data(),
                        m.modes.scores ? static_cast<const float*>(m.pin_s[i].data()) : nullptr);
    } catch (const std::exception& e) {
      m.host_error = e.what();
    }
  }

  void step(const int32_t* in_ids, const int32_t* positions, int64_t steps_T, const int32_t* real_rows,
            std::vector<float>& out) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t B = batch;
    FH_CHECK(B > 0, "GpuOffloadRunner: begin_batch() first");
    FH_CHECK(steps_T > 0, "step needs at least one token");
    for (int64_t i = 0; i < B * steps_T; ++i) {
      FH_CHECK(positions[i] >= 0 && positions[i] < c.max_positions, "position ", positions[i],
               " outside the model's ", c.max_positions, " positions");
      FH_CHECK(in_ids[i] >= 0 && in_ids[i] < c.vocab_size, "token id ", in_ids[i], " outside the vocabulary of ",
               c.vocab_size);
    }
    const bool prefill = cap == 0;
    if (prefill) start(steps_T, real_rows);
    FH_CHECK(steps_T <= rows, "step of ", steps_T, " rows after a prefill of ", rows);
    T = steps_T;
    const int64_t M = B * T;
    seq_keys.resize(size_t(B));
    max_keys = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t add = real_rows ? real_rows[b] : T;
      FH_CHECK(add >= 0 && add <= T, "real rows ", add, " outside [0, ", T, "]");
      seq_keys[size_t(b)] = int32_t(lengths[size_t(b)] + add);
      FH_CHECK(hkv || seq_keys[size_t(b)] <= cap, "KV cache full: sequence ", b, " needs ", seq_keys[size_t(b)],
               " slots, capacity ", cap);
      max_keys = std::max<int64_t>(max_keys, seq_keys[size_t(b)]);
    }
    if (hkv) hkv->begin_step(seq_keys.data());  // checks the host cache's capacity
    // Inputs (ids | positions | OPT position rows | seq_keys), laid out for this step's T.
    int32_t* pin = static_cast<int32_t*>(pin_in.data());
    std::memcpy(pin, in_ids, size_t(M) * sizeof(int32_t));
    std::memcpy(pin + M, positions, size_t(M) * sizeof(int32_t));
    for (int64_t i = 0; i < M; ++i) pin[2 * M + i] = positions[i] + int32_t(c.position_offset());
    std::memcpy(pin + 3 * M, seq_keys.data(), size_t(B) * sizeof(int32_t));
    pos = ids + M, pos_rows = ids + 2 * M, keys = ids + 3 * M;
    cudaStream_t cs = streams[0].get();
    FH_CUDA_CHECK(cudaMemcpyAsync(ids, pin, size_t(3 * M + B) * sizeof(int32_t), cudaMemcpyHostToDevice, cs));
    rep.host_to_device_bytes += uint64_t(3 * M + B) * sizeof(int32_t);

    ScheduleShape shape;
    shape.units = c.n_layers + 2;
    shape.micro_batches = int((B + p.gpu_batch_size - 1) / p.gpu_batch_size);
    for (size_t u = 0; u < wp.units.size(); ++u) shape.unit_streams.push_back(layout.unit_streamed[u] > 0);
    shape.unit_disk.assign(wp.units.size(), false);
    shape.prefill = prefill;
    shape.kv_host = modes.kv_host;
    shape.cpu_attention = modes.kv_host;  // checked: the host cache comes with cpu_cache_compute
    shape.act_on_host = modes.act_host;
    shape.first_layer_loaded = first_layer_loaded;
    shape.prefetch_next = more_steps;
    micro = shape.micro_batches;
    const Schedule sched = build_schedule(shape);
    const StreamPlan plan = plan_streams(sched, p.overlap);
    first_layer_loaded = false;  // set again once this step's prefetch is enqueued
    while (events.size() < sched.steps.size()) events.emplace_back(true), starts.emplace_back(true);
    stores.clear();
    stores.reserve(sched.steps.size());
    for (size_t i = 0; i < sched.steps.size(); ++i) {
      const Step& s = sched.steps[i];
      cudaStream_t st = streams[size_t(plan.stream[i])].get();
      for (int w : plan.waits[i]) FH_CUDA_CHECK(cudaStreamWaitEvent(st, events[size_t(w)].get(), 0));
      starts[i].record(st);
      switch (s.kind) {
        case StepKind::kLoadWeight: load_weight(s.u, st); break;
        case StepKind::kCompute: run_compute(s.u, s.k, prefill, st); break;
        case StepKind::kLoadHidden: move_hidden(s.u, s.k, true, st); break;
        case StepKind::kStoreHidden: move_hidden(s.u, s.k, false, st); break;
        case StepKind::kStoreCache: store_cache(s.u, s.k, st); break;
        default: FH_FAIL("GpuOffloadRunner: unexpected schedule step ", sched.label(int(i)));
      }
      events[i].record(st);
      if (s.kind == StepKind::kLoadWeight && s.u == shape.units) {
        prefetched.record(st);
        prefetch_pending = first_layer_loaded = true;
      }
    }
    // The prefetched unit 1 sits in the slot of this step's unit `units`: shift the parity.
    if (first_layer_loaded) slot_phase = (shape.units - 1 + slot_phase) % 2;
    FH_CUDA_CHECK(cudaMemcpyAsync(pin_logits.data(), logits, size_t(B * c.vocab_size) * sizeof(float),
                                  cudaMemcpyDeviceToHost, cs));
    rep.device_to_host_bytes += uint64_t(B * c.vocab_size) * sizeof(float);
    for (const Stream& q : streams) q.synchronize();  // the logits, and the last stores
    if (!host_error.empty()) {
      const std::string e = std::move(host_error);
      host_error.clear();
      cap = 0;  // the batch's cache is incomplete: a new begin_batch() is needed
      FH_FAIL("storing the prefill's KV rows on the host failed: ", e);
    }
    out.resize(size_t(B * c.vocab_size));
    std::memcpy(out.data(), pin_logits.data(), out.size() * sizeof(float));
    if (hkv) {
      hkv->end_step();
      lengths = hkv->lengths();
    } else {
      lengths = seq_keys;
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::array<double, kNumStreams> busy{};
    for (size_t i = 0; i < sched.steps.size(); ++i)
      busy[size_t(plan.stream[i])] += 1e-3 * double(Event::elapsed_ms(starts[i], events[i]));
    for (int q = 0; q < kNumStreams; ++q) rep.stream_busy_seconds[size_t(q)] += busy[size_t(q)];
    rep.busiest_stream_seconds += *std::max_element(busy.begin(), busy.end());
    ++rep.steps;
    rep.step_seconds += wall;
  }
};

GpuOffloadRunner::GpuOffloadRunner(const Model& model, const GpuOffloadOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {}
GpuOffloadRunner::~GpuOffloadRunner() = default;

const ModelConfig& GpuOffloadRunner::config() const { return impl_->c; }
int64_t GpuOffloadRunner::max_batch() const { return impl_->p.block_size(); }

void GpuOffloadRunner::begin_batch(int64_t B, int64_t capacity) {
  FH_CHECK(B >= 1 && B <= max_batch(), "batch of ", B, " outside [1, ", max_batch(), "]");
  FH_CHECK(capacity > 0, "GpuOffloadRunner: capacity must be positive");
  impl_->batch = B;
  impl_->capacity = capacity;
  impl_->cap = 0;  // sized at the prefill
}

void GpuOffloadRunner::step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                            std::vector<float>& logits) {
  impl_->step(ids, positions, T, real_rows, logits);
}

size_t GpuOffloadRunner::kv_bytes() const {
  const Impl& m = *impl_;
  if (!m.cap) return 0;
  return m.hkv ? m.hkv->bytes() : gpu_kv_bytes(m.c, m.layout.dtype, m.batch, m.cap);
}

void GpuOffloadRunner::expect_more_steps(bool more) { impl_->more_steps = more; }
GpuOffloadReport GpuOffloadRunner::report() const { return impl_->rep; }
std::vector<int32_t> GpuOffloadRunner::lengths() const { return impl_->lengths; }

}  // namespace flexh2o::gpu
