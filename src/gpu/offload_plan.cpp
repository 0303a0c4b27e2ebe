// The CUDA offloading runner's host-side plan: schedule steps -> streams and event waits,
// the weights' device layout at the compute dtype, and the device bytes of a run.
#include "gpu/offload_plan.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/error.h"
#include "gpu/memory_plan.h"

namespace flexh2o::gpu {
namespace {

size_t align_up(size_t n) { return (n + kTensorAlign - 1) / kTensorAlign * kTensorAlign; }

int stream_of(Queue q) {
  switch (q) {
    case Queue::kCompute: return 0;
    case Queue::kHostToDevice: return 1;
    case Queue::kDeviceToHost: return 2;
    default: break;
  }
  FH_FAIL("the CUDA offloading runner has no ", queue_name(q), " queue (the disk tier is not wired on CUDA yet)");
}

}  // namespace

void check_gpu_offload_policy(const Policy& p, bool kv_policy) {
  p.validate();
  FH_CHECK(p.w_disk_percent() < 1e-9, "the disk tier on CUDA is not wired yet (policy ", p.str(),
           " homes weights on disk); use w_g + w_c = 100, or --device cpu");
  const bool kv_gpu = p.cache_gpu_percent == 100, kv_host = p.cache_cpu_percent == 100;
  FH_CHECK(kv_gpu || kv_host,
           "the CUDA offloading runner homes the KV cache wholly on the GPU (cache 100 0) or wholly on the host "
           "(cache 0 100 with --cpu-cache-compute); a split cache or KV on disk is not wired yet (policy ",
           p.str(), "); use --device cpu");
  FH_CHECK(!kv_host || p.cpu_cache_compute, "with the KV cache on the host the CUDA offloading runner runs the "
                                            "decode attention there: add --cpu-cache-compute (policy ",
           p.str(), ")");
  FH_CHECK(p.act_gpu_percent == 100 || p.act_cpu_percent == 100,
           "the CUDA offloading runner keeps the hidden states wholly on the GPU (act 100 0) or wholly on the host "
           "(act 0 100); a split or disk is not wired yet (policy ",
           p.str(), "); use --device cpu");
  FH_CHECK(!kv_policy || kv_host, "KV policies on the CUDA offloading runner need the cache on the host with "
                                  "--cpu-cache-compute (--percent w_g w_c 0 100 a_g a_c); or run everything on the "
                                  "GPU (--percent 100 0 100 0 100 0), or --device cpu");
}

OffloadModes offload_modes(const Policy& p, bool policy_needs_scores) {
  OffloadModes m;
  m.kv_host = p.cache_cpu_percent == 100;
  m.act_host = p.act_cpu_percent == 100;
  m.scores = m.kv_host && policy_needs_scores;
  return m;
}

StreamPlan plan_streams(const Schedule& s, bool overlap) {
  StreamPlan p;
  const size_t n = s.steps.size();
  p.stream.resize(n);
  p.waits.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Step& st = s.steps[i];
    const int mine = stream_of(st.queue);  // checked even without overlap
    p.stream[i] = overlap ? mine : 0;
    if (!overlap) continue;
    int latest[kNumStreams] = {-1, -1, -1};
    for (int d : st.deps) {
      FH_CHECK(d >= 0 && size_t(d) < i, "schedule step ", s.label(int(i)), " depends on a later step ", d);
      const int ds = stream_of(s.steps[size_t(d)].queue);
      if (ds != mine) latest[ds] = std::max(latest[ds], d);
    }
    for (int q = 0; q < kNumStreams; ++q)
      if (latest[q] >= 0) p.waits[i].push_back(latest[q]);
    std::sort(p.waits[i].begin(), p.waits[i].end());
  }
  return p;
}

DeviceLayout device_layout(const WeightPlacement& wp, DType dtype) {
  DeviceLayout l;
  l.dtype = dtype;
  const size_t es = dtype_size(dtype);
  std::map<const void*, size_t> home_of;  // source -> device home offset (a tied lm_head shares)
  l.offset.resize(wp.units.size());
  l.streamed.resize(wp.units.size());
  l.unit_streamed.assign(wp.units.size(), 0);
  for (size_t u = 0; u < wp.units.size(); ++u) {
    size_t slot = 0;
    for (const PlacedTensor& t : wp.units[u].tensors) {
      const size_t bytes = align_up(size_t(t.source.numel()) * es);
      FH_CHECK(t.tier != Tier::kDisk, "weight ", t.name,
               " is homed on disk: the disk tier on CUDA is not wired yet (give w_gpu + w_cpu = 100, or use --device "
               "cpu)");
      if (t.tier == Tier::kDevice) {
        auto [it, fresh] = home_of.try_emplace(t.source.data, l.home_bytes);
        if (fresh) l.home_bytes += bytes;
        l.offset[u].push_back(it->second);
        l.streamed[u].push_back(false);
      } else {
        l.offset[u].push_back(slot);
        l.streamed[u].push_back(true);
        slot += bytes;
        l.host_bytes += bytes;  // a tied lm_head streamed in two units is kept twice (simple)
      }
    }
    l.unit_streamed[u] = slot;
    l.slot_bytes = std::max(l.slot_bytes, slot);
  }
  return l;
}

size_t BatchBuffers::hidden_total() const { return (modes.act_host ? 2 : 1) * align_up(hidden); }
size_t BatchBuffers::kv() const {
  if (modes.kv_host) return 4 * align_up(kv_stage) + (modes.scores ? 2 * align_up(scores_stage) : 0);
  return size_t(2 * layers) * align_up(kv_layer);
}
size_t BatchBuffers::total() const {
  return hidden_total() + align_up(inputs) + align_up(logits) + kv() + scratch;
}

BatchBuffers batch_buffers(const ModelConfig& c, DType dt, int64_t batch, int64_t gpu_batch_size, int64_t rows_per_seq,
                           int64_t capacity, const OffloadModes& modes) {
  BatchBuffers b;
  const int64_t M = batch * rows_per_seq, mb = std::min(batch, gpu_batch_size);
  b.modes = modes;
  b.hidden = size_t((modes.act_host ? mb * rows_per_seq : M) * c.hidden) * dtype_size(dt);
  b.inputs = size_t(3 * M + batch) * sizeof(int32_t);
  b.logits = size_t(batch * c.vocab_size) * sizeof(float);
  if (modes.kv_host) {
    b.kv_stage = size_t(mb * c.n_kv_heads * rows_per_seq * c.head_dim) * dtype_size(dt);
    if (modes.scores) b.scores_stage = size_t(mb * c.n_heads * rows_per_seq) * sizeof(float);
  } else {
    b.kv_layer = size_t(batch * c.n_kv_heads * capacity * c.head_dim) * dtype_size(dt);
  }
  b.layers = c.n_layers;
  b.scratch = gpu_scratch_bytes(c, dt, mb * rows_per_seq, mb);
  return b;
}

size_t GpuOffloadNeed::total() const {
  size_t n = 0;
  for (const Item& i : items) n += i.bytes;
  return n;
}

std::string GpuOffloadNeed::str() const {
  std::ostringstream os;
  for (const Item& i : items) os << i.what << " " << format_bytes(i.bytes) << ", ";
  os << "total " << format_bytes(total());
  return os.str();
}

GpuOffloadNeed gpu_offload_need(const ModelConfig& c, const DeviceLayout& l, int64_t batch, int64_t gpu_batch_size,
                                int64_t rows_per_seq, int64_t capacity, const OffloadModes& modes) {
  GpuOffloadNeed n;
  n.items.push_back({"weights homed on the GPU", l.home_bytes});
  n.items.push_back({"weight double buffer (2 x " + format_bytes(l.slot_bytes) + ")", 2 * l.slot_bytes});
  n.items.push_back({"cuBLAS workspace", kCublasWorkspaceBytes});
  if (batch <= 0) return n;
  const BatchBuffers b = batch_buffers(c, l.dtype, batch, gpu_batch_size, rows_per_seq, capacity, modes);
  if (modes.kv_host)
    n.items.push_back({"prefill KV staging (2 x " + std::to_string(std::min(batch, gpu_batch_size)) + " x " +
                           std::to_string(rows_per_seq) + " tokens; the cache is on the host)",
                       b.kv()});
  else
    n.items.push_back({"KV cache (" + std::to_string(batch) + " x " + std::to_string(capacity) + " tokens)", b.kv()});
  n.items.push_back({"hidden states, inputs and logits", b.hidden_total() + align_up(b.inputs) + align_up(b.logits)});
  n.items.push_back({"compute scratch", b.scratch});
  return n;
}

std::string budget_error(const GpuOffloadNeed& need, size_t budget, const std::string& what) {
  if (need.total() <= budget) return "";
  return what + " needs " + format_bytes(need.total()) + " on the GPU (" + need.str() + ") but the budget is " +
         format_bytes(budget) + " (" + std::to_string(budget) + " bytes); raise --gpu-mem, lower the batch, or " +
         "move weights to the host (lower w_gpu)";
}

}  // namespace flexh2o::gpu
