// GpuModel: fit check, host-side dtype conversion into double-buffered pinned chunks, and
// asynchronous copies into one device arena; then the device view of every weight.
#include "gpu/gpu_model.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "core/error.h"
#include "gpu/device_info.h"
#include "gpu/memory_plan.h"
#include "kernels/cuda/cuda_check.h"

namespace flexh2o::gpu {
namespace {

constexpr size_t kChunkBytes = size_t(32) << 20;  // per half of the pinned staging buffer

}  // namespace

DeviceInfo current_device_info() {
  DeviceInfo d;
  FH_CUDA_CHECK(cudaGetDevice(&d.index));
  cudaDeviceProp prop{};
  FH_CUDA_CHECK(cudaGetDeviceProperties(&prop, d.index));
  d.name = prop.name;
  FH_CUDA_CHECK(cudaMemGetInfo(&d.free_bytes, &d.total_bytes));
  return d;
}

GpuModel::GpuModel(const Model& m, size_t max_bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  const DType dt = gpu_compute_dtype(m);
  w_.dtype = dt;
  const size_t need = gpu_weight_bytes(m, dt);
  const DeviceInfo dev = current_device_info();
  const size_t avail = max_bytes ? std::min(dev.free_bytes, max_bytes) : dev.free_bytes;
  const std::string what = "the weights of " + m.config().name + " (" + std::string(dtype_name(dt)) + ")";
  const std::string hint = "use --device cpu (offloading on the CUDA device is not wired yet)";
  std::string err = fit_error(what, need, avail, dev.total_bytes, dev.name, hint);
  if (!err.empty()) FH_FAIL(err);
  if (!DeviceArena::create(std::max<size_t>(need, 1), &arena_).ok()) {  // free memory shrank meanwhile
    const DeviceInfo now = current_device_info();
    FH_FAIL(fit_error(what, need, std::min(now.free_bytes, need - 1), now.total_bytes, now.name, hint));
  }

  Stream stream;
  PinnedBuffer pin;
  PinnedBuffer::create(2 * kChunkBytes, &pin).throw_if_error();
  Event done[2] = {Event(false), Event(false)};
  bool in_flight[2] = {false, false};
  int half = 0;
  const int64_t per_chunk = int64_t(kChunkBytes / dtype_size(dt));
  std::unordered_map<const void*, const void*> device_of;
  for (const BoundTensor& t : m.tensors()) {
    const int64_t n = t.view.numel();
    uint16_t* d = nullptr;
    arena_.allocate_n(size_t(std::max<int64_t>(n, 1)), &d, kTensorAlign).throw_if_error();
    device_of[t.view.data] = d;
    for (int64_t off = 0; off < n; off += per_chunk) {
      const int64_t cnt = std::min(per_chunk, n - off);
      if (in_flight[half]) done[half].synchronize();  // the copy out of this half has finished
      uint16_t* host = static_cast<uint16_t*>(pin.data()) + size_t(half) * size_t(per_chunk);
      convert_weights(t.view, off, cnt, dt, host);
      FH_CUDA_CHECK(cudaMemcpyAsync(d + off, host, size_t(cnt) * sizeof(uint16_t), cudaMemcpyHostToDevice,
                                    stream.get()));
      done[half].record(stream.get());
      in_flight[half] = true;
      half ^= 1;
    }
  }
  stream.synchronize();

  auto dev_ptr = [&](const TensorView& v) -> const void* {
    if (v.empty()) return nullptr;
    auto it = device_of.find(v.data);
    FH_CHECK(it != device_of.end(), "GPU upload: a bound weight is not among the model's tensors");
    return it->second;
  };
  const ModelWeights& hw = m.weights();
  w_.embed = dev_ptr(hw.embed);
  w_.pos_embed = dev_ptr(hw.pos_embed);
  w_.final_norm_w = dev_ptr(hw.final_norm_w);
  w_.final_norm_b = dev_ptr(hw.final_norm_b);
  w_.lm_head = dev_ptr(hw.lm_head);
  for (const LayerWeights& L : hw.layers) {
    GpuLayerWeights g;
    g.ln1_w = dev_ptr(L.ln1_w), g.ln1_b = dev_ptr(L.ln1_b);
    g.q_w = dev_ptr(L.q_w), g.q_b = dev_ptr(L.q_b), g.k_w = dev_ptr(L.k_w), g.k_b = dev_ptr(L.k_b);
    g.v_w = dev_ptr(L.v_w), g.v_b = dev_ptr(L.v_b), g.o_w = dev_ptr(L.o_w), g.o_b = dev_ptr(L.o_b);
    g.ln2_w = dev_ptr(L.ln2_w), g.ln2_b = dev_ptr(L.ln2_b);
    g.fc1_w = dev_ptr(L.fc1_w), g.fc1_b = dev_ptr(L.fc1_b), g.fc2_w = dev_ptr(L.fc2_w), g.fc2_b = dev_ptr(L.fc2_b);
    g.gate_w = dev_ptr(L.gate_w), g.gate_b = dev_ptr(L.gate_b), g.up_w = dev_ptr(L.up_w), g.up_b = dev_ptr(L.up_b);
    g.down_w = dev_ptr(L.down_w), g.down_b = dev_ptr(L.down_b);
    w_.layers.push_back(g);
  }
  upload_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace flexh2o::gpu
