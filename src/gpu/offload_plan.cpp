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
  FH_CHECK(p.cache_gpu_percent == 100 && p.act_gpu_percent == 100 && !p.cpu_cache_compute,
           "KV/activation offloading and the disk tier on CUDA are not wired yet (policy ", p.str(),
           "); use --percent w_g w_c 100 0 100 0 with w_g + w_c = 100, or --device cpu");
  FH_CHECK(p.w_disk_percent() < 1e-9, "the disk tier on CUDA is not wired yet (policy ", p.str(),
           " homes weights on disk); use w_g + w_c = 100, or --device cpu");
  FH_CHECK(!kv_policy, "KV policies on the CUDA offloading runner are not wired yet; use --kv-policy full, "
                       "everything on the GPU (--percent 100 0 100 0 100 0), or --device cpu");
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

size_t BatchBuffers::kv() const { return size_t(2 * layers) * align_up(kv_layer); }
size_t BatchBuffers::total() const {
  return align_up(hidden) + align_up(inputs) + align_up(logits) + kv() + scratch;
}

BatchBuffers batch_buffers(const ModelConfig& c, DType dt, int64_t batch, int64_t gpu_batch_size, int64_t rows_per_seq,
                           int64_t capacity) {
  BatchBuffers b;
  const int64_t M = batch * rows_per_seq, mb = std::min(batch, gpu_batch_size);
  b.hidden = size_t(M * c.hidden) * dtype_size(dt);
  b.inputs = size_t(3 * M + batch) * sizeof(int32_t);
  b.logits = size_t(batch * c.vocab_size) * sizeof(float);
  b.kv_layer = size_t(batch * c.n_kv_heads * capacity * c.head_dim) * dtype_size(dt);
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
                                int64_t rows_per_seq, int64_t capacity) {
  GpuOffloadNeed n;
  n.items.push_back({"weights homed on the GPU", l.home_bytes});
  n.items.push_back({"weight double buffer (2 x " + format_bytes(l.slot_bytes) + ")", 2 * l.slot_bytes});
  n.items.push_back({"cuBLAS workspace", kCublasWorkspaceBytes});
  if (batch <= 0) return n;
  const BatchBuffers b = batch_buffers(c, l.dtype, batch, gpu_batch_size, rows_per_seq, capacity);
  n.items.push_back({"KV cache (" + std::to_string(batch) + " x " + std::to_string(capacity) + " tokens)", b.kv()});
  n.items.push_back({"hidden states, inputs and logits", align_up(b.hidden) + align_up(b.inputs) + align_up(b.logits)});
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
