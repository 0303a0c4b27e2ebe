// plan_memory(): every buffer of an offloaded run, per tier, from the policy and the batch.
#include "engine/memory_plan.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "engine/kv_evict.h"
#include "offload/aligned_buffer.h"

namespace flexh2o {

WeightBytes WeightBytes::of(const WeightPlacement& wp) {
  WeightBytes w;
  w.homed = {wp.bytes[0], wp.bytes[1], wp.bytes[2]};
  w.max_streamed = wp.max_streamed;
  w.max_disk = wp.max_disk;
  return w;
}

uint64_t kv_disk_stage_bytes(int64_t n, uint64_t seq_bytes) {
  return align_up(uint64_t(std::max<int64_t>(n, 0)) * seq_bytes);  // whole O_DIRECT pages
}

int64_t head_rows_per_call(int64_t vocab, int64_t n, int64_t logit_rows, uint64_t slot_bytes) {
  const uint64_t per_row = uint64_t(std::max<int64_t>(n, 1)) * uint64_t(std::max<int64_t>(vocab, 1)) * 4;
  return std::clamp<int64_t>(int64_t(slot_bytes / per_row), 1, std::max<int64_t>(logit_rows, 1));
}

std::string human_bytes(uint64_t b) {
  std::ostringstream os;
  auto put = [&](double v, const char* unit) {  // 3 significant digits, never 1.01e+03
    if (v >= 1000) os << std::fixed << std::setprecision(0);
    else os << std::setprecision(3);
    os << v << unit;
  };
  if (b >= (1ull << 30)) put(double(b) / double(1ull << 30), " GiB");
  else if (b >= (1ull << 20)) put(double(b) / double(1ull << 20), " MiB");
  else if (b >= (1ull << 10)) put(double(b) / double(1ull << 10), " KiB");
  else os << b << " B";
  return os.str();
}

std::string human_bytes_beside(uint64_t b, uint64_t other) {
  const std::string h = human_bytes(b);
  return b != other && h == human_bytes(other) ? h + " (" + std::to_string(b) + " bytes)" : h;
}

std::string MemoryPlan::breakdown() const {
  std::ostringstream os;
  for (const MemoryItem& it : items)
    if (it.bytes) os << "  " << tier_name(it.tier) << ": " << it.what << " " << human_bytes(it.bytes) << "\n";
  return os.str();
}

MemoryPlan plan_memory(const ModelConfig& c, const WeightBytes& w, const Policy& p, const BatchDims& d,
                       const PlanDtypes& t) {
  MemoryPlan m;
  const bool bounded = d.budget_max > 0;
  const uint64_t slot_kv = uint64_t(c.kv_layer_bytes_per_token(t.kv));  // one slot of K and V, all heads
  auto slots = [&](int64_t budget) {
    KvSlots s;
    s.cap_w = std::max<int64_t>(1, budget > 0 ? std::min(d.capacity, std::max(d.rows, budget)) : d.capacity);
    s.cap_h = std::max<int64_t>(1, budget > 0 ? std::min(d.capacity, budget) : d.capacity);
    s.device_seq = slot_kv * uint64_t(s.cap_w);
    s.home_seq = slot_kv * uint64_t(s.cap_h);
    return s;
  };
  const uint64_t L = uint64_t(c.n_layers);
  const uint64_t LW = d.window > 0 ? uint64_t(std::clamp<int64_t>(d.window_layers, 0, c.n_layers)) : 0, LF = L - LW;
  // With every layer capped, the other class has no layer: it takes the window's slots, so the
  // widest class (what the shared slots are sized by) is always the first.
  const KvSlots full = slots(bounded ? d.budget_max : 0);
  m.window = LW ? slots(d.window) : full;
  const KvSlots& first = LF ? full : m.window;
  m.cap_w = first.cap_w, m.cap_h = first.cap_h;
  m.kv_device_seq = first.device_seq, m.kv_home_seq = first.home_seq;
  m.split = split_kv(p.gpu_batch_size, p);
  const uint64_t es_a = dtype_size(t.act);
  const uint64_t n = uint64_t(p.gpu_batch_size);
  const uint64_t B = d.batch > 0 ? std::min(uint64_t(d.batch), n * uint64_t(p.num_gpu_batches))
                                 : n * uint64_t(p.num_gpu_batches);
  const uint64_t rows = uint64_t(d.rows);
  const uint64_t nh = uint64_t(m.split.n_host), nk = uint64_t(m.split.n_disk);
  const uint64_t off = nh + nk;
  // What each micro-batch holds adds up over the K = B / n whole ones and a partial last one of
  // r sequences (split by the same percentages); staging and step buffers are one micro-batch's.
  const uint64_t K = B / n, r = B % n;
  const KvSplit last = split_kv(int64_t(r), p);
  auto per_mb = [&](auto&& bytes) { return K * bytes(n, m.split) + (r ? bytes(r, last) : 0); };
  m.hidden = n * rows * uint64_t(c.hidden) * es_a;
  m.qkv_rows = uint64_t(c.q_dim() + 2 * c.kv_dim()) * es_a;
  m.attn_rows = uint64_t(c.q_dim()) * es_a;
  const bool act_host = p.act_cpu_percent == 100;
  const bool host_attention = p.cpu_cache_compute && off > 0;
  // Scores leave the device for every sequence whose attention runs there (all at prefill).
  m.scores = d.kv_policy && d.scores ? n * uint64_t(c.n_heads * m.cap_w) * 4 : 0;
  // Keep lists of the device-homed sequences, and at a prefill of the offloaded ones too.
  m.keep = d.kv_policy ? n * uint64_t(c.n_kv_heads * (m.cap_w + 1)) * 4 : 0;
  m.inputs = (4 * B * rows + B * (LW && LF ? 2 : 1)) * 4;  // one seq_keys row per class of layers
  // A row a sequence (generation); a scoring step's head rows of a micro-batch if more.
  const uint64_t V = uint64_t(c.vocab_size), slot = B * V * 4, nb = std::min(n, B);
  m.head_rows = head_rows_per_call(c.vocab_size, int64_t(nb), d.logit_rows, std::max(slot, d.head_logits_bytes));
  m.logits = d.hidden_out ? 0 : std::max(slot, uint64_t(m.head_rows) * nb * V * 4);
  m.logits_host = d.hidden_out ? 0 : slot * uint64_t(std::max<int64_t>(d.logit_rows, 1));
  m.hidden_in = d.hidden_in ? B * rows * uint64_t(c.hidden) * es_a : 0;
  m.hidden_out = d.hidden_out ? B * rows * uint64_t(c.hidden) * es_a : 0;
  auto add = [&](Tier tier, std::string what, uint64_t bytes) {
    if (!bytes) return;
    m.items.push_back({tier, std::move(what), bytes});
    m.bytes[size_t(tier)] += bytes;
  };
  // Device
  add(Tier::kDevice, "weights homed", w.homed[0]);
  add(Tier::kDevice, "weight double buffer", 2 * w.max_streamed);
  add(Tier::kDevice, "KV homed", per_mb([&](uint64_t, const KvSplit& s) {
        return uint64_t(s.n_device) * (LF * m.kv_device_seq + LW * m.window.device_seq);
      }));
  add(Tier::kDevice, "KV staging", off ? 2 * off * m.kv_device_seq : 0);
  const uint64_t hidden_all = per_mb([&](uint64_t k, const KvSplit&) { return k * m.hidden / n; });
  add(Tier::kDevice, "hidden states", act_host ? 2 * m.hidden : hidden_all);
  // One q/k/v + attention slot for a whole step; two more for the host-attention pipeline (one
  // micro-batch's rows go to the host while the other's come back), a row a sequence: decode's.
  add(Tier::kDevice, "q/k/v and attention rows",
      n * rows * (m.qkv_rows + m.attn_rows) + (host_attention ? 2 * n * (m.qkv_rows + m.attn_rows) : 0));
  add(Tier::kDevice, "attention scores", 2 * m.scores);
  add(Tier::kDevice, "keep lists", 2 * m.keep);
  add(Tier::kDevice, "step inputs and logits", m.inputs + m.logits);
  add(Tier::kDevice, "stage hidden rows in and out", m.hidden_in + m.hidden_out);
  add(Tier::kDevice, "compute scratch", device_scratch_bytes(t.device, c, t.act, int64_t(n * rows)));
  // Host
  add(Tier::kHost, "weights homed", w.homed[1]);
  add(Tier::kHost, "weight disk staging", w.max_disk ? 2 * w.max_disk : 0);
  add(Tier::kHost, "KV homed", per_mb([&](uint64_t, const KvSplit& s) {
        return uint64_t(s.n_host) * (LF * m.kv_home_seq + LW * m.window.home_seq);
      }));
  // The staging holds the micro-batch with the most sequences on disk: the percentages' floors
  // can give a partial one more (split_kv(3) of 25/25/50 puts 3 on disk, split_kv(4) 2).
  const uint64_t nk_max = std::max<uint64_t>(nk, r ? uint64_t(last.n_disk) : 0);
  add(Tier::kHost, "KV disk staging", 2 * kv_disk_stage_bytes(int64_t(nk_max), m.kv_home_seq));
  add(Tier::kHost, "hidden states", act_host ? hidden_all : 0);
  add(Tier::kHost, "host attention rows", host_attention ? 2 * off * (m.qkv_rows + m.attn_rows) : 0);
  add(Tier::kHost, "attention scores", 2 * m.scores);
  // A policy's scores and positions per slot, in the layers that evict (all of them, or under a
  // window cap the sliding ones: the others never evict): what each keeps between steps, and one
  // micro-batch's rows over the whole prompt for the prefill's decisions.
  if (d.kv_policy) {
    const KvSlots& ev = LW ? m.window : full;
    add(Tier::kHost, "KV policy state",
        per_mb([&](uint64_t k, const KvSplit&) {
          return (LW ? LW : L) * KvPolicyState::bytes_for(int64_t(k), c.n_kv_heads, ev.cap_h);
        }) + KvPolicyState::bytes_for(int64_t(n), c.n_kv_heads, ev.cap_w));
  }
  add(Tier::kHost, "keep lists", 2 * m.keep);
  add(Tier::kHost, "step inputs and logits", m.inputs + m.logits_host);
  add(Tier::kHost, "stage hidden rows in and out", m.hidden_in + m.hidden_out);
  // Disk
  add(Tier::kDisk, "weights homed", w.homed[2]);
  add(Tier::kDisk, "KV homed", per_mb([&](uint64_t, const KvSplit& s) {
        return uint64_t(s.n_disk) * (LF * m.kv_home_seq + LW * m.window.home_seq);
      }));
  return m;
}

}  // namespace flexh2o
