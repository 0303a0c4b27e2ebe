// Cost model: step durations, list scheduling of the engine's schedule, bytes per link and
// memory per tier. Mirrors src/engine/offload_actions.cpp step by step (see the comments).
#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "engine/layer_compute.h"
#include "engine/placement.h"
#include "model/weights.h"
#include "policies/kv_policy.h"

namespace flexh2o {
namespace {

constexpr uint64_t kF = sizeof(float);  // KV and hidden states are fp32 in every tier
// Passes over a layer's activation rows (hidden wide) by its non-GEMM ops: 2 norms (read +
// write), 2 residual adds (3 each), attention in/out copies and KV writes (~4); the FFN's
// activation adds 2 passes over ffn_dim-wide rows (counted separately).
constexpr double kLayerPasses = 14;

int64_t align_capacity(const ModelConfig& c, int64_t cap) {
  // The engine's kv_capacity_align(): slots such that every row block starts on 4096 bytes.
  const int64_t a = 4096 / std::gcd<int64_t>(4096, c.head_dim * int64_t(kF));
  return (cap + a - 1) / a * a;
}

}  // namespace

// ---- model shape and placement ---------------------------------------------------------

ModelShape ModelShape::from_config(const ModelConfig& c) {
  ModelShape s;
  s.config = c;
  const size_t es = dtype_size(c.dtype);
  size_t embed_bytes = 0;
  for (const WeightSpec& w : weight_specs(c)) {
    const size_t n = es * size_t(w.shape.numel());
    if (w.layer == 0) s.layer.push_back(n);
    else if (w.layer > 0) continue;
    else if (w.name.find("embed_") != std::string::npos) s.embed.push_back(n);
    else s.head.push_back(n);
    if (w.name.find("embed_tokens") != std::string::npos) embed_bytes = n, s.token_index = s.embed.size() - 1;
  }
  if (c.tie_embeddings) s.head.push_back(embed_bytes);
  return s;
}

ModelShape ModelShape::from_model(const Model& m) {
  ModelShape s;
  s.config = m.config();
  for (const BoundTensor& t : m.tensors()) {
    if (t.spec.layer == 0) s.layer.push_back(t.view.nbytes());
    else if (t.spec.layer > 0) continue;
    else if (t.spec.name.find("embed_") != std::string::npos) s.embed.push_back(t.view.nbytes());
    else s.head.push_back(t.view.nbytes());
    if (t.view.data == m.weights().embed.data) s.token_index = s.embed.size() - 1;
  }
  if (s.config.tie_embeddings) s.head.push_back(m.weights().embed.nbytes());
  return s;
}

uint64_t ModelShape::total_bytes() const {
  auto sum = [](const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), uint64_t(0)); };
  return sum(embed) + uint64_t(config.n_layers) * sum(layer) + sum(head);
}

std::array<uint64_t, 3> place_unit(const std::vector<size_t>& tensor_bytes, const Policy& p) {
  // place_weights(): each whole tensor goes where its byte midpoint falls on [disk, host, device].
  std::array<uint64_t, 3> out{};
  const size_t total = std::accumulate(tensor_bytes.begin(), tensor_bytes.end(), size_t(0));
  size_t cum = 0;
  for (size_t b : tensor_bytes) {
    const double mid = total ? (double(cum) + double(b) / 2) / double(total) * 100 : 0;
    cum += b;
    out[size_t(midpoint_tier(mid, p.w_gpu_percent, p.w_cpu_percent))] += b;
  }
  return out;
}

std::array<uint64_t, 3> embed_moved(const ModelShape& m, const Policy& p, uint64_t rows) {
  // offload_actions.cpp load_weight_disk/load_weight: a streamed token table moves only the
  // step's rows (all of it when a step has >= vocab rows).
  std::array<uint64_t, 3> out{};
  const size_t total = std::accumulate(m.embed.begin(), m.embed.end(), size_t(0));
  size_t cum = 0;
  for (size_t i = 0; i < m.embed.size(); ++i) {
    const size_t b = m.embed[i];
    const double mid = total ? (double(cum) + double(b) / 2) / double(total) * 100 : 0;
    cum += b;
    const Tier t = midpoint_tier(mid, p.w_gpu_percent, p.w_cpu_percent);
    const uint64_t V = uint64_t(m.config.vocab_size);
    out[size_t(t)] += i == m.token_index && t != Tier::kDevice ? std::min(rows, V) * (b / V) : b;
  }
  return out;
}

// ---- construction, capacity, memory -----------------------------------------------------

CostModel::CostModel(ModelShape m, HardwareProfile hw, Workload w) : m_(std::move(m)), hw_(std::move(hw)), w_(std::move(w)) {
  FH_CHECK(w_.prompt_len >= 1 && w_.gen_len >= 1, "workload needs prompt_len >= 1 and gen_len >= 1, got ",
           w_.prompt_len, " and ", w_.gen_len);
  // The engine (offload_actions.cpp, kv_evict.cpp) with a bounded budget B per sequence:
  // after every step a sequence keeps min(len, B - 1) rows (room for the incoming token);
  // device-side buffers hold max(prompt, B) slots (the prefill attends the whole prompt),
  // host/disk homes B slots; both capped at prompt + gen and aligned.
  const int64_t full = w_.prompt_len + w_.gen_len;
  keep_ = full;
  cap_w_ = cap_h_ = full;
  if (w_.kv && w_.kv->kind != KvPolicyKind::kFull) {
    const KvBudget b = make_policy(*w_.kv)->budget(w_.prompt_len);
    if (!b.unbounded) {
      keep_ = std::min(full, std::max<int64_t>(b.total() - 1, 0));
      cap_w_ = std::min(full, std::max(w_.prompt_len, b.total()));
      cap_h_ = std::min(full, std::max<int64_t>(b.total(), 1));
    }
  }
  cap_w_ = align_capacity(m_.config, cap_w_);
  cap_h_ = align_capacity(m_.config, cap_h_);
}

int64_t CostModel::capacity() const { return cap_h_; }

std::array<uint64_t, 3> CostModel::memory(const Policy& p) const {
  // Same items as memory_need() (src/engine/offload_engine.cpp); the test checks equality.
  const ModelConfig& c = m_.config;
  const auto e = place_unit(m_.embed, p), l = place_unit(m_.layer, p), h = place_unit(m_.head, p);
  const uint64_t L = uint64_t(c.n_layers), K = uint64_t(p.num_gpu_batches);
  std::array<uint64_t, 3> w{};
  for (int t = 0; t < 3; ++t) w[size_t(t)] = e[size_t(t)] + L * l[size_t(t)] + h[size_t(t)];
  const uint64_t max_streamed = std::max({e[1] + e[2], l[1] + l[2], h[1] + h[2]});
  const uint64_t max_disk = std::max({e[2], l[2], h[2]});
  const KvSplit split = split_kv(p.gpu_batch_size, p);
  const uint64_t per_w = uint64_t(2 * c.n_kv_heads * cap_w_ * c.head_dim) * kF;  // device-side buffers
  const uint64_t per_seq = uint64_t(2 * c.n_kv_heads * cap_h_ * c.head_dim) * kF; // host/disk homes
  const uint64_t hidden = uint64_t(p.gpu_batch_size * w_.prompt_len * c.hidden) * kF;
  const bool act_host = p.act_cpu_percent == 100;
  const uint64_t off = uint64_t(split.n_host + split.n_disk), nd = uint64_t(split.n_disk);
  std::array<uint64_t, 3> m{};
  m[0] = w[0] + 2 * max_streamed + L * K * uint64_t(split.n_device) * per_w + 2 * off * per_w +
         (act_host ? 2 * hidden : K * hidden) +
         uint64_t(LayerCompute::scratch_bytes(c, p.gpu_batch_size * w_.prompt_len));
  m[1] = w[1] + 2 * max_disk + L * K * uint64_t(split.n_host) * per_seq + 4 * nd * per_seq + (act_host ? K * hidden : 0);
  m[2] = w[2] + L * K * nd * per_seq;
  return m;
}

std::string CostModel::memory_breakdown(const Policy& p) const {
  WeightPlacement wp;
  wp.units.resize(size_t(m_.config.n_layers + 2));
  auto fill = [&](UnitPlacement& u, const std::vector<size_t>& t) {
    u.bytes = place_unit(t, p);
    for (int i = 0; i < 3; ++i) wp.bytes[size_t(i)] += u.bytes[size_t(i)];
    wp.max_streamed = std::max(wp.max_streamed, size_t(u.streamed_bytes()));
    wp.max_disk = std::max(wp.max_disk, size_t(u.bytes[2]));
  };
  fill(wp.units.front(), m_.embed);
  for (size_t i = 1; i + 1 < wp.units.size(); ++i) fill(wp.units[i], m_.layer);
  fill(wp.units.back(), m_.head);
  return memory_need(m_.config, wp, p, w_.prompt_len, capacity()).breakdown;
}

// ---- bytes per link -----------------------------------------------------------------------

std::array<uint64_t, kNumLinks> CostModel::bytes(const Policy& p) const {
  // offload_actions.cpp: weights stream once per token step for every unit (disk-homed ones
  // via the host); hidden states on the host cross at every unit boundary; KV rows of host/disk
  // sequences are stored at prefill and loaded [0, len) + stored 1 row per decode step, or
  // with cpu_cache_compute only q,k,v go down and the attention output comes up.
  const ModelConfig& c = m_.config;
  std::array<uint64_t, kNumLinks> b{};
  auto add = [&](Link l, uint64_t n) { b[size_t(l)] += n; };
  const auto l = place_unit(m_.layer, p), h = place_unit(m_.head, p);
  const uint64_t L = uint64_t(c.n_layers), K = uint64_t(p.num_gpu_batches), B = uint64_t(p.block_size());
  const uint64_t steps = uint64_t(w_.gen_len), s = uint64_t(w_.prompt_len);
  add(Link::kDiskToHost, steps * (L * l[2] + h[2]));
  add(Link::kHostToDevice, steps * (L * (l[1] + l[2]) + h[1] + h[2]));
  for (uint64_t i = 0; i < steps; ++i) {  // the embedding unit moves the step's rows
    const auto em = embed_moved(m_, p, B * (i == 0 ? s : 1));
    add(Link::kDiskToHost, em[2]);
    add(Link::kHostToDevice, em[1] + em[2]);
  }
  const uint64_t hid = uint64_t(c.hidden) * kF;
  if (p.act_cpu_percent == 100) {
    const uint64_t rows = B * (s + steps - 1);  // prefill s rows, then 1 per decode step
    add(Link::kHostToDevice, (L + 1) * rows * hid);
    add(Link::kDeviceToHost, (L + 1) * rows * hid);
  }
  const KvSplit sp = split_kv(p.gpu_batch_size, p);
  const uint64_t off = uint64_t(sp.n_host + sp.n_disk), nd = uint64_t(sp.n_disk);
  const uint64_t row = uint64_t(2 * c.kv_dim()) * kF, LK = L * K;
  const uint64_t keep = uint64_t(keep_);
  const uint64_t prefill_rows = std::min(s, keep);
  add(Link::kDeviceToHost, LK * off * prefill_rows * row);
  add(Link::kHostToDisk, LK * nd * prefill_rows * row);
  for (uint64_t i = 1; i < steps; ++i) {
    const uint64_t before = std::min(s + i - 1, keep);
    add(Link::kDiskToHost, LK * nd * before * row);
    add(Link::kHostToDisk, LK * nd * row);
    if (p.cpu_cache_compute) {
      add(Link::kDeviceToHost, LK * off * uint64_t(c.q_dim() + 2 * c.kv_dim()) * kF);
      add(Link::kHostToDevice, LK * off * uint64_t(c.q_dim()) * kF);
    } else {
      add(Link::kHostToDevice, LK * off * before * row);
      add(Link::kDeviceToHost, LK * off * row);
    }
  }
  return b;
}

// ---- time: step durations and list scheduling ---------------------------------------------

const Schedule& CostModel::schedule(const ScheduleShape& s, uint64_t key) {
  auto it = schedules_.find(key);
  if (it == schedules_.end()) it = schedules_.emplace(key, build_schedule(s)).first;
  return it->second;
}

CostModel::Sim CostModel::simulate(const Policy& p, bool prefill, int64_t len_before, int layers) {
  const ModelConfig& c = m_.config;
  const auto pe = place_unit(m_.embed, p), pl = place_unit(m_.layer, p), ph = place_unit(m_.head, p);
  const KvSplit sp = split_kv(p.gpu_batch_size, p);
  const int K = int(p.num_gpu_batches);
  ScheduleShape sh;
  sh.units = layers + 2;
  sh.micro_batches = K;
  auto streams = [](const std::array<uint64_t, 3>& t) { return t[1] + t[2] > 0; };
  for (int u = 0; u < sh.units; ++u) {
    const auto& t = u == 0 ? pe : u == sh.units - 1 ? ph : pl;
    sh.unit_streams.push_back(streams(t));
    sh.unit_disk.push_back(t[2] > 0);
  }
  sh.prefill = prefill;
  sh.kv_host = sp.n_host > 0;
  sh.kv_disk = sp.n_disk > 0;
  sh.cpu_attention = p.cpu_cache_compute;
  sh.act_on_host = p.act_cpu_percent == 100;
  // The engine prefetches the next step's first layer at the end of each step (all but the
  // run's last), so decode steps start with it loaded.
  sh.first_layer_loaded = !prefill;
  sh.prefetch_next = true;
  const uint64_t key = uint64_t(layers) | uint64_t(K) << 8 | uint64_t(streams(pe)) << 40 |
                       uint64_t(streams(pl)) << 41 | uint64_t(streams(ph)) << 42 | uint64_t(pe[2] > 0) << 43 |
                       uint64_t(pl[2] > 0) << 44 | uint64_t(ph[2] > 0) << 45 | uint64_t(prefill) << 46 |
                       uint64_t(sh.kv_host) << 47 | uint64_t(sh.kv_disk) << 48 | uint64_t(sh.cpu_attention) << 49 |
                       uint64_t(sh.act_on_host) << 50;
  const Schedule& sched = schedule(sh, key);

  // Durations per (step kind, unit kind): 0 embed, 1 layer, 2 head.
  const double n = double(p.gpu_batch_size), T = prefill ? double(w_.prompt_len) : 1.0;
  const double row = double(2 * c.kv_dim()) * kF, hid = double(c.hidden) * kF;
  const double off = double(sp.n_host + sp.n_disk), nd = double(sp.n_disk);
  const double before = double(len_before), rows_new = prefill ? double(std::min(w_.prompt_len, keep_)) : 1.0;
  auto gemm = [&](double flops, double wbytes, bool large_m) {
    if (large_m) return flops / hw_.device_gemm_prefill;
    const double t = flops / hw_.device_gemm_decode;
    if (hw_.device_weight_read <= 0) return t;
    const double r = wbytes / hw_.device_weight_read;
    return hw_.gemm_time_sum ? t + r : std::max(t, r);
  };
  const double layer_w = double(std::accumulate(m_.layer.begin(), m_.layer.end(), size_t(0)));
  const double head_w = double(std::accumulate(m_.head.begin(), m_.head.end(), size_t(0)));
  const double ffn_mats = c.arch == Arch::kLlama ? 3 : 2;
  const double params = double(2 * c.hidden * c.q_dim() + 2 * c.hidden * c.kv_dim()) + ffn_mats * double(c.hidden * c.ffn_dim);
  double layer_c = gemm(2 * n * T * params, layer_w, prefill);
  if (prefill) {
    layer_c += 4 * n * double(c.q_dim()) * T * (T + 1) / 2 / hw_.device_attention_prefill;
  } else {
    const double ctx = before + 1;
    const double host_n = p.cpu_cache_compute ? off : 0, dev_n = n - host_n;
    layer_c += 4 * dev_n * double(c.q_dim()) * ctx / hw_.device_attention_decode;
    if (host_n > 0) {
      const double a = std::max(0.0, std::log2(64.0 / n)), b = std::max(0.0, std::log2(4096.0 / double(c.hidden)));
      const double eff = std::max(0.1, 1 + hw_.host_eff_c1 * a * b - hw_.host_eff_c2 * a - hw_.host_eff_c3 * b);
      layer_c += 4 * host_n * double(c.q_dim()) * ctx / (hw_.host_attention * eff);
      layer_c += host_n * double(c.q_dim() + 2 * c.kv_dim()) * kF / hw_.device_to_host +
                 host_n * double(c.q_dim()) * kF / hw_.host_to_device;
    }
  }
  double embed_c = hw_.device_weight_read > 0 ? n * T * hid / hw_.device_weight_read : 0;
  double head_c = gemm(2 * n * double(c.hidden * c.vocab_size), head_w, false);
  // Non-GEMM ops (norms, activation, residual adds, bias, rotary, KV writes) stream the
  // activation rows a few times; plus a fixed cost per compute step (kernel dispatch).
  if (hw_.device_elementwise > 0) {
    const double rows_bytes = n * T * hid;
    const double ffn_ratio = double(c.ffn_dim) / double(c.hidden);
    layer_c += rows_bytes * (kLayerPasses + 2 * ffn_ratio) / hw_.device_elementwise;
    embed_c += rows_bytes * 2 / hw_.device_elementwise;
    head_c += (n * hid * 2 + n * double(c.vocab_size) * kF) / hw_.device_elementwise;
  }
  layer_c += hw_.compute_step_overhead;
  embed_c += hw_.compute_step_overhead;
  head_c += hw_.compute_step_overhead;
  // The embedding unit moves only the block's rows of a streamed token table; from disk each
  // row is its own read request.
  const uint64_t em_rows = uint64_t(p.block_size()) * uint64_t(T);
  const auto em = embed_moved(m_, p, em_rows);
  const double em_disk_requests = em[2] < pe[2] ? double(em_rows) : 0.0;
  // KV disk requests: one per (sequence, KV head, K|V) with rows to move.
  const double disk_req = nd * double(c.n_kv_heads) * 2;

  std::vector<double> fin(sched.steps.size());
  std::array<double, kNumQueues> qfree{};
  Sim out;
  for (size_t i = 0; i < sched.steps.size(); ++i) {
    const Step& st = sched.steps[i];
    const int uk = st.u == 0 ? 0 : st.u == sh.units - 1 ? 2 : 1;
    const auto& pu = uk == 0 ? pe : uk == 2 ? ph : pl;
    double d = 0;
    switch (st.kind) {
      case StepKind::kLoadWeightDisk:
        d = double(uk == 0 ? em[2] : pu[2]) / hw_.disk_to_host + (uk == 0 ? em_disk_requests * hw_.disk_read_request : 0);
        break;
      case StepKind::kLoadWeight: d = double(uk == 0 ? em[1] + em[2] : pu[1] + pu[2]) / hw_.host_to_device; break;
      case StepKind::kLoadCacheDisk:
        d = nd * before * row / hw_.disk_to_host_cache + (before > 0 ? disk_req * hw_.disk_read_request : 0);
        break;
      case StepKind::kLoadCache: d = off * before * row / hw_.host_to_device; break;
      case StepKind::kLoadHidden: d = n * T * hid / hw_.host_to_device; break;
      case StepKind::kCompute: d = uk == 0 ? embed_c : uk == 2 ? head_c : layer_c; break;
      case StepKind::kStoreHidden: d = n * T * hid / hw_.device_to_host; break;
      case StepKind::kStoreCache: d = off * rows_new * row / hw_.device_to_host_cache; break;
      case StepKind::kStoreCacheDisk:
        d = nd * rows_new * row / hw_.host_to_disk_cache + (rows_new > 0 ? disk_req * hw_.disk_write_request : 0);
        break;
    }
    if (st.kind != StepKind::kCompute) d += hw_.schedule_step_overhead;
    const size_t q = size_t(st.queue);
    out.busy[q] += d;
    if (!p.overlap) {
      out.t += d;
      continue;
    }
    // One disk for reads and writes: the two disk queues take turns.
    const size_t r = !hw_.disk_duplex && st.queue == Queue::kDiskWrite ? size_t(Queue::kDiskRead) : q;
    double start = qfree[r];
    for (int dep : st.deps) start = std::max(start, fin[size_t(dep)]);
    fin[i] = start + d;
    qfree[r] = fin[i];
    out.t = std::max(out.t, fin[i]);
  }
  return out;
}

CostModel::Sim CostModel::token_step(const Policy& p, bool prefill, int64_t len_before) {
  // The schedule is periodic in the layers: simulate 4 and 3 layers and extrapolate linearly.
  const int L = int(m_.config.n_layers);
  if (L <= 4) return simulate(p, prefill, len_before, L);
  const Sim a = simulate(p, prefill, len_before, 4), b = simulate(p, prefill, len_before, 3);
  Sim s;
  s.t = a.t + (L - 4) * (a.t - b.t);
  for (int q = 0; q < kNumQueues; ++q) s.busy[size_t(q)] = a.busy[size_t(q)] + (L - 4) * (a.busy[size_t(q)] - b.busy[size_t(q)]);
  return s;
}

Estimate CostModel::finish(const Policy& p, double prefill, const std::array<double, kNumQueues>& busy, double decode,
                           double pl, double dl) {
  Estimate e;
  e.policy = p;
  e.block = p.block_size();
  e.prefill_s = prefill;
  e.decode_s = decode;
  e.prefill_layer_s = pl;
  e.decode_layer_s = dl;
  e.busy = busy;
  e.throughput = double(e.block * w_.gen_len) / std::max(prefill + decode, 1e-12);
  const int top = int(std::max_element(busy.begin(), busy.end()) - busy.begin());
  e.bottleneck = queue_name(Queue(top));
  e.memory = memory(p);
  e.kv_tokens = keep_;
  std::ostringstream os;
  for (int t = 0; t < 3; ++t) {
    if (double(e.memory[size_t(t)]) > hw_.usable(t)) {
      e.fits = false;
      os << (os.tellp() > 0 ? "; " : "") << tier_name(Tier(t)) << " needs " << double(e.memory[size_t(t)]) / 1e9
         << " GB, usable " << hw_.usable(t) / 1e9 << " GB";
    }
  }
  e.memory_note = os.str();
  return e;
}

Estimate CostModel::estimate(const Policy& p) {
  p.validate();
  const int64_t s = w_.prompt_len, n = w_.gen_len, L = m_.config.n_layers;
  Sim pre = token_step(p, true, 0);
  pre.t += hw_.token_step_overhead;
  std::array<double, kNumQueues> busy = pre.busy;
  double decode = 0;
  // Decode step i (1..n-1) sees len_before = s + i - 1 cached tokens (capped by the KV budget);
  // the step time is piecewise linear in it, so a few sample points integrate it closely.
  std::vector<std::pair<int64_t, double>> pts;  // (step, weight)
  if (n - 1 <= 5) {
    for (int64_t i = 1; i < n; ++i) pts.push_back({i, 1.0});
  } else {
    const double w = double(n - 1) / 4;  // trapezoid over two halves
    pts = {{1, w}, {1 + (n - 2) / 2, 2 * w}, {n - 1, w}};
  }
  for (auto [i, w] : pts) {
    const Sim d = token_step(p, false, std::min(s + i - 1, keep_));
    decode += w * (d.t + hw_.token_step_overhead);
    for (int q = 0; q < kNumQueues; ++q) busy[size_t(q)] += w * d.busy[size_t(q)];
  }
  double dl = 0;
  if (n > 1) {
    const Sim mid = token_step(p, false, std::min(s + (n - 1) / 2, keep_));
    const Sim one = L > 4 ? simulate(p, false, std::min(s + (n - 1) / 2, keep_), 4) : mid;
    const Sim two = L > 4 ? simulate(p, false, std::min(s + (n - 1) / 2, keep_), 3) : mid;
    dl = L > 4 ? one.t - two.t : mid.t / double(L);
  }
  const double pl = L > 4 ? simulate(p, true, 0, 4).t - simulate(p, true, 0, 3).t : pre.t / double(L);
  Estimate e = finish(p, pre.t, busy, decode, pl, dl);
  e.bytes = bytes(p);
  return e;
}

Estimate CostModel::quick(const Policy& p) {
  const int64_t s = w_.prompt_len, n = w_.gen_len;
  Sim pre = token_step(p, true, 0);
  pre.t += hw_.token_step_overhead;
  std::array<double, kNumQueues> busy = pre.busy;
  double decode = 0;
  if (n > 1) {
    const Sim d = token_step(p, false, std::min(s + (n - 1) / 2, keep_));
    decode = double(n - 1) * (d.t + hw_.token_step_overhead);
    for (int q = 0; q < kNumQueues; ++q) busy[size_t(q)] += double(n - 1) * d.busy[size_t(q)];
  }
  return finish(p, pre.t, busy, decode, 0, 0);
}

}  // namespace flexh2o
